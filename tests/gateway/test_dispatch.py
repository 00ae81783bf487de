"""Dispatch against the real sandbox provider: each classification path of SPEC §4, with the
sandbox's operation log as the oracle for "sent once"."""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from django.utils import timezone

from gateway import services
from gateway.choices import AttemptState, Outcome
from gateway.models import Attempt, Effect, EffectEvent, Receipt
from gateway.providers.base import CallResult

pytestmark = pytest.mark.django_db


def submit(persona, body, key) -> Effect:
    response = persona.submit(body, key)
    assert response.status_code == 201, response.json()
    return Effect.objects.select_related("command").get(pk=response.json()["effect_id"])


def dispatch(effect: Effect) -> Effect:
    services.effect_dispatch(effect_id=effect.pk, worker="test")
    effect.refresh_from_db()
    return effect


def provider_ops(sandbox, effect: Effect) -> list[dict]:
    return sandbox.operations(idempotency_key=effect.command.provider_key)


def posts(sandbox, effect: Effect) -> list[dict]:
    return [
        entry
        for entry in sandbox.log()
        if entry.get("idempotency_key") == effect.command.provider_key
        and entry["action"] not in {"lookup", "lookup_miss", "lookup_dropped"}
    ]


def test_success_is_confirmed_with_a_receipt(sandbox, agent, ticket_body):
    effect = dispatch(submit(agent, ticket_body, "t1"))
    assert effect.status == "CONFIRMED"
    ops = provider_ops(sandbox, effect)
    assert len(ops) == 1
    receipt = Receipt.objects.get(effect=effect)
    assert receipt.provider_operation_id == ops[0]["id"] == effect.provider_operation_id
    assert receipt.digest_matches is True
    assert receipt.payload_digest == effect.command.payload_digest
    attempt = Attempt.objects.get(effect=effect)
    assert attempt.state == AttemptState.FINISHED and attempt.outcome == "confirmed"
    kinds = list(
        EffectEvent.objects.filter(effect=effect).order_by("id").values_list("kind", "to_status")
    )
    assert kinds == [
        ("submitted", "PREPARED"),
        ("claimed", "DISPATCHING"),
        ("dispatched", "CONFIRMED"),
    ]


def test_the_provider_receives_the_clear_payload_and_the_command_key(sandbox, agent, refund_body):
    effect = dispatch(submit(agent, refund_body, "refund:ord_881:v1"))
    op = provider_ops(sandbox, effect)[0]
    assert op["payload"] == refund_body["payload"]
    assert op["idempotency_key"] == "acme:refund:ord_881:v1"


def test_commit_then_drop_is_unknown_and_never_sent_again(sandbox, agent, ticket_body):
    sandbox.add_fault("commit_then_drop", times=1)
    effect = dispatch(submit(agent, ticket_body, "t1"))
    assert effect.status == "UNKNOWN"
    assert effect.next_check_at is not None  # handed to the reconciler
    # However often a worker is told to dispatch it, nothing more reaches the provider.
    for _ in range(3):
        assert services.effect_dispatch(effect_id=effect.pk, worker="test") is False
    assert len(provider_ops(sandbox, effect)) == 1
    assert len(posts(sandbox, effect)) == 1


def test_fail_before_commit_is_not_started_then_confirmed_with_one_operation(
    sandbox, agent, ticket_body
):
    sandbox.add_fault("fail_before_commit", times=1)
    effect = dispatch(submit(agent, ticket_body, "t1"))
    assert effect.status == "NOT_STARTED"
    assert provider_ops(sandbox, effect) == []
    assert effect.next_dispatch_at is not None
    effect = dispatch(effect)
    assert effect.status == "CONFIRMED"
    assert len(provider_ops(sandbox, effect)) == 1
    # Both attempts used the command's one key.
    keys = {entry["idempotency_key"] for entry in posts(sandbox, effect)}
    assert keys == {effect.command.provider_key}
    assert effect.attempt_count == 2


def test_slower_than_the_timeout_is_unknown(sandbox, agent, ticket_body, settings):
    settings.GATEWAY_PROVIDER_TIMEOUT = 0.5
    sandbox.add_fault("slow", times=1, seconds=2)
    effect = dispatch(submit(agent, ticket_body, "t1"))
    assert effect.status == "UNKNOWN"
    assert "timed out" in EffectEvent.objects.get(effect=effect, kind="dispatched").reason
    assert len(provider_ops(sandbox, effect)) == 1
    assert services.effect_dispatch(effect_id=effect.pk, worker="test") is False
    assert len(posts(sandbox, effect)) == 1


