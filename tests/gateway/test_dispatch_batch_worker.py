"""A real worker killed in the middle of a batch, at each dispatch failpoint: what it had
claimed waits for its lease, the reconciler asks the provider, and every effect ends CONFIRMED
with one operation at the provider (its own log is the oracle)."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from gateway.celery import app as celery_app
from gateway.models import Attempt
from tests.support import crash
from tests.support.processes import new_queue

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


@pytest.fixture
def queue():
    name = new_queue()
    previous = celery_app.conf.task_default_queue
    celery_app.conf.task_default_queue = name
    yield name
    celery_app.conf.task_default_queue = previous


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
