"""The API's list reads one page at any depth of the history: a page half-way down a
ledger of thousands reads tens of rows, not the thousands above it (tests/support/ledger.py
says how that is counted; tests/benchmarks/ledger_scale.py times it at 1 M and 5 M)."""

from __future__ import annotations

import base64

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from gateway.models import Principal
from tests.support.ledger import load_history, most_read

pytestmark = pytest.mark.django_db

HISTORY = 3000


def test_a_deep_page_of_the_list_reads_that_page(agent):
    """Joined with the commands, the page was merged with the command table walked from its
    newest row: at depth d it read d commands."""
    # Another agent's history: this one sees it redacted (the loader seals no payload).
    other = Principal.objects.create(tenant=agent.principal.tenant, name="old-bot", role="agent")
    load_history(tenant_id=other.tenant_id, principal_id=other.pk, effects=HISTORY)
    middle = "eff_" + f"{HISTORY // 2}".rjust(26, "0")
    cursor = base64.b64encode(f"p={middle}".encode()).decode()
    with CaptureQueriesContext(connection) as queries:
        response = agent.client.get("/api/v1/effects", {"cursor": cursor, "limit": 20})
    assert response.status_code == 200
    listed = [effect["effect_id"] for effect in response.json()["results"]]
    assert listed[0] == "eff_" + f"{HISTORY // 2 - 1}".rjust(26, "0") and len(listed) == 20
    rows, statement = most_read(queries)
    assert rows <= 100, statement