def test_connection_refused_is_not_started(sandbox, agent, ticket_body, settings):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    settings.GATEWAY_PROVIDER_URLS = {
        **settings.GATEWAY_PROVIDER_URLS,
        "tickets": f"http://127.0.0.1:{closed_port}/tickets",
    }
    effect = dispatch(submit(agent, ticket_body, "t1"))
    assert effect.status == "NOT_STARTED"
    assert Attempt.objects.get(effect=effect).outcome == "not_started"


def test_retries_stop_at_the_contract_budget(sandbox, agent, ticket_body, settings):
    sandbox.add_fault("fail_before_commit", times=None)
    effect = submit(agent, ticket_body, "t1")
    for _ in range(8):
        dispatch(effect)
    effect.refresh_from_db()
    assert effect.status == "NOT_STARTED"
    assert effect.attempt_count == 5
    assert effect.escalated is True
    assert effect.next_dispatch_at is None
    assert EffectEvent.objects.filter(effect=effect, kind="retry_budget_exhausted").count() == 1
    assert provider_ops(sandbox, effect) == []


def test_business_rejection_is_rejected(sandbox, agent, ticket_body):
    sandbox.add_fault("reject", times=1, status=402, error="card_declined")
    effect = dispatch(submit(agent, ticket_body, "t1"))
    assert effect.status == "REJECTED"
    assert Attempt.objects.get(effect=effect).http_status == 402


def test_stale_resource_version_is_rejected_as_precondition(sandbox, agent, refund_body):
    sandbox.set_resource_version(provider="billing", type="order", id="ord_881", version=18)
    effect = dispatch(submit(agent, refund_body, "r1"))
    assert effect.status == "REJECTED"
    event = EffectEvent.objects.get(effect=effect, kind="dispatched")
    assert "precondition" in event.reason
    assert provider_ops(sandbox, effect) == []


def test_provider_failed_operation_is_rejected_with_its_receipt(sandbox, agent, ticket_body):
    sandbox.add_fault("fail", times=1)
    effect = dispatch(submit(agent, ticket_body, "t1"))
    assert effect.status == "REJECTED"
    assert Receipt.objects.get(effect=effect).provider_status == "failed"


def test_processing_is_in_progress(sandbox, agent, ticket_body):
    sandbox.add_fault("processing", times=1, lookups=3)
    effect = dispatch(submit(agent, ticket_body, "t1"))
    assert effect.status == "IN_PROGRESS"
    assert effect.next_check_at is not None
    assert services.effect_dispatch(effect_id=effect.pk, worker="test") is False
    assert len(posts(sandbox, effect)) == 1


def test_receipt_with_another_digest_is_unknown_and_flagged(sandbox, agent, ticket_body):
    sandbox.add_fault("digest_mismatch", times=1)
    effect = dispatch(submit(agent, ticket_body, "t1"))
    assert effect.status == "UNKNOWN"
    assert effect.mismatch is True
    receipt = Receipt.objects.get(effect=effect)
    assert receipt.digest_matches is False


def test_key_held_for_another_body_is_unknown_and_flagged(sandbox, agent, ticket_body):
    effect = submit(agent, ticket_body, "t1")
    # Someone else used our provider key first, for another request.
    httpx.post(
        f"{sandbox_base(sandbox_url_of(effect))}/operations",
        headers={"Idempotency-Key": effect.command.provider_key},
        json={
            "type": "ticket.create",
            "resource": {"type": "queue", "id": "x"},
            "payload": {"title": "other", "priority": "P4"},
            "payload_digest": "sha256:00",
        },
    )
    effect = dispatch(effect)
    assert effect.status == "UNKNOWN"
    assert effect.mismatch is True


def sandbox_url_of(effect: Effect) -> str:
    from django.conf import settings

    return settings.GATEWAY_PROVIDER_URLS[effect.command.provider]


def sandbox_base(url: str) -> str:
    return url.rstrip("/")


def test_expired_command_is_expired_and_never_sent(sandbox, agent, ticket_body):
    effect = submit(agent, {**ticket_body, "expires_in": 1}, "t1")
    time.sleep(1.1)
    effect = dispatch(effect)
    assert effect.status == "EXPIRED"
    assert provider_ops(sandbox, effect) == []
    assert sandbox.log() == []


