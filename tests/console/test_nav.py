"""The console's navigation links the admin-only pages for admins and no one else."""

from __future__ import annotations

import pytest

from gateway.models import Principal

pytestmark = pytest.mark.django_db

MCP_CLIENTS_LINK = 'href="/mcp-clients"'


def test_an_admin_sees_the_mcp_clients_link_and_it_marks_the_page(root):
    assert MCP_CLIENTS_LINK in root.client.get("/approvals").content.decode()
    page = root.client.get("/mcp-clients")
    assert page.status_code == 200
    assert f'{MCP_CLIENTS_LINK} aria-current="page">MCP clients' in page.content.decode()


@pytest.mark.parametrize("who", ["oscar", "alice"])
def test_an_operator_or_approver_has_no_mcp_clients_link(request, who):
    person = request.getfixturevalue(who)
    assert MCP_CLIENTS_LINK not in person.client.get("/approvals").content.decode()
    assert person.client.get("/mcp-clients").status_code == 403


def test_a_frozen_admin_has_no_mcp_clients_link(root):
    Principal.objects.filter(pk=root.principal.pk).update(frozen=True)
    assert MCP_CLIENTS_LINK not in root.client.get("/approvals").content.decode()
