"""Failure triggers that never reach the provider: a step refused by the gateway (the agent's
grant does not cover it) and a step whose saga precondition does not hold."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from sagas.definitions import DEFINITIONS, SagaDefinition, Step, receipt_has
from sagas.models import SagaStep
from tests.sagas.conftest import op_types, order_inputs, saga, steps

pytestmark = pytest.mark.django_db


class ScopedAgent:
    """An agent whose grant covers only some effect types."""

    def __init__(self, name: str, types: str) -> None:
        out = io.StringIO()
        call_command(
            "issue_token", tenant="acme", principal=name, role="agent", types=types, stdout=out
        )
        self.client = APIClient()
        self.client.credentials(HTTP_AUTHORIZATION=f"Bearer {out.getvalue().splitlines()[-1]}")


def test_a_step_the_gateway_refuses_compensates_what_was_done(start, sandbox):
    stock_bot = ScopedAgent("stock-bot", "inventory.*")  # it may not charge anyone

    body = start("order.fulfillment", order_inputs(), persona=stock_bot)

    charge = steps(body)["charge_payment"]
    assert charge["effect_id"] is None
    assert charge["failure"]["trigger"] == "refused"
    assert "capability" in charge["failure"]["reason"]
    assert body["state"] == "COMPENSATED"
    assert op_types(sandbox) == ["inventory.reservation.create", "inventory.reservation.release"]


@pytest.fixture
def ticket_then_mail(monkeypatch) -> SagaDefinition:
    """A definition of the test's own whose second step's precondition cannot hold."""
    definition = SagaDefinition(
        name="test.ticket_then_mail",
        description="Open a ticket, then mail about it once the ticket names an assignee.",
        inputs_schema={"type": "object"},
        example={},
        steps=(
            Step(
                name="open_ticket",
                effect_type="ticket.create",
                description="Open the ticket.",
                build=lambda c: (
                    {"type": "queue", "id": "support"},
                    {"title": "Printer on fire", "priority": "P2"},
                ),
            ),
            Step(
                name="mail_assignee",
                effect_type="email.message.send",
                description="Mail the assignee.",
                build=lambda c: (
                    {"type": "customer", "id": "cus_42"},
                    {"to": "it@example.com", "subject": "Ticket", "body": "Yours."},
                ),
                precondition=receipt_has("open_ticket", "assignee"),
            ),
        ),
    )
    monkeypatch.setitem(DEFINITIONS, definition.name, definition)
    return definition


def test_an_unmet_precondition_is_a_failure_before_anything_is_sent(
    start, agent, sandbox, ticket_then_mail
):
    body = start(ticket_then_mail.name, {})

    mail = steps(body)["mail_assignee"]
    assert mail["effect_id"] is None
    assert mail["failure"] == {
        "trigger": "precondition_failed",
        "reason": "precondition not met: the receipt of open_ticket has 'assignee'",
    }
    assert body["state"] == "COMPENSATED"
    assert op_types(sandbox) == ["ticket.create", "ticket.close"]
    assert "email.message.send" not in [e["type"] for e in sandbox.log()]
    assert SagaStep.objects.filter(run_id=body["saga_id"], name="mail_assignee").count() == 1
    assert saga(agent, body["saga_id"])["failure"]["trigger"] == "precondition_failed"
