"""The orchestrator under duplicate delivery, lost messages (the sweeper) and freezes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models import F
from django.utils import timezone

from gateway import services as ledger
from gateway.models import Command, Effect
from sagas import selectors, services
from sagas.models import SagaEvent, SagaRun, SagaStep
from sagas.tasks import advance_saga, sweep_sagas
from tests.sagas.conftest import ORDER_STEPS, op_types, order_inputs, saga, step_effect

pytestmark = pytest.mark.django_db


def begin(agent, key: str = "k1") -> str:
    """Start a run without letting anything after commit happen: the test drives it."""
    response = agent.client.post(
        "/api/v1/sagas",
        {"definition": "order.fulfillment", "inputs": order_inputs()},
        format="json",
        HTTP_IDEMPOTENCY_KEY=key,
    )
    assert response.status_code == 201, response.json()
    return response.json()["saga_id"]


def test_duplicate_advance_deliveries_issue_each_step_once(agent, sandbox, propagating_tasks):
    saga_id = begin(agent)
    for name in ORDER_STEPS:
        effect = step_effect(saga_id, name)
        assert ledger.effect_dispatch(effect_id=effect.pk, worker="test") is True
        # The status change's message, and two copies of it (a redelivery, the sweeper's).
        results = [advance_saga.apply(args=(saga_id,)).get() for _ in range(3)]
        assert results == [True, False, False], name
    assert SagaRun.objects.get(pk=saga_id).state == "COMPLETED"
    assert SagaStep.objects.filter(run_id=saga_id).count() == 4
    assert Command.objects.filter(saga_id=saga_id).count() == 4
    assert op_types(sandbox) == [
        "inventory.reservation.create",
        "billing.charge.create",
        "shipment.create",
        "email.message.send",
    ]
    assert SagaEvent.objects.filter(run_id=saga_id, kind="step_issued").count() == 4
    # Deliveries after the end are no-ops.
    assert advance_saga.apply(args=(saga_id,)).get() is False
    assert advance_saga.apply(args=("sag_does_not_exist",)).get() is False


def test_the_sweeper_re_advances_a_run_whose_message_was_lost(agent, sandbox, propagating_tasks):
    saga_id = begin(agent)
    first = step_effect(saga_id, "reserve_inventory")
    ledger.effect_dispatch(effect_id=first.pk, worker="test")  # its message never arrives
    assert SagaStep.objects.filter(run_id=saga_id).count() == 1

    # Not quiet for long enough yet: nothing is swept.
    assert sweep_sagas.apply().get() == 0
    SagaRun.objects.filter(pk=saga_id).update(next_check_at=timezone.now() - timedelta(seconds=1))
    assert sweep_sagas.apply().get() == 1
    assert SagaStep.objects.filter(run_id=saga_id, name="charge_payment").count() == 1
    run = SagaRun.objects.get(pk=saga_id)
    assert run.next_check_at > timezone.now()
    # A frozen or finished run is not swept.
    SagaRun.objects.filter(pk=saga_id).update(
        next_check_at=timezone.now() - timedelta(seconds=1), frozen=True
    )
    assert sweep_sagas.apply().get() == 0


def test_a_frozen_saga_issues_nothing_until_unfrozen(agent, operator, sandbox, settle):
    saga_id = begin(agent)
    frozen = operator.client.post(f"/api/v1/sagas/{saga_id}/freeze", {}, format="json")
    assert frozen.status_code == 200
    assert selectors.saga_blocks_dispatch(saga_id) is True
    ledger.effect_dispatch(effect_id=step_effect(saga_id, "reserve_inventory").pk, worker="t")
    assert services.saga_advance(saga_id=saga_id) is False
    assert SagaStep.objects.filter(run_id=saga_id).count() == 1

    response = settle(operator.client.post, f"/api/v1/sagas/{saga_id}/unfreeze")
    assert response.status_code == 200
    assert selectors.saga_blocks_dispatch(saga_id) is False
    assert saga(agent, saga_id)["state"] == "COMPLETED"
    kinds = list(
        SagaEvent.objects.filter(run_id=saga_id).order_by("id").values_list("kind", flat=True)
    )
    assert kinds.index("frozen") < kinds.index("unfrozen")


def test_the_dispatcher_sends_nothing_of_a_frozen_saga(agent, operator, sandbox):
    saga_id = begin(agent)
    operator.client.post(f"/api/v1/sagas/{saga_id}/freeze", {}, format="json")
    effect = step_effect(saga_id, "reserve_inventory")
    assert ledger.effect_dispatch(effect_id=effect.pk, worker="test") is False
    assert Effect.objects.get(pk=effect.pk).status == "PREPARED"
    assert sandbox.operations() == []


def test_the_sweeper_leaves_a_frozen_sagas_effects_alone(agent, operator, sandbox):
    from django.utils import timezone

    saga_id = begin(agent)
    effect = step_effect(saga_id, "reserve_inventory")
    Effect.objects.filter(pk=effect.pk).update(next_dispatch_at=timezone.now())
    operator.client.post(f"/api/v1/sagas/{saga_id}/freeze", {}, format="json")
    assert ledger.dispatch_sweep() == 0
    operator.client.post(f"/api/v1/sagas/{saga_id}/unfreeze", {}, format="json")
    Effect.objects.filter(pk=effect.pk).update(next_dispatch_at=timezone.now())
    assert ledger.dispatch_sweep() == 1


def test_the_mismatch_hook_freezes_once_per_effect(agent, operator, sandbox):
    saga_id = begin(agent)
    effect_id = step_effect(saga_id, "reserve_inventory").pk
    froze = services.saga_freeze(
        saga_id=saga_id, actor="reconciler", reason="mismatch", mismatch_effect_id=effect_id
    )
    assert froze is True
    assert SagaRun.objects.get(pk=saga_id).frozen is True
    operator.client.post(f"/api/v1/sagas/{saga_id}/unfreeze")
    # The reconciler looks again and reports the same mismatch: the operator's call stands.
    again = services.saga_freeze(
        saga_id=saga_id, actor="reconciler", reason="mismatch", mismatch_effect_id=effect_id
    )
    assert again is False
    assert SagaRun.objects.get(pk=saga_id).frozen is False
    assert SagaEvent.objects.filter(run_id=saga_id, kind="frozen").count() == 1
    assert services.saga_freeze(saga_id="sag_nope", actor="reconciler", reason="x") is False


def test_a_mismatch_found_by_the_reconciler_freezes_the_saga(start, settle, operator, sandbox):
    # The provider commits, the answer is lost, and what it recorded is not what was sent:
    # the effect stays UNKNOWN and only the reconciler's lookup finds the mismatch.
    sandbox.add_fault("commit_then_drop", type="billing.charge.create")
    sandbox.add_fault("digest_mismatch", type="billing.charge.create")
    body = start("order.fulfillment", order_inputs())
    charge = step_effect(body["saga_id"], "charge_payment")
    assert (charge.status, charge.mismatch) == ("UNKNOWN", False)
    assert SagaRun.objects.get(pk=body["saga_id"]).frozen is False

    settle(operator.client.post, f"/api/v1/effects/{charge.pk}/reconcile")

    run = SagaRun.objects.get(pk=body["saga_id"])
    assert Effect.objects.get(pk=charge.pk).mismatch is True
    assert run.frozen is True
    assert run.mismatches == [charge.pk]
    frozen = SagaEvent.objects.get(run=run, kind="frozen")
    assert frozen.actor == "reconciler"


def test_every_state_change_is_an_event_with_who_and_why(start, agent, sandbox):
    sandbox.add_fault("reject", type="shipment.create")
    body = start("order.fulfillment", order_inputs())
    changes = list(
        SagaEvent.objects.filter(run_id=body["saga_id"])
        .exclude(from_state=F("to_state"))
        .order_by("id")
        .values_list("from_state", "to_state", "actor")
    )
    assert changes == [
        ("", "RUNNING", "agent:refund-bot"),
        ("RUNNING", "COMPENSATING", "saga-orchestrator"),
        ("COMPENSATING", "COMPENSATED", "saga-orchestrator"),
    ]
    assert all(
        e.reason for e in SagaEvent.objects.filter(run_id=body["saga_id"]).exclude(kind="started")
    )
