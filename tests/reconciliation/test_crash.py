"""The crash test: real worker and beat processes, a worker SIGKILLed at each point of the
dispatch path, and the sandbox's log compared with the ledger afterwards."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from tests.support import crash

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def submit(agent, count: int, prefix: str) -> list[str]:
    ids = []
    for index in range(count):
        body = {
            "type": "ticket.create",
            "resource": {"type": "queue", "id": "support"},
            "payload": {"title": f"{prefix} {index}", "priority": "P3"},
        }
        response = agent.submit(body, f"{prefix}-{index}")
        assert response.status_code == 201
        ids.append(response.json()["effect_id"])
    return ids


@pytest.mark.parametrize(
    "failpoint",
    ["dispatch.after_claim", "dispatch.after_call", "dispatch.after_record"],
)
def test_a_worker_killed_at_each_point_recovers_with_no_duplicate(
    failpoint, sandbox, agent, queue, tmp_path
):
    effect_ids = submit(agent, 4, failpoint)
    started = time.monotonic()
    run = crash.run(
        effect_ids=effect_ids,
        queue=queue,
        logs=tmp_path,
        failpoints=f"{failpoint}=2",
        failpoint_dir=tmp_path / "failpoints",
        timeout=90,
    )
    report = crash.check(
        effect_ids, sandbox, kills=run.kills, seconds=time.monotonic() - started, faults=Counter()
    )
    # Only the failpoint's own kills count; a worker that died by itself is a bug to see.
    assert run.kills == 2, report.lines()
    assert run.unexpected_exits == 0, (run.exits, run.log)
    assert report.duplicates == []
    assert report.lost == []
    assert report.stuck == []
    # Every crash point recovers to CONFIRMED: nothing here needs a human.
    assert report.statuses == Counter({"CONFIRMED": 4}), report.lines()
    assert len(sandbox.operations()) == 4


def test_kills_and_provider_faults_together(sandbox, agent, queue, tmp_path):
    sandbox.add_fault("commit_then_drop", times=2)
    sandbox.add_fault("fail_before_commit", times=2)
    sandbox.add_fault("processing", times=2, lookups=2)
    effect_ids = submit(agent, 10, "mixed")
    started = time.monotonic()
    run = crash.run(
        effect_ids=effect_ids,
        queue=queue,
        logs=tmp_path,
        failpoints="dispatch.after_claim=1,dispatch.after_call=1,dispatch.after_record=1",
        failpoint_dir=tmp_path / "failpoints",
        timeout=120,
    )
    report = crash.check(
        effect_ids,
        sandbox,
        kills=run.kills,
        seconds=time.monotonic() - started,
        faults=Counter(entry.get("fault") for entry in sandbox.log() if entry.get("fault")),
    )
    assert run.kills == 3 and run.unexpected_exits == 0, (run.exits, run.log)
    assert report.duplicates == [] and report.lost == [] and report.stuck == [], report.lines()
    assert report.statuses == Counter({"CONFIRMED": 10}), report.lines()
    assert len(sandbox.operations()) == 10
