"""What a reader is shown of a payload comes from the sealed payload, checked against the
command's digest: a database writer who edits the displayed copy shows an approver nothing
false, and a row that fails verification is shown as failed, never as a 500."""

from __future__ import annotations

import json

import pytest
from django.db import connection

from gateway.models import Command
from tests.console.conftest import person

pytestmark = pytest.mark.django_db

REFUND = {
    "type": "billing.refund.create",
    "resource": {"type": "order", "id": "ord_7", "version": 1},
    "payload": {"amount": 50_000, "currency": "EUR", "reason": "duplicate charge"},
}


@pytest.fixture
def waiting(agent) -> str:
    """A refund of 50,000 waiting for its approver."""
    response = agent.submit(REFUND, "refund-50000")
    assert response.status_code == 201, response.content
    assert response.json()["status"] == "AWAITING_APPROVAL"
    return response.json()["effect_id"]


def as_table_owner(sql: str, *params) -> None:
    """A write the application's own database role can make: it owns the table, so it can
    set the append-only trigger aside (the test's transaction restores it)."""
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # fire what is pending first
        cursor.execute("ALTER TABLE gateway_command DISABLE TRIGGER USER")
        cursor.execute(sql, params)
        cursor.execute("ALTER TABLE gateway_command ENABLE TRIGGER USER")


def test_an_edited_display_copy_shows_the_approver_the_sealed_amount_or_nothing(waiting, approver):
    command = Command.objects.get(pk=waiting)
    edited = {**command.payload_redacted, "amount": 100}
    as_table_owner(
        "UPDATE gateway_command SET payload_redacted = %s WHERE effect_id = %s",
        json.dumps(edited),
        waiting,
    )
    read = approver.client.get(f"/api/v1/effects/{waiting}").json()
    assert read["payload_verified"] is False
    assert read["payload"] is None  # never the edited 100

    desk = person("acme", "desk-approver", "approver")
    page = desk.client.get(f"/effects/{waiting}").content.decode()
    assert "This record failed verification" in page
    assert 'name="payload_digest"' not in page  # no approve form
    inbox = desk.client.get("/approvals").content.decode()
    assert "This record failed verification" in inbox
    assert "100.00 EUR" not in inbox and f"/effects/{waiting}/approve" not in inbox


def test_an_untouched_payload_reads_as_verified_for_every_role(waiting, agent, approver, operator):
    for reader, clear in ((agent, True), (operator, True), (approver, False)):
        read = reader.client.get(f"/api/v1/effects/{waiting}").json()
        assert read["payload_verified"] is True
        assert read["payload"]["amount"] == 50_000
        assert read["payload_redacted"] is (not clear)


def test_a_tampered_seal_is_a_failed_record_in_reads_and_lists_not_a_500(
    waiting, agent, approver, operator, admin, ticket_body
):
    other = agent.submit(ticket_body, "ticket-ok").json()["effect_id"]
    sealed = Command.objects.get(pk=waiting).payload_sealed
    Command.objects.filter(pk=waiting).update(payload_sealed=sealed[:-8] + "AAAAAAAA")
    for reader in (agent, approver, operator, admin):
        one = reader.client.get(f"/api/v1/effects/{waiting}")
        assert one.status_code == 200, (reader.principal.role, one.content)
        assert one.json()["payload_verified"] is False and one.json()["payload"] is None
        listed = reader.client.get("/api/v1/effects")
        assert listed.status_code == 200, (reader.principal.role, listed.content)
        rows = {row["effect_id"]: row for row in listed.json()["results"]}
        assert rows[waiting]["payload_verified"] is False
        assert rows[other]["payload_verified"] is True

    desk = person("acme", "desk-operator", "operator")
    for path in (f"/effects/{waiting}", "/", "/approvals", "/search?q=refund"):
        response = desk.client.get(path)
        assert response.status_code == 200, path
