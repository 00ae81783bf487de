"""The crash checker: run effects through real worker and beat processes while workers are
SIGKILLed at failpoints and the sandbox injects faults, let the system recover by itself, then
compare the sandbox's operation log (the oracle) with the ledger."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from django.db import connection

from gateway.choices import SETTLED
from gateway.lib.failpoints import parse as parse_failpoints
from gateway.models import Effect
from gateway.providers.sandbox import SandboxProvider
from reconciliation.models import Case
from tests.support.processes import Celery

# Fast clocks for the children, so recovery takes seconds instead of minutes.
RECOVERY_ENV = {
    "GATEWAY_DISPATCH_LEASE": "4",
    "GATEWAY_PROVIDER_TIMEOUT": "1.5",
    "GATEWAY_RECONCILE_INTERVAL": "1",
    "GATEWAY_RECONCILE_BACKOFF": "0.5",
    "GATEWAY_SWEEP_INTERVAL": "1",
    "GATEWAY_REDELIVER_AFTER": "3",
}


@dataclass
class Report:
    effects: int
    kills: int
    faults: Counter = field(default_factory=Counter)
    statuses: Counter = field(default_factory=Counter)
    duplicates: list[str] = field(default_factory=list)  # keys executed more than once
    lost: list[str] = field(default_factory=list)  # ledger and provider disagree
    stuck: list[str] = field(default_factory=list)  # neither settled nor with a human
    human_queue: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def lines(self) -> list[str]:
        return [
            f"effects: {self.effects}",
            f"workers killed at failpoints: {self.kills}",
            f"sandbox faults injected: {sum(self.faults.values())} {dict(self.faults)}",
            f"final statuses: {dict(self.statuses)}",
            f"in the human queue: {len(self.human_queue)}",
            f"keys executed more than once at the provider: {len(self.duplicates)}",
            f"lost (ledger and provider disagree): {len(self.lost)}",
            f"stuck (not settled, no human): {len(self.stuck)}",
            f"recovered in {self.seconds:.1f}s",
        ]


def _settled_or_queued(effect_ids: list[str]) -> bool:
    connection.close()
    open_ids = set(
        Effect.objects.filter(pk__in=effect_ids)
        .exclude(status__in=SETTLED)
        .exclude(escalated=True)
        .exclude(mismatch=True)
        .values_list("pk", flat=True)
    )
    return not open_ids


def failpoint_kills(failpoints: str, failpoint_dir: Path) -> int:
    """The kills the failpoints made: each reach writes one byte to the point's tally file
    and kills the process while the tally is within the point's budget."""
    kills = 0
    for name, (times, skip) in parse_failpoints(failpoints).items():
        tally = failpoint_dir / name
        reached = tally.stat().st_size if tally.exists() else 0
        kills += min(max(0, reached - skip), times)
    return kills


@dataclass
class Run:
    kills: int  # the failpoints' own kills, from their tally files
    exits: list[int]  # exit code of every worker that stopped while it should have run
    log: str

    @property
    def unexpected_exits(self) -> int:
        """Worker deaths the failpoints did not cause (a crash of the worker itself)."""
        return len(self.exits) - self.kills


class Supervisor:
    """One beat and one worker (restarted whenever it dies) on `queue`. ``tick()`` restarts a
    dead worker; ``sigkill_worker()`` kills it now, from outside, and counts that kill apart
    from the failpoints' so a worker that died by itself still shows."""

    def __init__(
        self, *, queue: str, logs: Path, failpoints: str, failpoint_dir: Path, pool: str = "solo"
    ) -> None:
        self.queue = queue
        self.logs = logs
        self.pool = pool
        self.failpoints = failpoints
        self.failpoint_dir = failpoint_dir
        self.env = {
            **RECOVERY_ENV,
            "GATEWAY_FAILPOINTS": failpoints,
            "GATEWAY_FAILPOINT_DIR": str(failpoint_dir),
        }
        self.exits: list[int] = []
        self.sigkills = 0
        self.beat = Celery("beat", queue, logs / "beat.log", **RECOVERY_ENV)
        self.worker = self._start_worker()

    def _start_worker(self) -> Celery:
        return Celery("worker", self.queue, self.logs / "worker.log", pool=self.pool, **self.env)

    def tick(self) -> None:
        code = self.worker.process.poll()
        if code is not None:
            self.exits.append(code)
            self.worker.handle.close()
            self.worker = self._start_worker()

    def sigkill_worker(self) -> None:
        self.tick()  # a worker that already died is not ours to count
        self.sigkills += 1
        self.worker.kill()
        self.exits.append(-9)
        self.worker = self._start_worker()

    def await_failpoint_exits(self, timeout: float = 15.0) -> None:
        """A failpoint writes its tally byte just before the SIGKILL, and a kill after the
        last record may land after the ledger already reads settled: wait until every
        counted kill has shown as an exit, so that the two counts compare like for like."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.tick()
            expected = failpoint_kills(self.failpoints, self.failpoint_dir) + self.sigkills
            if len(self.exits) >= expected:
                return
            time.sleep(0.05)

    def stop(self) -> None:
        self.worker.stop()
        self.beat.stop()

    def result(self) -> Run:
        return Run(
            kills=failpoint_kills(self.failpoints, self.failpoint_dir) + self.sigkills,
            exits=self.exits,
            log=(self.logs / "worker.log").read_text(errors="replace")[-3000:],
        )


def run(
    *,
    effect_ids: list[str],
    queue: str,
    logs: Path,
    failpoints: str,
    failpoint_dir: Path,
    timeout: float,
) -> Run:
    """Supervise one solo worker (restarted whenever it dies) and one beat until every
    effect is settled or handed to a human. Waits on the ledger's state, not on time."""
    supervisor = Supervisor(
        queue=queue, logs=logs, failpoints=failpoints, failpoint_dir=failpoint_dir
    )
    started = time.monotonic()
    try:
        while True:
            supervisor.tick()
            if _settled_or_queued(effect_ids):
                break
            if time.monotonic() - started > timeout:
                raise AssertionError(f"not recovered within {timeout}s; see {logs}")
            time.sleep(0.3)
        supervisor.await_failpoint_exits()
    finally:
        supervisor.stop()
    return supervisor.result()


def check(
    effect_ids: list[str], sandbox: SandboxProvider, *, kills: int, seconds: float, faults: Counter
) -> Report:
    connection.close()
    report = Report(effects=len(effect_ids), kills=kills, faults=faults, seconds=seconds)
    ops = Counter(op["idempotency_key"] for op in sandbox.operations())
    report.duplicates = sorted(key for key, count in ops.items() if count > 1)
    queued = set(Case.objects.filter(effect_id__in=effect_ids).values_list("effect_id", flat=True))
    for effect in Effect.objects.filter(pk__in=effect_ids).select_related("command"):
        report.statuses[effect.status] += 1
        executed = ops.get(effect.command.provider_key, 0)
        confirmed_but_not_executed = effect.status == "CONFIRMED" and executed != 1
        executed_but_not_confirmed = executed and effect.status in {
            "REJECTED",
            "EXPIRED",
            "CANCELLED",
            "NOT_STARTED",
        }
        if confirmed_but_not_executed or executed_but_not_confirmed:
            report.lost.append(effect.pk)
        if effect.escalated or effect.mismatch or effect.pk in queued:
            report.human_queue.append(effect.pk)
        elif effect.status not in SETTLED:
            report.stuck.append(effect.pk)
    return report
