"""Issue 13 item 9: recovery stays on time under a backlog. The sweeper re-sends an overdue
effect's message with backoff instead of every interval, recovery runs on a queue of its own
that every worker consumes, and attempts of dead workers are closed."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from gateway import hooks, services
from gateway.celery import app as celery_app
from gateway.models import Attempt, Effect
from gateway.recovery import attempts_close_abandoned
from reconciliation import tasks as recovery_tasks

pytestmark = pytest.mark.django_db

TICKET = {
    "type": "ticket.create",
    "resource": {"type": "queue", "id": "support"},
    "payload": {"title": "x", "priority": "P3"},
}


def test_a_backlog_gets_a_few_copies_per_effect_not_one_per_interval(agent, monkeypatch, settings):
    settings.GATEWAY_REDELIVER_AFTER = 30
    settings.GATEWAY_REDELIVER_MAX = 300
    ids = [agent.submit({**TICKET}, f"t{i}").json()["effect_id"] for i in range(30)]
    sent: Counter[str] = Counter()
    monkeypatch.setattr(hooks.dispatch_sender, "_send", lambda effect_id: sent.update([effect_id]))
    woken: list[tuple[int, str]] = []
    # No worker consumes anything for five minutes: a backlog (or lost messages).
    start = timezone.now()
    for step in range(0, 301, 5):  # beat: every 5 s
        monkeypatch.setattr(
            "django.utils.timezone.now", lambda step=step: start + timedelta(seconds=step)
        )
        monkeypatch.setattr(hooks.wake_sender, "_send", lambda why, s=step: woken.append((s, why)))
        services.dispatch_sweep()
    per_effect = [sent[effect_id] for effect_id in ids]
    print(f"sweeper messages in 300 s: {sum(per_effect)} for {len(ids)} waiting effects")
    # The first look wakes one more drainer for all of them (a backlog is the likely cause);
    # nobody answers here, so each waiting effect is then re-sent on its own (a lost message
    # is found), with backoff: at 60, 120 and 240 s — not every 30 s (10 copies each).
    assert woken == [(30, f"sweep: {len(ids)} overdue")]
    assert min(per_effect) >= 1
    assert max(per_effect) <= 3


def test_lease_recovery_closes_the_dead_workers_attempt(agent):
    effect_id = agent.submit(TICKET, "t1").json()["effect_id"]
    claim = services.effect_claim(effect_id=effect_id, worker="killed-worker")
    assert Attempt.objects.get(pk=claim.attempt_id).state == "sending"
    Effect.objects.filter(pk=effect_id).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert recovery_tasks.recover_leases() >= 1
    attempt = Attempt.objects.get(pk=claim.attempt_id)
    assert attempt.state == "abandoned" and attempt.finished_at is not None
    assert Effect.objects.get(pk=effect_id).status == "UNKNOWN"


def test_sending_attempts_whose_claim_is_gone_are_closed_and_live_ones_kept(agent, settings):
    dead_id = agent.submit(TICKET, "t1").json()["effect_id"]
    live_id = agent.submit(TICKET, "t2").json()["effect_id"]
    dead = services.effect_claim(effect_id=dead_id, worker="w1")
    live = services.effect_claim(effect_id=live_id, worker="w2")
    old = timezone.now() - timedelta(seconds=settings.GATEWAY_DISPATCH_LEASE + 5)
    Attempt.objects.filter(pk__in=[dead.attempt_id, live.attempt_id]).update(started_at=old)
    # The dead worker's effect moved on without it (recovered before this pass existed).
    Effect.objects.filter(pk=dead_id).update(status="UNKNOWN")
    assert attempts_close_abandoned() == 1
    assert Attempt.objects.get(pk=dead.attempt_id).state == "abandoned"
    assert Attempt.objects.get(pk=live.attempt_id).state == "sending"


def test_recovery_tasks_are_routed_to_their_own_queue(settings):
    router = celery_app.amqp.router
    for name in (
        "reconciliation.tasks.recover_leases",
        "reconciliation.tasks.reconcile_due",
        "gateway.tasks.sweep_dispatch",
    ):
        assert router.route({}, name)["queue"].name == settings.GATEWAY_RECOVERY_QUEUE
    assert (
        router.route({}, "gateway.tasks.dispatch_effect")["queue"].name
        == celery_app.conf.task_default_queue
    )
    beat = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert "reconciliation.tasks.recover_leases" in beat


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_a_worker_started_on_the_dispatch_queue_runs_recovery_before_the_backlog(agent, tmp_path):
    from gateway.tasks import dispatch_effect
    from tests.support.processes import Celery, new_queue, wait_until

    queue = new_queue()
    recovery_queue = f"{queue}.recovery"
    effect_id = agent.submit(TICKET, "t1").json()["effect_id"]
    services.effect_claim(effect_id=effect_id, worker="killed-worker")
    Effect.objects.filter(pk=effect_id).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    # A backlog of 400 no-op dispatch messages, then one recovery message behind them.
    for index in range(400):
        dispatch_effect.apply_async(args=[f"eff_missing_{index}"], queue=queue)
    recovery_tasks.recover_leases.apply_async(queue=recovery_queue)
    worker = Celery("worker", queue, tmp_path / "worker.log")  # started with -Q <queue> only
    try:

        def recovered() -> bool:
            connection.close()
            return Effect.objects.get(pk=effect_id).status == "UNKNOWN"

        wait_until(recovered, timeout=60, what="lease recovery")
        with celery_app.connection_for_write() as conn:
            left = conn.default_channel.queue_declare(queue, passive=True).message_count
        print(f"recovery ran with {left} of 400 dispatch messages still queued")
        assert left > 0  # it did not wait for the backlog to drain
    finally:
        worker.stop()
