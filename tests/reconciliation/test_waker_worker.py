"""Deadlines, not sweeps, end to end: a real worker process and no beat at all, the reconciler's
sweep interval an hour and the wakers' longest sleep a minute, so that neither a sweep nor
the safety-net look can explain an effect settled within seconds of its due time: only the
deadline (the waker's timer, set from the due time a writer announced) can. The figures are
printed; the bounds are generous (a loaded machine of two cores)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection

from gateway.models import Effect, EffectEvent
from reconciliation.models import ReconciliationRecord
from tests.conftest import REFUND
from tests.support.processes import Celery, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

# Sweeps that never come, and a safety net far beyond the deadlines under test.
NO_SWEEPS = {"GATEWAY_RECONCILE_INTERVAL": "3600", "GATEWAY_WAKER_MAX_SLEEP": "60"}
LATE_AT_MOST = 15.0  # seconds after the due time; what is measured is printed
LEASE = 6


def submit(agent, ticket_body, title: str) -> str:
    body = {**ticket_body, "payload": {**ticket_body["payload"], "title": title}}
    response = agent.submit(body, f"deadline-{title}")
    assert response.status_code == 201, response.json()
    return response.json()["effect_id"]


def read(effect_id: str) -> Effect:
    connection.close()  # what the worker committed, not a cached view
    return Effect.objects.select_related("command").get(pk=effect_id)


def test_an_unknown_is_looked_up_at_its_due_time_not_at_a_sweep(
    sandbox, agent, ticket_body, queue, tmp_path
):
    sandbox.add_fault("commit_then_drop", times=1)
    effect_id = submit(agent, ticket_body, "dropped")
    worker = Celery(
        "worker", queue, tmp_path / "worker.log", GATEWAY_RECONCILE_BACKOFF="2", **NO_SWEEPS
    )
    due = None
    try:

        def unknown_seen() -> bool:
            nonlocal due
            effect = read(effect_id)
            if effect.status == "UNKNOWN" and effect.next_check_at is not None:
                due = effect.next_check_at if due is None else min(due, effect.next_check_at)
            return due is not None or effect.status == "CONFIRMED"

        wait_until(unknown_seen, timeout=60, what="the dropped answer (UNKNOWN)")
        wait_until(lambda: read(effect_id).status == "CONFIRMED", timeout=60, what="CONFIRMED")
    finally:
        worker.stop()
    effect = read(effect_id)
    assert due is not None, "the UNKNOWN and its due time were never seen"
    late = (effect.confirmed_at - due).total_seconds()
    print(f"UNKNOWN due at {due:%H:%M:%S.%f}, CONFIRMED {late:.2f} s after its due time")
    assert late < LATE_AT_MOST
    record = ReconciliationRecord.objects.get(effect_id=effect_id)
    assert (record.outcome, record.actor) == ("confirmed", "reconciler")
    assert len(sandbox.operations(idempotency_key=effect.command.provider_key)) == 1
    assert len(sandbox.operations()) == 1
    assert "Traceback" not in worker.output()


def test_an_expired_lease_is_recovered_at_its_deadline(
    sandbox, agent, ticket_body, queue, tmp_path
):
    """A child killed right after its claim leaves the effect DISPATCHING under a 6 s lease;
    another child's waker, which saw the lease at a look (every 4 s at most), sleeps until it
    runs out and makes the effect UNKNOWN then, not at its next look; the lookup (nothing
    reached the provider) sends it again with its key: one operation."""
    worker = Celery(
        "worker",
        queue,
        tmp_path / "worker.log",
        GATEWAY_PROVIDER_TIMEOUT="1",
        GATEWAY_DISPATCH_LEASE=str(LEASE),
        GATEWAY_FAILPOINTS="dispatch.after_claim=1",
        GATEWAY_FAILPOINT_DIR=str(tmp_path / "failpoints"),
        **{**NO_SWEEPS, "GATEWAY_WAKER_MAX_SLEEP": "4"},
    )
    try:
        effect_id = submit(agent, ticket_body, "stranded")
        wait_until(
            lambda: EffectEvent.objects.filter(effect_id=effect_id, kind="lease_expired").exists(),
            timeout=60,
            what="lease recovery",
        )
        wait_until(lambda: read(effect_id).status == "CONFIRMED", timeout=60, what="CONFIRMED")
    finally:
        worker.stop()
    assert (tmp_path / "failpoints" / "dispatch.after_claim").stat().st_size >= 1
    claimed = EffectEvent.objects.filter(effect_id=effect_id, kind="claimed").order_by("id")[0]
    recovered = EffectEvent.objects.get(effect_id=effect_id, kind="lease_expired")
    deadline = claimed.created_at + timedelta(seconds=LEASE)
    late = (recovered.created_at - deadline).total_seconds()
    print(f"lease ran out at {deadline:%H:%M:%S.%f}, recovered {late:.2f} s after")
    assert -0.5 < late < LATE_AT_MOST
    effect = read(effect_id)
    assert len(sandbox.operations(idempotency_key=effect.command.provider_key)) == 1


def test_an_approval_expires_at_its_deadline_not_at_a_sweep(agent, queue, tmp_path):
    """A refund waiting for an approver with 4 s to live: the worker's waker (no beat, so no
    dispatch sweep; the safety-net look a minute away) expires it at its deadline; nothing is
    sent."""
    worker = Celery("worker", queue, tmp_path / "worker.log", **NO_SWEEPS)
    try:
        body = {
            **REFUND,
            "payload": {**REFUND["payload"], "amount": 50_000},
            "expires_in": 4,
        }
        response = agent.submit(body, "deadline-approval")
        assert response.json()["status"] == "AWAITING_APPROVAL", response.json()
        effect_id = response.json()["effect_id"]
        wait_until(lambda: read(effect_id).status == "EXPIRED", timeout=60, what="EXPIRED")
    finally:
        worker.stop()
    effect = read(effect_id)
    expired = EffectEvent.objects.get(effect_id=effect_id, to_status="EXPIRED")
    late = (expired.created_at - effect.command.expires_at).total_seconds()
    print(f"command expired at {effect.command.expires_at:%H:%M:%S.%f}, EXPIRED {late:.2f} s after")
    assert expired.actor == "waker"
    assert 0 <= late < LATE_AT_MOST
    assert effect.attempt_count == 0
