"""The fault run (slow tier, `make test-slow`): N commands through the real stack while the
worker is SIGKILLed at random moments and at failpoints, the broker is restarted, PostgreSQL
is down for several seconds and the sandbox provider injects faults; then the sandbox's
operation log (the oracle) is compared with the ledger and the audit chain is verified.

Commands go in over the HTTP API (DRF's test client: the real views, serializers and
services in this process), because that is where an agent's submission meets a broker that
is down; execution is by real `celery worker` and `celery beat` processes.

It stops and starts servers, so it needs the run's own embedded PostgreSQL and Valkey
(DATABASE_URL unset) and one process (`-n 0`); elsewhere it skips, saying why.

    EG_FAULT_RUN_COMMANDS=300 EG_FAULT_RUN_SEED=7 make test-slow
"""

from __future__ import annotations

import io
import json
import os
import random
import time
import urllib.request
from collections import Counter

import pytest
from django.core.management import call_command
from django.db import connection

from gateway.models import Effect
from tests.support import crash

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker, pytest.mark.slow]

COMMANDS = int(os.environ.get("EG_FAULT_RUN_COMMANDS", "300"))
SEED = int(os.environ.get("EG_FAULT_RUN_SEED") or random.randrange(1_000_000))
OUTAGE_SECONDS = float(os.environ.get("EG_FAULT_RUN_OUTAGE", "6"))
BROKER_OUTAGE_COMMANDS = 5  # submitted while the broker is down
# Everything must have settled by then; the whole test (submission included) stays under
# the timeout below, on two shared cores.
SETTLE_TIMEOUT = float(os.environ.get("EG_FAULT_RUN_TIMEOUT", "480"))
FAULTS_PER_KIND = max(2, COMMANDS // 30)
# Once PostgreSQL is back, confirmations must resume within this (a lease, a sweep, a
# reconnect); a worker that kept its dead connection stalled 85 s here.
RESUME_WITHIN = 30.0


def switch_fault(base_url: str, fault: str, **rule) -> None:
    """A fault switched on as an operator would: ``POST {base}/_faults``."""
    request = urllib.request.Request(
        f"{base_url}/_faults",
        data=json.dumps({"fault": fault, **rule}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status in (200, 201), response.read()


def confirmed(effect_ids: list[str]) -> int:
    connection.close()  # a fresh connection: the database may have restarted under us
    return Effect.objects.filter(pk__in=effect_ids, status="CONFIRMED").count()


class FaultRun:
    """The run's moving parts: the seeded choices, the supervised worker and beat, the
    servers it stops and starts, what happened (``events``) and the effects submitted."""

    fix = "the fault run restarts the embedded servers"

    def __init__(self, servers, agent, supervisor: crash.Supervisor) -> None:
        self.rng = random.Random(SEED)
        self.servers = servers
        self.agent = agent
        self.supervisor = supervisor
        self.events: list[str] = []
        self.effect_ids: list[str] = []
        self.resumed: float | None = None  # confirmations resumed this long after PostgreSQL

    def submit(self, index: int) -> None:
        body = {
            "type": "ticket.create",
            "resource": {"type": "queue", "id": "support"},
            "payload": {"title": f"fault run {index}", "priority": self.rng.choice(["P2", "P3"])},
        }
        response = self.agent.submit(body, f"fault-run-{index}")
        assert response.status_code == 201, (index, response.status_code, response.content)
        self.effect_ids.append(response.json()["effect_id"])

    def submit_all(self) -> None:
        """Submit COMMANDS, SIGKILLing the worker once and stopping the broker once."""
        first_kill_at = self.rng.randrange(COMMANDS // 6, COMMANDS // 3)
        broker_down_at = self.rng.randrange(COMMANDS // 2, 2 * COMMANDS // 3)
        started = time.monotonic()
        index = 0
        while index < COMMANDS:
            self.supervisor.tick()
            if index == first_kill_at:
                self.supervisor.sigkill_worker()
                self.events.append(f"SIGKILL worker at submission {index}")
            if index == broker_down_at:
                self.servers.valkey.stop()
                down = time.monotonic()
                # Submissions while the broker is down: committed, answered 201, sent later
                # by the sweeper (the ledger is the record).
                for _ in range(min(BROKER_OUTAGE_COMMANDS, COMMANDS - index)):
                    self.submit(index)
                    index += 1
                self.servers.valkey.start(fix=self.fix)
                self.events.append(
                    f"broker down {time.monotonic() - down:.1f}s from submission "
                    f"{broker_down_at} ({BROKER_OUTAGE_COMMANDS} submitted meanwhile)"
                )
                continue
            self.submit(index)
            index += 1
        self.events.append(f"{COMMANDS} submitted in {time.monotonic() - started:.0f}s")

    def postgres_outage(self, done: int) -> float:
        """Stop PostgreSQL for OUTAGE_SECONDS; the worker and beat keep running (and are
        restarted if they die) while the database is away. Returns when it was back."""
        connection.close()
        self.servers.postgres.stop()
        down = time.monotonic()
        while time.monotonic() - down < OUTAGE_SECONDS:
            self.supervisor.tick()
            time.sleep(0.2)
        self.servers.postgres.start(fix=self.fix)
        self.events.append(f"PostgreSQL down {time.monotonic() - down:.1f}s at {done} confirmed")
        return time.monotonic()

    def settle(self, logs) -> None:
        """Wait until every effect settled, with a PostgreSQL outage at 40 % confirmed and a
        second worker SIGKILL after 60 %: triggered by the ledger's progress, not the clock."""
        deadline = time.monotonic() + SETTLE_TIMEOUT
        outage_done = second_kill_done = False
        second_kill_after = self.rng.uniform(0, 2)
        second_kill_ready_at: float | None = None
        back = 0.0
        confirmed_when_back = 0
        while True:
            self.supervisor.tick()
            done = confirmed(self.effect_ids)
            if not outage_done and done >= 0.4 * COMMANDS:
                back, confirmed_when_back = self.postgres_outage(done), done
                outage_done = True
                continue
            if outage_done and self.resumed is None and done > confirmed_when_back:
                self.resumed = time.monotonic() - back
                self.events.append(
                    f"confirmations resumed {self.resumed:.1f}s after PostgreSQL was back"
                )
            if outage_done and not second_kill_done and done >= 0.6 * COMMANDS:
                second_kill_ready_at = second_kill_ready_at or time.monotonic()
                if time.monotonic() - second_kill_ready_at >= second_kill_after:
                    self.supervisor.sigkill_worker()
                    self.events.append(f"SIGKILL worker at {done} confirmed")
                    second_kill_done = True
            if second_kill_done and crash._settled_or_queued(self.effect_ids):
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"not settled within {SETTLE_TIMEOUT}s (seed {SEED}): {self.events}; "
                    f"{confirmed(self.effect_ids)} confirmed; logs in {logs}"
                )
            time.sleep(0.3)


@pytest.mark.timeout(SETTLE_TIMEOUT + 240)
def test_fault_run(servers, sandbox, sandbox_server, agent, queue, tmp_path, capsys):
    base = sandbox_server.base_url("tickets")
    for fault, extra in (
        ("commit_then_drop", {}),
        ("fail_before_commit", {}),
        ("slow", {"seconds": 3}),  # beyond the workers' 1.5 s provider timeout
        ("processing", {"lookups": 2}),
    ):
        switch_fault(base, fault, times=FAULTS_PER_KIND, **extra)
    failpoints = "dispatch.after_claim=1,dispatch.after_call=1,dispatch.after_record=1"
    supervisor = crash.Supervisor(
        queue=queue, logs=tmp_path, failpoints=failpoints, failpoint_dir=tmp_path / "failpoints"
    )
    fault_run = FaultRun(servers, agent, supervisor)
    started = time.monotonic()
    try:
        fault_run.submit_all()
        # Lookups unreachable for a while: the next reconciliations meet a provider that
        # cannot answer and must back off, not guess.
        switch_fault(base, "lookup_unreachable", times=FAULTS_PER_KIND * 2)
        fault_run.settle(tmp_path)
        supervisor.await_failpoint_exits()
    finally:
        supervisor.stop()
    run = supervisor.result()
    effect_ids = fault_run.effect_ids
    faults = Counter(entry.get("fault") for entry in sandbox.log() if entry.get("fault"))
    report = crash.check(
        effect_ids,
        sandbox,
        kills=run.kills - supervisor.sigkills,  # the failpoints' own; the SIGKILLs are events
        seconds=time.monotonic() - started,
        faults=faults,
    )
    audit = io.StringIO()
    call_command("verify_audit", stdout=audit)  # raises CommandError on a broken chain
    load = os.getloadavg()
    summary = [
        f"seed: {SEED}",
        *fault_run.events,
        *report.lines(),
        f"worker exits: {len(run.exits)} ({run.unexpected_exits} not caused by the run)",
        f"provider operations: {len(sandbox.operations())}",
        f"verify_audit: {audit.getvalue().strip()}",
        f"load average: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
    ]
    with capsys.disabled():  # the summary line shows without -s
        print("\nfault run:\n  " + "\n  ".join(summary))
    assert report.duplicates == [], summary
    assert report.lost == [], summary
    assert report.stuck == [], summary
    assert report.statuses == Counter({"CONFIRMED": COMMANDS}), summary
    assert len(sandbox.operations()) == COMMANDS, summary
    assert len(effect_ids) == len(set(effect_ids)) == COMMANDS
    # Two random SIGKILLs and the three failpoints'; a worker that died by itself is a bug.
    assert supervisor.sigkills == 2 and run.kills == 5, summary
    assert run.unexpected_exits == 0, (summary, run.log)
    # The workers reconnect by themselves: no stall until a reuse count runs out.
    assert fault_run.resumed is not None and fault_run.resumed < RESUME_WITHIN, summary
    assert "BROKEN" not in audit.getvalue(), summary
