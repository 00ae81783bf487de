"""A real worker killed in the middle of a batch, at each dispatch failpoint: what it had
claimed waits for its lease, the reconciler asks the provider, and every effect ends CONFIRMED
with one operation at the provider (its own log is the oracle)."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from gateway.lib import broker
from gateway.models import Attempt, Effect
from tests.support import crash
from tests.support.processes import Celery, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def submit(agent, body: dict, key: str) -> str:
    response = agent.submit(body, key)
    assert response.status_code == 201, response.json()
    return response.json()["effect_id"]


def ticket(title: str) -> dict:
    return {
        "type": "ticket.create",
        "resource": {"type": "queue", "id": "support"},
        "payload": {"title": title, "priority": "P3"},
    }


CLOSE = {
    "type": "ticket.close",
    "resource": {"type": "queue", "id": "support"},
    "payload": {"ticket_id": "T-1", "resolution": "duplicate"},
}


@pytest.mark.parametrize(
    "failpoint",
    [
        # The worker's window opens 1, 2, then 2 or 4 (one more per answer): the third claim
        # statement, the fourth answer and the third record all fall in a batch.
        "dispatch.after_claim=1@2",
        "dispatch.after_call=1@3",
        "dispatch.after_record=1@2",
    ],
)
def test_a_worker_killed_mid_batch_recovers_every_effect_once(
    failpoint, sandbox, agent, queue, tmp_path
):
    # The fourth effect answers slowly (within the timeout): whatever batch it is in, the
    # worker dies with it still out, whichever point kills it.
    sandbox.add_fault("slow", times=1, type="ticket.close", seconds=1.0)
    ids = [submit(agent, ticket(f"t{i}"), f"t{i}") for i in range(3)]
    ids.append(submit(agent, CLOSE, "close"))
    ids += [submit(agent, ticket(f"t{i}"), f"t{i}") for i in range(3, 11)]
    started = time.monotonic()
    run = crash.run(
        effect_ids=ids,
        queue=queue,
        logs=tmp_path,
        failpoints=failpoint,
        failpoint_dir=tmp_path / "failpoints",
        timeout=120,
    )
    report = crash.check(
        ids, sandbox, kills=run.kills, seconds=time.monotonic() - started, faults=Counter()
    )
    assert run.kills == 1 and run.unexpected_exits == 0, (run.exits, run.log)
    assert report.duplicates == [] and report.lost == [] and report.stuck == [], report.lines()
    assert report.statuses == Counter({"CONFIRMED": len(ids)}), report.lines()
    assert len(sandbox.operations()) == len(ids)
    # The kill stranded part of a batch: an attempt of the dead worker, claimed by one
    # statement together with others, closed by lease recovery.
    attempts = list(
        Attempt.objects.filter(effect_id__in=ids).values("worker", "started_at", "state")
    )
    batch_size = Counter((a["worker"], a["started_at"]) for a in attempts)
    stranded = [a for a in attempts if a["state"] == "abandoned"]
    assert stranded, attempts
    assert max(batch_size[(a["worker"], a["started_at"])] for a in stranded) >= 2, attempts


def test_a_restarted_worker_drains_what_a_killed_drainer_left(sandbox, agent, queue, tmp_path):
    """The one ``dispatch_due`` of all these submissions dies with its worker (a solo pool:
    unacknowledged until the broker's visibility timeout). No beat runs, so no sweeper: the
    next worker asks for a drain when it starts, and sends the rest at once, each once."""
    ids = [submit(agent, ticket(f"t{i}"), f"t{i}") for i in range(5)]
    env = {
        "GATEWAY_FAILPOINTS": "dispatch.after_claim=1",
        "GATEWAY_FAILPOINT_DIR": str(tmp_path / "failpoints"),
    }
    first = Celery("worker", queue, tmp_path / "worker1.log", pool="solo", **env)
    try:
        wait_until(lambda: first.process.poll() is not None, timeout=60, what="the kill")
    finally:
        first.stop()
    assert first.process.returncode == -9, first.output()[-3000:]
    (stranded,) = Effect.objects.filter(pk__in=ids, status="DISPATCHING").values_list(
        "pk", flat=True
    )  # the window of a fresh worker: one effect
    rest = [effect_id for effect_id in ids if effect_id != stranded]
    second = Celery("worker", queue, tmp_path / "worker2.log", pool="solo", **env)
    try:
        wait_confirmed(rest, what="the rest confirmed", timeout=60)
    finally:
        second.stop()
    assert Effect.objects.get(pk=stranded).status == "DISPATCHING"  # its lease, then a lookup
    ops = Counter(op["idempotency_key"] for op in sandbox.operations())
    keys = dict(Effect.objects.filter(pk__in=rest).values_list("pk", "command__provider_key"))
    assert ops == Counter({keys[effect_id]: 1 for effect_id in rest})


def wait_confirmed(ids: list[str], *, what: str, timeout: float) -> None:
    wait_until(
        lambda: Effect.objects.filter(pk__in=ids, status="CONFIRMED").count() == len(ids),
        timeout=timeout,
        what=what,
    )


def celery_messages(queue: str) -> int:
    """Messages waiting in the queue's Redis list (what Celery publishes to it)."""

    return broker.client().llen(queue)


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_submission_reaches_a_drainer_thread_without_a_broker_message(
    pool, sandbox, agent, queue, tmp_path
):
    """No beat (no sweeper) and no ``dispatch_due`` message: the submission's wake-up alone
    gets its effect sent, by a drainer thread of the worker (of a child, with prefork)."""
    worker = Celery("worker", queue, tmp_path / "worker.log", pool=pool)
    try:
        wait_until(lambda: "ready." in worker.output(), timeout=60, what="the worker ready")
        ids = [submit(agent, ticket(f"t{i}"), f"t{i}") for i in range(4)]
        assert celery_messages(queue) == 0
        wait_confirmed(ids, what="the effects confirmed", timeout=30)
    finally:
        worker.stop()
    assert "Task gateway.tasks.dispatch_due[" not in worker.output()
    ops = Counter(op["idempotency_key"] for op in sandbox.operations())
    assert sorted(ops.values()) == [1] * len(ids)


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_warm_shutdown_records_the_call_a_drainer_has_out(
    pool, sandbox, agent, queue, tmp_path, settings
):
    """SIGTERM (a deploy) while a call is out: the drain records its answer before the
    worker exits, so nothing is left DISPATCHING for the lease and the reconciler."""
    settings.GATEWAY_PROVIDER_TIMEOUT = 6  # the worker's (tests/support/processes.py)
    sandbox.add_fault("slow", times=1, seconds=2.0)
    worker = Celery("worker", queue, tmp_path / "worker.log", pool=pool)
    try:
        wait_until(lambda: "ready." in worker.output(), timeout=60, what="the worker ready")
        effect_id = submit(agent, ticket("slow"), "slow")
        wait_until(
            lambda: Effect.objects.get(pk=effect_id).status == "DISPATCHING",
            timeout=30,
            what="the call out",
        )
        worker.stop(timeout=30)  # SIGTERM: a warm shutdown
    finally:
        worker.stop()
    output = worker.output()
    assert worker.process.returncode == 0, output[-3000:]
    # The shutdown began while the call was out, and the answer was recorded after it.
    assert output.index("Warm shutdown") < output.index('"to": "CONFIRMED"'), output[-3000:]
    assert Effect.objects.get(pk=effect_id).status == "CONFIRMED"
    (attempt,) = Attempt.objects.filter(effect_id=effect_id)
    assert attempt.state == "finished", attempt.state
    assert len(sandbox.operations()) == 1
