"""A saga run's state changes are announced to the tenant's webhook endpoints
(``saga.state_changed``, issue 15 item 2), written with the change."""

from __future__ import annotations

import pytest

from gateway.webhooks.models import WebhookMessage
from tests.sagas.conftest import order_inputs

pytestmark = pytest.mark.django_db


def test_saga_state_changes_are_announced(start, settle, agent, operator, sandbox):
    response = operator.client.post(
        "/api/v1/webhook-endpoints",
        {"url": "http://127.0.0.1:9/hooks", "event_types": ["saga.state_changed"]},
        format="json",
    )
    assert response.status_code == 201, response.json()
    # The payment fails for good: the run goes backward, undoing the reservation.
    sandbox.add_fault("reject", type="billing.charge.create")
    body = start("order.fulfillment", order_inputs())
    messages = WebhookMessage.objects.filter(effect_id=body["saga_id"]).order_by("created_at")
    changes = [(m.payload["data"]["from_state"], m.payload["data"]["state"]) for m in messages]
    assert changes, "no saga.state_changed message was written"
    assert changes[0][0] == "RUNNING"
    assert changes[-1][1] == body["state"] or changes[-1][1] in {"COMPENSATED", "FAILED"}
    assert {m.event_type for m in messages} == {"saga.state_changed"}
    assert messages[0].payload["data"]["requested_by"] == agent.principal.name
