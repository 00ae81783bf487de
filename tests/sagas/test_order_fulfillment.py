"""order.fulfillment end to end against the real sandbox: the happy path, a failure at each
step with exactly the right compensations in reverse order, the email that is never taken back
automatically, and a compensation that fails (SPEC §4, §5 "Sagas")."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.utils import timezone

from gateway.models import Command, Effect
from sagas.models import SagaEvent, SagaRun, SagaTask
from sagas.selectors import saga_blocks_dispatch
from tests.sagas.conftest import (
    ORDER_STEPS,
    op_types,
    order_inputs,
    saga,
    sends,
    step_effect,
    steps,
)

pytestmark = pytest.mark.django_db

FORWARD = [
    "inventory.reservation.create",
    "billing.charge.create",
    "shipment.create",
    "email.message.send",
]
UNDO = {
    "reserve_inventory": "inventory.reservation.release",
    "charge_payment": "billing.refund.create",
    "create_shipment": "shipment.cancel",
}


def test_happy_path_sends_each_step_once_in_order(start, agent, sandbox):
    body = start("order.fulfillment", order_inputs())

    assert body["state"] == "COMPLETED", body
    assert op_types(sandbox) == FORWARD
    by_name = steps(body)
    assert list(by_name) == ORDER_STEPS
    for name in ORDER_STEPS:
        step = by_name[name]
        assert step["effect_status"] == "CONFIRMED"
        assert step["revision"] == 1
        assert step["idempotency_key"] == f"saga:{body['saga_id']}:{name}:r1"
        effect = Effect.objects.select_related("command").get(pk=step["effect_id"])
        assert effect.command.saga_id == body["saga_id"]
        assert effect.command.saga_step == name
        assert effect.command.requested_by_id == agent.principal.pk
        # Each operation was POSTed once: no replay, no second send.
        assert len(sends(sandbox, effect.command.provider_key)) == 1
        assert step["receipt"]["provider_operation_id"] == effect.provider_operation_id
        assert step["compensation"]["decision"] is None
    # Later steps are built from earlier receipts: the email names the real tracking number.
    shipment = sandbox.operations(type="shipment.create")[0]
    email = sandbox.operations(type="email.message.send")[0]
    assert shipment["result"]["tracking_number"] in email["payload"]["body"]
    assert email["payload"]["to"] == "ada@example.com"
    assert (
        by_name["create_shipment"]["receipt"]["references"]["tracking_number"]
        == (shipment["result"]["tracking_number"])
    )
    assert by_name["notify_customer"]["compensation"]["irreversible"] is True
    assert by_name["notify_customer"]["compensation"]["owner"] == "lifecycle-messaging"
    kinds = list(
        SagaEvent.objects.filter(run_id=body["saga_id"])
        .order_by("id")
        .values_list("kind", flat=True)
    )
    assert kinds.count("step_issued") == 4
    assert kinds[0] == "started" and kinds[-1] == "state"
    assert SagaEvent.objects.filter(run_id=body["saga_id"]).last().to_state == "COMPLETED"


@pytest.mark.parametrize("failing", ORDER_STEPS)
def test_a_failure_at_each_step_compensates_the_confirmed_ones_newest_first(
    start, sandbox, failing
):
    failing_type = FORWARD[ORDER_STEPS.index(failing)]
    sandbox.add_fault("reject", type=failing_type, status=402, error="declined")

    body = start("order.fulfillment", order_inputs())

    done = ORDER_STEPS[: ORDER_STEPS.index(failing)]
    undo = [UNDO[name] for name in reversed(done) if name in UNDO]
    assert op_types(sandbox) == FORWARD[: len(done)] + undo
    # Each forward and each compensating operation exactly once.
    assert len({op["idempotency_key"] for op in sandbox.operations()}) == len(done) + len(undo)
    by_name = steps(body)
    assert by_name[failing]["effect_status"] == "REJECTED"
    assert by_name[failing]["failure"]["trigger"] == "rejected"
    assert body["failure"]["step"] == failing
    for name in done:
        assert by_name[name]["effect_status"] == "COMPENSATED"
        assert by_name[name]["compensation"]["decision"] == "issued"
        compensation = Effect.objects.select_related("command").get(
            pk=by_name[name]["compensation"]["effect_id"]
        )
        assert compensation.status == "CONFIRMED"
        assert compensation.type == UNDO[name]
        assert compensation.command.compensates_id == by_name[name]["effect_id"]
        assert compensation.command.saga_id == body["saga_id"]
    later = ORDER_STEPS[ORDER_STEPS.index(failing) + 1 :]
    assert all(by_name[name]["effect_id"] is None for name in later)
    assert body["state"] == ("COMPENSATED" if done else "FAILED")
    assert not SagaTask.objects.exists()


def test_compensations_run_one_at_a_time(start, sandbox):
    """The refund is issued only once the shipment's cancellation has settled: the sandbox's
    commit order is the order the saga waited in, and each compensation was issued after the
    one before it was CONFIRMED."""
    sandbox.add_fault("reject", type="email.message.send")
    body = start("order.fulfillment", order_inputs())
    by_name = steps(body)
    cancel = Effect.objects.get(pk=by_name["create_shipment"]["compensation"]["effect_id"])
    refund = Effect.objects.get(pk=by_name["charge_payment"]["compensation"]["effect_id"])
    release = Effect.objects.get(pk=by_name["reserve_inventory"]["compensation"]["effect_id"])
    assert cancel.confirmed_at <= refund.created_at
    assert refund.confirmed_at <= release.created_at


def test_the_email_is_never_compensated_automatically(start, settle, agent, operator, sandbox):
    body = start("order.fulfillment", order_inputs())
    assert body["state"] == "COMPLETED"

    response = settle(
        agent.client.post,
        f"/api/v1/sagas/{body['saga_id']}/cancel",
        {"compensate": True, "reason": "customer returned the order"},
        format="json",
    )
    assert response.status_code == 200, response.json()
    assert response.json()["outcome"] == "cancelled_with_effects"

    body = saga(agent, body["saga_id"])
    assert body["state"] == "MANUAL_COMPENSATION"
    # Shipment, charge and reservation undone, newest first; no second email of any kind.
    assert op_types(sandbox) == [
        *FORWARD,
        "shipment.cancel",
        "billing.refund.create",
        "inventory.reservation.release",
    ]
    notify = steps(body)["notify_customer"]
    assert notify["effect_status"] == "CONFIRMED"
    assert notify["compensation"]["decision"] == "manual"
    assert notify["compensation"]["effect_id"] is None
    [task] = body["tasks"]
    assert task["kind"] == "manual_compensation"
    assert task["owner"] == "lifecycle-messaging"
    assert task["step"] == "notify_customer"
    assert "irreversible" in task["reason"]
    listed = operator.client.get("/api/v1/saga-tasks?owner=lifecycle-messaging").json()
    assert [t["task_id"] for t in listed["results"]] == [task["task_id"]]

    # The owner decides (here: no correction needed) and closes the task.
    assert agent.client.post(f"/api/v1/saga-tasks/{task['task_id']}/done").status_code == 403
    done = operator.client.post(
        f"/api/v1/saga-tasks/{task['task_id']}/done",
        {"note": "customer was told by phone"},
        format="json",
    )
    assert done.status_code == 200, done.json()
    assert done.json()["state"] == "done"
    assert saga(agent, body["saga_id"])["state"] == "COMPENSATED"
    assert len(sandbox.operations(type="email.message.send")) == 1


def test_a_step_outside_its_window_goes_to_its_owner(start, settle, agent, sandbox):
    body = start("order.fulfillment", order_inputs())
    shipment = step_effect(body["saga_id"], "create_shipment")
    # Booked 13 hours ago: shipment.create may be cancelled automatically for 12 hours.
    Effect.objects.filter(pk=shipment.pk).update(confirmed_at=timezone.now() - timedelta(hours=13))
    settle(
        agent.client.post,
        f"/api/v1/sagas/{body['saga_id']}/cancel",
        {"compensate": True},
        format="json",
    )

    body = saga(agent, body["saga_id"])
    assert body["state"] == "MANUAL_COMPENSATION"
    assert "shipment.cancel" not in op_types(sandbox)
    assert op_types(sandbox)[len(FORWARD) :] == [
        "billing.refund.create",
        "inventory.reservation.release",
    ]
    tasks = {task["step"]: task for task in body["tasks"]}
    assert set(tasks) == {"create_shipment", "notify_customer"}
    assert tasks["create_shipment"]["owner"] == "fulfillment-oncall"
    assert "window" in tasks["create_shipment"]["reason"]
    assert Effect.objects.get(pk=shipment.pk).status == "CONFIRMED"


def test_a_failing_compensator_freezes_the_saga_and_pages_the_owner(start, agent, sandbox, caplog):
    sandbox.add_fault("reject", type="shipment.create", status=410, error="no_carrier")
    sandbox.add_fault("reject", type="billing.refund.create", status=409, error="disputed")
    with caplog.at_level(logging.ERROR, logger="sagas.services"):
        body = start("order.fulfillment", order_inputs())

    assert body["state"] == "COMPENSATION_FAILED"
    assert body["frozen"] is True
    by_name = steps(body)
    assert by_name["charge_payment"]["effect_status"] == "COMPENSATION_FAILED"
    # Terminal: the reservation is not released behind the failed refund's back.
    assert by_name["reserve_inventory"]["effect_status"] == "CONFIRMED"
    assert op_types(sandbox) == ["inventory.reservation.create", "billing.charge.create"]
    [page] = SagaTask.objects.filter(run_id=body["saga_id"])
    assert (page.kind, page.owner, page.state) == ("page", "billing-oncall", "open")
    assert "reserve_inventory" in page.reason
    [line] = [r for r in caplog.records if r.getMessage() == "saga compensation failed"]
    assert line.saga_id == body["saga_id"]
    assert line.owner == "billing-oncall"
    assert line.page is True
    # Terminal means terminal: nothing resumes or unfreezes it.
    run = SagaRun.objects.get(pk=body["saga_id"])
    assert run.next_check_at is None


def test_an_unknown_step_pauses_the_saga_until_it_is_reconciled(start, settle, operator, sandbox):
    sandbox.add_fault("commit_then_drop", type="billing.charge.create")
    body = start("order.fulfillment", order_inputs())

    assert body["state"] == "PAUSED_UNKNOWN"
    charge = step_effect(body["saga_id"], "charge_payment")
    assert charge.status == "UNKNOWN"
    assert steps(body)["create_shipment"]["effect_id"] is None

    response = settle(operator.client.post, f"/api/v1/effects/{charge.pk}/reconcile")
    assert response.status_code == 200, response.json()

    body = saga(operator, body["saga_id"])
    assert body["state"] == "COMPLETED"
    assert op_types(sandbox) == FORWARD
    assert len(sends(sandbox, charge.command.provider_key)) == 1
    states = list(
        SagaEvent.objects.filter(run_id=body["saga_id"], kind="state")
        .order_by("id")
        .values_list("from_state", "to_state")
    )
    assert ("RUNNING", "PAUSED_UNKNOWN") in states
    assert ("PAUSED_UNKNOWN", "RUNNING") in states


def test_a_mismatch_freezes_the_saga(start, settle, operator, sandbox):
    sandbox.add_fault("digest_mismatch", type="billing.charge.create")
    body = start("order.fulfillment", order_inputs())

    assert body["frozen"] is True
    assert body["state"] == "PAUSED_UNKNOWN"
    assert "mismatch" in body["frozen_reason"]
    assert steps(body)["charge_payment"]["mismatch"] is True
    assert op_types(sandbox) == FORWARD[:2]
    assert saga_blocks_dispatch(body["saga_id"]) is True

    # An operator unfreezes after looking: the same mismatch does not freeze it again.
    response = settle(operator.client.post, f"/api/v1/sagas/{body['saga_id']}/unfreeze")
    assert response.status_code == 200, response.json()
    assert response.json()["frozen"] is False
    assert SagaRun.objects.get(pk=body["saga_id"]).frozen is False


def test_a_charge_waiting_for_approval_holds_the_saga(start, settle, agent, approver, sandbox):
    body = start("order.fulfillment", order_inputs(amount=750_000))
    assert body["state"] == "RUNNING"
    charge = steps(body)["charge_payment"]
    assert charge["effect_status"] == "AWAITING_APPROVAL"
    assert op_types(sandbox) == FORWARD[:1]

    effect = Effect.objects.select_related("command").get(pk=charge["effect_id"])
    response = settle(
        approver.client.post,
        f"/api/v1/effects/{effect.pk}/approve",
        {"payload_digest": effect.command.payload_digest},
        format="json",
    )
    assert response.status_code == 200, response.json()
    assert saga(agent, body["saga_id"])["state"] == "COMPLETED"
    assert op_types(sandbox) == FORWARD
    assert Command.objects.filter(saga_id=body["saga_id"]).count() == 4
