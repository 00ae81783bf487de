"""The provider gates on the ledger's one-by-one paths, in process against the sandbox: a held
effect is not claimed and stays queued with its dispatch time moved to the gate's reopening;
an UNKNOWN effect's lookups wait for an open circuit without spending its budget, and nothing
is ever sent again for it. Real workers: test_provider_protection.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from gateway import services
from gateway.choices import Outcome
from gateway.models import Attempt, Effect
from gateway.providers import protection
from gateway.providers.base import CallResult
from reconciliation.services import reconcile_next_batch

pytestmark = pytest.mark.django_db

REFUSED = CallResult(Outcome.NOT_STARTED, "connection refused")


def submit(persona, body, key) -> Effect:
    response = persona.submit(body, key)
    assert response.status_code == 201, response.json()
    return Effect.objects.select_related("command").get(pk=response.json()["effect_id"])


def open_circuit(provider: str) -> float:
    protection.observe(provider, [REFUSED] * 5)  # GATEWAY_CIRCUIT_FAILURES
    state = protection.snapshot()[provider]
    assert state.circuit == "open"
    return state.since.timestamp()


def log_of(sandbox, effect: Effect) -> list[dict]:
    key = effect.command.provider_key
    return [e for e in sandbox.log(provider="tickets") if e["idempotency_key"] == key]


def test_an_open_circuit_leaves_a_new_effect_queued_until_it_closes(
    sandbox, agent, ticket_body, settings
):
    opened = open_circuit("tickets")
    effect = submit(agent, ticket_body, "held")
    assert services.effect_dispatch(effect_id=effect.pk, worker="test") is False
    effect.refresh_from_db()
    assert effect.status == "PREPARED" and effect.attempt_count == 0
    reopens = opened + settings.GATEWAY_CIRCUIT_OPEN_SECONDS
    # Due again no sooner than the circuit's probe (later if its redelivery time was later).
    assert effect.next_dispatch_at.timestamp() >= reopens - 0.001
    assert not Attempt.objects.filter(effect=effect).exists()
    assert log_of(sandbox, effect) == []
    protection.reset("tickets")  # the provider is back (an operator, or the probe)
    assert services.effect_dispatch(effect_id=effect.pk, worker="test") is True
    effect.refresh_from_db()
    assert effect.status == "CONFIRMED"
    assert len(sandbox.operations(idempotency_key=effect.command.provider_key)) == 1


def test_an_unknown_effect_is_looked_up_after_the_circuit_and_never_sent_again(
    sandbox, agent, ticket_body
):
    sandbox.add_fault("commit_then_drop", times=1)
    effect = submit(agent, ticket_body, "dropped")
    services.effect_dispatch(effect_id=effect.pk, worker="test")
    effect.refresh_from_db()
    assert effect.status == "UNKNOWN"
    checks = effect.check_count
    opened = open_circuit("tickets")
    Effect.objects.filter(pk=effect.pk).update(next_check_at=timezone.now() - timedelta(seconds=1))
    for _ in range(3):  # a worker told to send it, and the reconciler, while the circuit is open
        assert services.effect_dispatch(effect_id=effect.pk, worker="test") is False
        reconcile_next_batch()
    effect.refresh_from_db()
    assert (effect.status, effect.check_count) == ("UNKNOWN", checks)  # no budget spent
    assert effect.next_check_at.timestamp() >= opened
    actions = [entry["action"] for entry in log_of(sandbox, effect)]
    assert actions == ["commit"]  # no lookup, no second send
    protection.reset("tickets")
    Effect.objects.filter(pk=effect.pk).update(next_check_at=timezone.now() - timedelta(seconds=1))
    reconcile_next_batch()
    effect.refresh_from_db()
    assert effect.status == "CONFIRMED"
    assert len(sandbox.operations(idempotency_key=effect.command.provider_key)) == 1
