"""Cancel stops future steps, cancels what was not sent, and inventories what is left; with
``compensate`` it also undoes what was done (SPEC §5 "Sagas")."""

from __future__ import annotations

import pytest

from gateway.models import Effect
from sagas.models import SagaRun, SagaStep
from tests.sagas.conftest import op_types, order_inputs, release_inputs, saga, step_effect, steps

pytestmark = pytest.mark.django_db


def cancel(settle, persona, saga_id: str, **body):
    return settle(persona.client.post, f"/api/v1/sagas/{saga_id}/cancel", body, format="json")


def test_cancel_with_a_step_in_flight_is_pending_reconciliation(
    start, settle, agent, operator, sandbox
):
    sandbox.add_fault("processing", type="billing.charge.create", lookups=0)
    body = start("order.fulfillment", order_inputs())
    charge = step_effect(body["saga_id"], "charge_payment")
    reservation = step_effect(body["saga_id"], "reserve_inventory")
    assert charge.status == "IN_PROGRESS"
    assert body["state"] == "RUNNING"

    response = cancel(settle, agent, body["saga_id"], reason="customer changed their mind")
    assert response.status_code == 200, response.json()
    answer = response.json()
    assert answer["outcome"] == "cancelled_pending_reconciliation"
    assert answer["compensating"] is False
    inventory = answer["inventory"]
    assert [i["effect_id"] for i in inventory["confirmed"]] == [reservation.pk]
    assert [i["effect_id"] for i in inventory["in_flight"]] == [charge.pk]
    assert inventory["unknown"] == [] and inventory["cancelled"] == []
    assert answer["saga"]["state"] == "CANCELLED"

    # The charge is settled later by the reconciler: no step follows it.
    settle(operator.client.post, f"/api/v1/effects/{charge.pk}/reconcile")
    assert Effect.objects.get(pk=charge.pk).status == "CONFIRMED"
    body = saga(agent, body["saga_id"])
    assert body["state"] == "CANCELLED"
    assert steps(body)["create_shipment"]["effect_id"] is None
    assert op_types(sandbox) == ["inventory.reservation.create", "billing.charge.create"]
    # Cancelling again is a replay with the inventory as it is now.
    again = cancel(settle, agent, body["saga_id"]).json()
    assert again["outcome"] == "cancelled_with_effects"
    assert len(again["inventory"]["confirmed"]) == 2


def test_cancel_with_compensation_waits_for_the_step_in_flight(
    start, settle, agent, operator, sandbox
):
    sandbox.add_fault("processing", type="billing.charge.create", lookups=0)
    body = start("order.fulfillment", order_inputs())
    charge = step_effect(body["saga_id"], "charge_payment")

    answer = cancel(settle, agent, body["saga_id"], compensate=True).json()
    assert answer["outcome"] == "cancelled_pending_reconciliation"
    assert answer["compensating"] is True
    assert answer["saga"]["state"] == "COMPENSATING"
    # Nothing is undone while the charge's outcome is open: it is the newest step.
    assert op_types(sandbox) == ["inventory.reservation.create", "billing.charge.create"]

    settle(operator.client.post, f"/api/v1/effects/{charge.pk}/reconcile")
    body = saga(agent, body["saga_id"])
    assert body["state"] == "COMPENSATED"
    assert op_types(sandbox) == [
        "inventory.reservation.create",
        "billing.charge.create",
        "billing.refund.create",
        "inventory.reservation.release",
    ]
    assert body["failure"]["trigger"] == "abandoned"


def test_cancel_cancels_a_step_not_yet_sent(start, settle, agent, sandbox):
    body = start("release.production", release_inputs())
    production = step_effect(body["saga_id"], "promote_production")
    assert production.status == "AWAITING_APPROVAL"

    answer = cancel(settle, agent, body["saga_id"]).json()
    assert answer["outcome"] == "cancelled_with_effects"
    assert [i["step"] for i in answer["inventory"]["cancelled"]] == ["promote_production"]
    assert [i["step"] for i in answer["inventory"]["confirmed"]] == [
        "promote_staging",
        "verify_staging",
    ]
    assert Effect.objects.get(pk=production.pk).status == "CANCELLED"
    assert SagaRun.objects.get(pk=body["saga_id"]).state == "CANCELLED"
    assert len(sandbox.operations()) == 2


def test_a_clean_cancel_before_anything_happened(settle, agent, sandbox):
    response = agent.client.post(
        "/api/v1/sagas",
        {"definition": "order.fulfillment", "inputs": order_inputs()},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k1",
    )  # not settled: the first step is issued but never dispatched
    saga_id = response.json()["saga_id"]
    answer = cancel(settle, agent, saga_id).json()
    assert answer["outcome"] == "cancelled"
    assert answer["inventory"]["confirmed"] == []
    assert len(answer["inventory"]["cancelled"]) == 1
    assert sandbox.operations() == []


def test_who_may_cancel(start, settle, agent, other_agent, operator, sandbox):
    sandbox.add_fault("processing", type="billing.charge.create", lookups=0)
    body = start("order.fulfillment", order_inputs())
    refused = cancel(settle, other_agent, body["saga_id"])
    assert refused.status_code == 403
    assert SagaRun.objects.get(pk=body["saga_id"]).state == "RUNNING"
    assert cancel(settle, operator, body["saga_id"]).status_code == 200


def test_a_completed_run_is_cancelled_only_with_compensation(start, settle, agent, sandbox):
    body = start("order.fulfillment", order_inputs())
    refused = cancel(settle, agent, body["saga_id"])
    assert refused.status_code == 409
    assert "compensate" in refused.json()["detail"]
    assert SagaRun.objects.get(pk=body["saga_id"]).state == "COMPLETED"
    assert SagaStep.objects.filter(run_id=body["saga_id"]).exclude(compensation="").count() == 0
