"""An approval's deadline on the waker's due times (reconciliation.services.expiry): a command
waiting for an approver is expired by the waker when its ``expires_at`` passes, a new one that
expires before the waker's next look wakes it, and an approval given in time is never undone.
The end-to-end timing with a real worker and no beat is in test_waker_worker.py; a saga's step
deadline in tests/sagas/test_step_deadline.py."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from gateway import deadlines, services
from gateway.models import Effect, EffectEvent
from reconciliation import selectors, waker
from reconciliation.services.expiry import effects_expire_awaiting_approval
from tests.conftest import REFUND

pytestmark = pytest.mark.django_db(transaction=True)


def awaiting(agent, title: str, expires_in: int) -> Effect:
    body = {
        **REFUND,
        "payload": {**REFUND["payload"], "amount": 50_000, "reason": title},
        "expires_in": expires_in,
    }
    response = agent.submit(body, f"deadline:{title}")
    assert response.json()["status"] == "AWAITING_APPROVAL", response.json()
    return Effect.objects.select_related("command").get(pk=response.json()["effect_id"])


def test_the_waker_sleeps_until_the_approval_expires_then_expires_it(agent, settings):
    settings.GATEWAY_WAKER_MAX_SLEEP = 5
    effect = awaiting(agent, "soon", expires_in=2)
    assert selectors.effects_next_due().expiry == effect.command.expires_at
    sleep = waker.act_on_due()
    assert 0.5 < sleep <= 2.0, sleep  # until the deadline, not the 5 s cap
    time.sleep(max(0.0, (effect.command.expires_at - timezone.now()).total_seconds()) + 0.05)
    assert waker.act_on_due() == 0.0  # work done: look again at once
    expired = Effect.objects.get(pk=effect.pk)
    assert expired.status == "EXPIRED"
    event = EffectEvent.objects.filter(effect=effect, to_status="EXPIRED").get()
    assert (event.actor, event.from_status) == ("waker", "AWAITING_APPROVAL")
    assert waker.act_on_due() == 5  # nothing left: the cap
    assert selectors.effects_next_due().expiry is None


def test_only_expired_commands_waiting_for_an_approver_are_expired(agent, approver):
    waiting = awaiting(agent, "waiting", expires_in=60)
    approved = awaiting(agent, "approved", expires_in=60)
    services.effect_approve(
        effect=approved,
        principal=approver.principal,
        payload_digest=approved.command.payload_digest,
    )
    later = timezone.now() + timedelta(seconds=30)
    assert effects_expire_awaiting_approval(now=later) == 0
    assert Effect.objects.get(pk=waiting.pk).status == "AWAITING_APPROVAL"
    past = timezone.now() + timedelta(seconds=61)
    assert effects_expire_awaiting_approval(now=past) == 1
    assert Effect.objects.get(pk=waiting.pk).status == "EXPIRED"
    # An approval given in time stands: the claim decides about that effect, not the waker.
    assert Effect.objects.get(pk=approved.pk).status == "PREPARED"


def test_a_command_that_expires_before_the_wakers_next_look_wakes_it(agent, recon_signal, settings):
    settings.GATEWAY_WAKER_MAX_SLEEP = 5
    deadlines.arm(recon_signal, time.time() + 5)
    awaiting(agent, "later", expires_in=3600)
    assert recon_signal.llen(deadlines.wake_key()) == 0, (
        "after the waker's next look: nothing to say"
    )
    awaiting(agent, "sooner", expires_in=2)
    assert recon_signal.llen(deadlines.wake_key()) == 1


def test_an_approval_asked_again_at_the_claim_wakes_the_waker(
    agent, approver, recon_signal, settings, sandbox
):
    """An approval that grew too old before dispatch is asked again: the effect waits for an
    approver once more, until the same deadline."""
    settings.GATEWAY_WAKER_MAX_SLEEP = 5
    settings.GATEWAY_APPROVAL_TTL = 1
    effect = awaiting(agent, "stale", expires_in=3)
    services.effect_approve(
        effect=effect, principal=approver.principal, payload_digest=effect.command.payload_digest
    )
    Effect.objects.filter(pk=effect.pk).update(approved_at=timezone.now() - timedelta(seconds=5))
    recon_signal.delete(deadlines.key(), deadlines.wake_key())
    deadlines.arm(recon_signal, time.time() + 5)
    assert services.effect_claim(effect_id=effect.pk, worker="test") is None
    assert Effect.objects.get(pk=effect.pk).status == "AWAITING_APPROVAL"
    assert recon_signal.llen(deadlines.wake_key()) == 1
