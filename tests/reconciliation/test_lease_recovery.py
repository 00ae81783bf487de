"""Lease recovery: a DISPATCHING claim that outlived its lease becomes UNKNOWN, nothing is
re-sent on that path, and the stale worker's late answer is refused."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from gateway import services as ledger
from gateway.contracts import get_contract
from gateway.ledger import transition
from gateway.models import Attempt, Effect, EffectEvent
from gateway.providers.registry import adapter_for
from reconciliation import services
from tests.reconciliation.conftest import fresh, lookups, operations, sends

pytestmark = pytest.mark.django_db


def expire_lease(effect: Effect) -> None:
    Effect.objects.filter(pk=effect.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )


def test_expired_lease_becomes_unknown_and_the_stale_worker_cannot_write(
    recon_submit, recon_sandbox, recon_enqueued
):
    effect = recon_submit()
    claim = ledger.effect_claim(effect_id=effect.pk, worker="slow-worker")
    assert claim is not None
    expire_lease(effect)
    recon_enqueued.clear()

    assert services.effects_recover_expired_leases() == 1

    effect = fresh(effect)
    assert effect.status == "UNKNOWN"
    assert effect.lease_expires_at is None
    assert effect.next_check_at is not None and effect.next_check_at <= timezone.now()
    event = EffectEvent.objects.filter(effect=effect, kind="lease_expired").get()
    assert (event.from_status, event.to_status) == ("DISPATCHING", "UNKNOWN")
    assert "slow-worker" in event.reason and "attempt 1" in event.reason
    assert event.data == {"worker": "slow-worker", "attempt": 1, "fence": claim.fence}
    # Nothing was sent or enqueued by the recovery itself.
    assert recon_sandbox.log() == []
    assert recon_enqueued == []

    # The stalled worker wakes up, sends with its stale claim, and tries to write.
    contract = get_contract(effect.type)
    result = adapter_for(contract).execute(ledger.execute_request(effect))
    assert str(result.outcome) == "confirmed"
    assert ledger.effect_record_outcome(claim=claim, result=result, worker="slow-worker") is None

    effect = fresh(effect)
    assert effect.status == "UNKNOWN"  # the late answer was refused, not written
    assert Attempt.objects.get(pk=claim.attempt_id).state == "stale"
    assert EffectEvent.objects.filter(effect=effect, kind="stale_write_refused").count() == 1

    # The reconciler settles it by asking, and finds the stale worker's one operation.
    services.reconcile_next_batch()

    effect = fresh(effect)
    assert effect.status == "CONFIRMED"
    assert len(operations(recon_sandbox, effect)) == 1
    assert len(sends(recon_sandbox, effect)) == 1
    assert len(lookups(recon_sandbox, effect)) == 1


def test_a_live_lease_is_left_alone(recon_submit, recon_sandbox):
    effect = recon_submit()
    assert ledger.effect_claim(effect_id=effect.pk, worker="busy-worker") is not None

    assert services.effects_recover_expired_leases() == 0
    assert fresh(effect).status == "DISPATCHING"


def test_recovery_loses_to_a_worker_that_answered_first(recon_submit, recon_sandbox):
    effect = recon_submit()
    claim = ledger.effect_claim(effect_id=effect.pk, worker="w1")
    stale_read = fresh(effect)  # what recovery read before the worker answered
    contract = get_contract(effect.type)
    result = adapter_for(contract).execute(ledger.execute_request(stale_read))
    assert ledger.effect_record_outcome(claim=claim, result=result, worker="w1") is not None

    with transaction.atomic():
        moved = transition(
            stale_read,
            to="UNKNOWN",
            actor=services.LEASE_RECOVERY,
            reason="test",
            expect_fence=stale_read.fence,
        )

    assert moved is False
    assert fresh(effect).status == "CONFIRMED"