def test_frozen_effect_is_not_dispatched(sandbox, agent, operator, ticket_body):
    effect = submit(agent, ticket_body, "t1")
    services.effect_set_frozen(effect=effect, principal=operator.principal, frozen=True)
    effect = dispatch(effect)
    assert effect.status == "PREPARED"
    assert sandbox.log() == []


def test_a_task_delivered_twice_sends_once(sandbox, agent, ticket_body):
    effect = submit(agent, ticket_body, "t1")
    assert services.effect_dispatch(effect_id=effect.pk, worker="w1") is True
    assert services.effect_dispatch(effect_id=effect.pk, worker="w2") is False
    assert len(provider_ops(sandbox, effect)) == 1
    assert Attempt.objects.filter(effect=effect).count() == 1


def test_stale_fence_write_is_refused_and_recorded(sandbox, agent, ticket_body):
    effect = submit(agent, ticket_body, "t1")
    claim = services.effect_claim(effect_id=effect.pk, worker="slow-worker")
    assert claim is not None
    # Meanwhile the lease ran out: recovery made it UNKNOWN and moved the fence on.
    Effect.objects.filter(pk=effect.pk).update(status="UNKNOWN", fence=claim.fence + 1)
    late = CallResult(Outcome.CONFIRMED, "provider status succeeded", http_status=201)
    assert services.effect_record_outcome(claim=claim, result=late, worker="slow-worker") is None
    effect.refresh_from_db()
    assert effect.status == "UNKNOWN"
    assert Receipt.objects.filter(effect=effect).count() == 0
    refused = EffectEvent.objects.get(effect=effect, kind="stale_write_refused")
    assert refused.data["fence"] == claim.fence
    assert Attempt.objects.get(pk=claim.attempt_id).state == AttemptState.STALE


def test_the_attempt_row_is_committed_before_the_provider_is_called(
    sandbox, agent, ticket_body, monkeypatch
):
    from django.db import connection

    effect = submit(agent, ticket_body, "t1")
    seen = {}

    def spy_execute(self, request):
        seen["attempt"] = (
            Attempt.objects.filter(effect_id=request.effect_id)
            .values_list("state", flat=True)
            .first()
        )
        seen["status"] = Effect.objects.get(pk=request.effect_id).status
        seen["in_atomic"] = connection.in_atomic_block
        return real_execute(self, request)

    from gateway.providers.http import HttpProviderAdapter

    real_execute = HttpProviderAdapter.execute
    monkeypatch.setattr(HttpProviderAdapter, "execute", spy_execute)
    dispatch(effect)
    assert seen["attempt"] == "sending"
    assert seen["status"] == "DISPATCHING"


def test_sweeper_redelivers_a_lost_message(sandbox, agent, ticket_body, eager_tasks):
    # The broker lost the message sent at submission (no on_commit ran in this test's
    # transaction). Once the effect's redelivery time passes, the sweeper sends it again.
    effect = submit(agent, ticket_body, "t1")
    Effect.objects.filter(pk=effect.pk).update(next_dispatch_at=timezone.now())
    assert services.dispatch_sweep() == 1
    effect.refresh_from_db()
    assert effect.status == "CONFIRMED"
    assert len(provider_ops(sandbox, effect)) == 1
    assert services.dispatch_sweep() == 0


def test_sweeper_expires_commands_that_ran_out(sandbox, agent, ticket_body):
    effect = submit(agent, {**ticket_body, "expires_in": 1}, "t1")
    time.sleep(1.1)
    services.dispatch_sweep()
    effect.refresh_from_db()
    assert effect.status == "EXPIRED"
    assert sandbox.log() == []


@pytest.mark.parametrize("status", [408, 429])
def test_rate_limited_or_timed_out_answers_are_not_failures(sandbox, agent, ticket_body, status):
    # A 429 is "not now", not "no": the gateway asks by key, finds nothing, and sends again
    # later with the same key instead of giving the effect up as REJECTED.
    sandbox.add_fault("reject", times=1, status=status, error="slow_down")
    effect = dispatch(submit(agent, ticket_body, "t1"))
    assert effect.status == "NOT_STARTED"
    assert provider_ops(sandbox, effect) == []
    effect = dispatch(effect)
    assert effect.status == "CONFIRMED"
    assert len(provider_ops(sandbox, effect)) == 1
    assert {e["idempotency_key"] for e in posts(sandbox, effect)} == {effect.command.provider_key}
