"""The fault campaign (slow tier, `make test-slow`): EG_CAMPAIGN_EFFECTS commands (10,000 by
default) through the real stack while every fault kind below strikes several times at seeded
random moments; then the sandbox provider's own log (the oracle, tests.support.campaign) is
compared with the ledger and the audit chain is verified.

The kinds: the worker SIGKILLed at each dispatch failpoint (after the claim, after the
provider call, after the record) and at random moments; the beat SIGKILLed; two beats at
once; Redis stopped and started; Redis FLUSHALL (every queued message lost); PostgreSQL's
connections terminated (pg_terminate_backend); PostgreSQL restarted; the provider committing
then dropping the answer, answering a 5xx after committing, resetting the connection before
committing, failing before committing, answering slower than the timeout, staying
``processing`` then succeeding or failing, refusing with 429 and ``Retry-After``, and
answering lookups 503 for 60 s; a second web node and a second worker joining and leaving.

Commands go in over the HTTP API: in this process (DRF's test client, the real views) and,
while it is up, through the second web node (gunicorn); a submission that meets a database
that is down is retried with the same key, as an agent does. Execution is by real `celery
worker` and `celery beat` processes on fast clocks (tests.support.crash.RECOVERY_ENV).

It stops and starts servers, so it needs the run's own embedded PostgreSQL and Valkey
(DATABASE_URL unset) and one process (`-n 0`); elsewhere it skips, saying why.

    EG_CAMPAIGN_EFFECTS=1000 EG_CAMPAIGN_SEED=7 make test-slow PYTEST_ARGS="-k campaign"
"""

from __future__ import annotations

import io
import json
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from django.core.management import call_command
from django.db import connection
from rest_framework.test import APIClient

from gateway.lib import broker
from gateway.lib.failpoints import parse as parse_failpoints
from tests.support import crash
from tests.support.campaign import WebNode, judge, wait_for
from tests.support.processes import Celery, free_port

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker, pytest.mark.slow]

EFFECTS = int(os.environ.get("EG_CAMPAIGN_EFFECTS", "10000"))
SEED = int(os.environ.get("EG_CAMPAIGN_SEED") or random.randrange(1_000_000))
# How many times each kind strikes: several, more on a larger run.
TIMES = int(os.environ.get("EG_CAMPAIGN_TIMES") or max(3, EFFECTS // 2500))
LOOKUP_OUTAGE = float(os.environ.get("EG_CAMPAIGN_LOOKUP_OUTAGE", "60"))
SUBMITTERS = int(os.environ.get("EG_CAMPAIGN_SUBMITTERS", "4"))  # agents submitting at once
SETTLE_TIMEOUT = float(os.environ.get("EG_CAMPAIGN_SETTLE_TIMEOUT", "900"))
LOOKUPS_503 = f"lookups 503 for {LOOKUP_OUTAGE:g} s"
FAILPOINTS = ("dispatch.after_claim", "dispatch.after_call", "dispatch.after_record")
FIX = "the fault campaign restarts the embedded servers"

SANDBOX_KINDS: dict[str, tuple[str, dict]] = {
    "provider commit then drop": ("commit_then_drop", {}),
    "provider 5xx after commit": ("error_after_commit", {"status": 502}),
    "provider reset before commit": ("reset_before_commit", {}),
    "provider fail before commit": ("fail_before_commit", {}),
    "provider slower than the timeout": ("slow", {"seconds": 3}),  # the timeout is 1.5 s
    "provider processing then succeeded": ("processing", {"lookups": 2, "then": "succeeded"}),
    "provider processing then failed": ("processing", {"lookups": 2, "then": "failed"}),
    "provider 429 with Retry-After": ("throttle", {"retry_after": 1}),
}
KINDS = (
    "worker SIGKILL",
    "beat SIGKILL",
    "two beats",
    "Redis stop/start",
    "Redis FLUSHALL",
    "PostgreSQL connections terminated",
    "PostgreSQL restarted",
    LOOKUPS_503,
    "second web node",
    "second worker",
    *SANDBOX_KINDS,
)


@dataclass
class Life:
    """One life of a worker: its process and the failpoints armed in it."""

    worker: Celery
    spec: str
    folder: Path


class Campaign:
    """The run's moving parts: the seeded schedule, the supervised worker and beat, the
    processes that join and leave, the servers it stops and starts, and the tally."""

    def __init__(self, servers, sandbox, agent, queue: str, logs: Path) -> None:
        self.rng = random.Random(SEED)
        self.servers, self.sandbox, self.agent = servers, sandbox, agent
        self.queue, self.logs = queue, logs
        self.tally: Counter[str] = Counter()
        self.events: list[str] = []
        self.effect_ids: list[str] = []
        self.refused: Counter[int] = Counter()  # submissions answered neither 200 nor 201
        self.lock = threading.Lock()
        self.failed = threading.Event()  # a submitter failed: the others stop
        self.pending: list[tuple[float, str, Callable[[], None]]] = []
        self.redis_down = False
        self.unexpected_exits = 0
        self.failpoint_left = dict.fromkeys(FAILPOINTS, TIMES)
        self.beat = self._beat("beat")
        # Two workers for the whole run, as a deployment has several: while one restarts after
        # a kill (40-60 s under a load of 15), the other carries the load.
        self.lives = 0
        self.workers = [self._worker(slot) for slot in range(2)]
        self.second_beat: Celery | None = None
        self.second_worker: Celery | None = None
        self.web: WebNode | None = None
        self.web_ready = False
        self.started = time.monotonic()
        span = range(int(0.02 * EFFECTS), max(int(0.95 * EFFECTS), int(0.02 * EFFECTS) + TIMES))
        self.schedule = sorted(
            (index, kind) for kind in KINDS for index in self.rng.sample(span, TIMES)
        )

    # -- processes ---------------------------------------------------------------------------

    def _beat(self, name: str) -> Celery:
        return Celery("beat", self.queue, self.logs / f"{name}.log", **crash.RECOVERY_ENV)

    def _worker(self, slot: int) -> Life:
        """Worker ``slot``, each failpoint that has kills left armed at a random reach."""
        self.lives += 1
        # A drainer reaches each point once per batch it claims: a few kills per point over
        # the run, at a random reach of each worker's life.
        span = max(3, EFFECTS // (10 * TIMES))
        spec = ",".join(
            f"{name}=1@{self.rng.randrange(span)}"
            for name, left in self.failpoint_left.items()
            if left > 0
        )
        folder = self.logs / "failpoints" / str(self.lives)
        env = {
            **crash.RECOVERY_ENV,
            "GATEWAY_FAILPOINTS": spec,
            "GATEWAY_FAILPOINT_DIR": str(folder),
        }
        log = self.logs / f"worker{slot}.log"
        return Life(Celery("worker", self.queue, log, pool="threads", **env), spec, folder)

    def _replace_worker(self, slot: int, *, killed_by_us: bool) -> None:
        life = self.workers[slot]
        fired = [
            name
            for name, (_, skip) in parse_failpoints(life.spec).items()
            if (life.folder / name).exists() and (life.folder / name).stat().st_size > skip
        ]
        for name in fired:
            self.failpoint_left[name] -= 1
            self.tally[f"worker SIGKILL at {name}"] += 1
        if not fired and not killed_by_us:
            self.unexpected_exits += 1
            self.events.append(f"worker {slot} died by itself ({life.worker.process.returncode})")
        life.worker.handle.close()
        self.workers[slot] = self._worker(slot)

    def tick(self) -> None:
        """Restart what died, and run the restorations that are due."""
        for slot, life in enumerate(self.workers):
            if life.worker.process.poll() is not None:
                self._replace_worker(slot, killed_by_us=False)
        if self.beat.process.poll() is not None and not any(
            what == "beat back" for _, what, _ in self.pending
        ):
            self.beat.handle.close()
            self.beat = self._beat("beat")
        now = time.monotonic()
        due = [entry for entry in self.pending if entry[0] <= now]
        self.pending = [entry for entry in self.pending if entry[0] > now]
        for _, _, action in due:
            action()
        if self.web is not None and not self.web_ready:
            self.web_ready = self.web.ready()

    def later(self, seconds: float, what: str, action: Callable[[], None]) -> None:
        self.pending.append((time.monotonic() + seconds, what, action))

    def stop(self) -> None:
        workers = [life.worker for life in self.workers]
        for process in (*workers, self.beat, self.second_worker, self.second_beat):
            if process is not None:
                process.stop()
        if self.web is not None:
            self.web.stop()

    # -- the faults ----------------------------------------------------------------------------

    def strike(self, kind: str, index: int) -> bool:
        """Make one fault of ``kind``; False when it cannot be made now (the same kind still
        under way): the schedule moves it a little later."""
        if kind in SANDBOX_KINDS:
            fault, params = SANDBOX_KINDS[kind]
            self.sandbox.add_fault(fault, times=self.rng.randint(2, 6), **params)
        elif kind == LOOKUPS_503:
            self.sandbox.add_fault(
                "lookup_unavailable", times=None, window=LOOKUP_OUTAGE, retry_after=5
            )
        elif kind == "worker SIGKILL":
            slot = self.rng.randrange(len(self.workers))
            self.workers[slot].worker.kill()
            self._replace_worker(slot, killed_by_us=True)
        elif kind == "beat SIGKILL":
            if any(what == "beat back" for _, what, _ in self.pending):
                return False
            self.beat.kill()
            self.later(self.rng.uniform(0.5, 3), "beat back", self._beat_back)
        elif kind in ("Redis stop/start", "Redis FLUSHALL") and self.redis_down:
            return False
        elif kind == "Redis stop/start":
            self.servers.valkey.stop()
            self.redis_down = True
            self.later(self.rng.uniform(2, 8), "Redis back", self._redis_back)
        elif kind == "Redis FLUSHALL":
            client = redis.Redis.from_url(broker.url(), socket_timeout=5)
            client.flushall()
            client.close()
        elif kind == "PostgreSQL connections terminated":
            self._terminate_connections()
        elif kind == "PostgreSQL restarted":
            self._restart_postgres()
        elif kind in ("two beats", "second worker", "second web node"):
            return self._join(kind)
        self.tally[kind] += 1
        self.events.append(f"{time.monotonic() - self.started:.0f}s #{index}: {kind}")
        return True

    def _beat_back(self) -> None:
        self.beat.handle.close()
        self.beat = self._beat("beat")

    def _redis_back(self) -> None:
        self.servers.valkey.start(fix=FIX)
        self.redis_down = False

    def _terminate_connections(self) -> None:
        connection.close()
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            self.tally["PostgreSQL backends terminated"] += cursor.fetchone()[0]
        connection.close()

    def _restart_postgres(self) -> None:
        connection.close()
        self.servers.postgres.stop()
        down = time.monotonic()
        while time.monotonic() - down < self.rng.uniform(1, 4):
            time.sleep(0.2)
        self.servers.postgres.start(fix=FIX)

    def _join(self, kind: str) -> bool:
        """A second beat, worker or web node joins; it leaves 10-40 s later, gracefully or
        by SIGKILL."""
        stay = self.rng.uniform(10, 40)
        how = self.rng.choice([signal.SIGTERM, signal.SIGKILL])
        if kind == "two beats":
            if self.second_beat is not None:
                return False
            self.second_beat = self._beat("beat2")
        elif kind == "second worker":
            if self.second_worker is not None:
                return False
            self.second_worker = Celery(
                "worker",
                self.queue,
                self.logs / "worker2.log",
                pool="threads",
                **crash.RECOVERY_ENV,
            )
        else:
            if self.web is not None:
                return False
            self.web = WebNode(free_port(), self.logs / "web2.log", GATEWAY_TASK_QUEUE=self.queue)
            self.web_ready = False
        self.tally[kind] += 1
        self.events.append(f"{time.monotonic() - self.started:.0f}s: {kind} joins for {stay:.0f}s")
        self.later(stay, f"{kind} leaves", lambda: self._leave(kind, how))
        return True

    def _leave(self, kind: str, how: int) -> None:
        if kind == "two beats" and self.second_beat is not None:
            self.second_beat.stop(how)
            self.second_beat = None
        elif kind == "second worker" and self.second_worker is not None:
            self.second_worker.stop(how)
            self.second_worker = None
        elif self.web is not None:
            self.web.stop(how)
            self.web, self.web_ready = None, False
        self.tally[f"{kind} left ({signal.Signals(how).name})"] += 1

    # -- the load ----------------------------------------------------------------------------

    def _submitter(self, number: int, indexes: Iterator[int]) -> None:
        """One of SUBMITTERS threads, each an agent's client: the next index until none is
        left. The first sends every other command through the second web node while it is
        up."""
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.agent.token}")
        try:
            for index in indexes:
                if self.failed.is_set():
                    return
                self.submit(index, client, web=number == 0)
        except BaseException:
            self.failed.set()
            raise
        finally:
            connection.close()

    def submit(self, index: int, client: APIClient, *, web: bool) -> None:
        """One command, retried with the same key until it is answered 201 or 200."""
        key = f"campaign-{SEED}-{index}"
        body = {
            "type": "ticket.create",
            "resource": {"type": "queue", "id": "campaign"},
            "payload": {"title": f"campaign {index}", "priority": ("P2", "P3")[index % 2]},
        }
        for _ in range(2400):
            status, answer = self._post(client, key, body, web=web and index % 2 == 1)
            if status in (200, 201):
                self.effect_ids.append(answer["effect_id"])
                return
            assert status == 0 or status >= 500, (index, status, answer)
            with self.lock:
                self.refused[status] += 1
            time.sleep(0.25)
        raise AssertionError(f"submission {index} never accepted (seed {SEED}): {self.refused}")

    def _post(self, client: APIClient, key: str, body: dict, *, web: bool) -> tuple[int, dict]:
        node = self.web
        if web and node is not None and self.web_ready:
            status, raw = node.submit(self.agent.token, key, json.dumps(body).encode())
            if status in (200, 201):
                with self.lock:
                    self.tally["submitted through the second web node"] += 1
            return status, json.loads(raw) if status in (200, 201) else {}
        try:
            response = client.post(
                "/api/v1/commands", body, format="json", HTTP_IDEMPOTENCY_KEY=key
            )
        except Exception as error:  # the database went away under this request
            connection.close()
            return 0, {"error": repr(error)}
        if response.status_code >= 500:
            # A 503 for a database that went away: the test client skips Django's end-of-request
            # close of a broken connection, which a web server's request does.
            connection.close()
            return response.status_code, {}
        return response.status_code, response.json()

    def run(self) -> None:
        """Submit every command from SUBMITTERS threads while this thread strikes each
        scheduled fault once that many commands are accepted; then wait until every effect
        settled or is with a human."""
        schedule = list(self.schedule)
        indexes = iter(range(EFFECTS))  # shared: next() on a range iterator is atomic
        with ThreadPoolExecutor(SUBMITTERS) as pool:
            submitters = [pool.submit(self._submitter, n, indexes) for n in range(SUBMITTERS)]
            while not all(future.done() for future in submitters) or schedule:
                self.tick()
                accepted = len(self.effect_ids)
                done = all(future.done() for future in submitters)
                while schedule and (schedule[0][0] <= accepted or done):
                    _, kind = schedule.pop(0)
                    if not self.strike(kind, accepted):
                        # Still under way (the same kind): a little later.
                        later = accepted + self.rng.randint(5, max(6, EFFECTS // 50))
                        schedule.append((later, kind))
                        schedule.sort()
                        if done:
                            break
                time.sleep(0.1 if not done else 1)
            for future in submitters:
                future.result()  # a submitter's failure fails the run
        self.events.append(f"{EFFECTS} accepted after {time.monotonic() - self.started:.0f}s")
        self.settle()

    def settle(self) -> None:
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while self.pending or not crash._settled_or_queued(self.effect_ids):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"not settled within {SETTLE_TIMEOUT}s (seed {SEED}): {self.events[-20:]}; "
                    f"logs in {self.logs}"
                )
            self.tick()
            time.sleep(0.5)
        self.events.append(f"settled after {time.monotonic() - self.started:.0f}s")


@pytest.mark.timeout(int(os.environ.get("EG_CAMPAIGN_TEST_TIMEOUT", "2400")))
def test_fault_campaign(servers, sandbox, agent, queue, tmp_path, capsys):
    campaign = Campaign(servers, sandbox, agent, queue, tmp_path)
    try:
        for worker in [life.worker for life in campaign.workers]:
            wait_for(lambda worker=worker: " ready." in worker.output(), timeout=180)
        campaign.run()
    finally:
        campaign.stop()
    verdict = judge(campaign.effect_ids, sandbox)
    faults = Counter(entry["fault"] for entry in sandbox.log() if entry.get("fault"))
    audit = io.StringIO()
    call_command("verify_audit", stdout=audit)  # raises CommandError on a broken chain
    load = os.getloadavg()
    summary = [
        f"seed: {SEED}; {EFFECTS} commands, each fault kind {TIMES} times",
        f"elapsed: {time.monotonic() - campaign.started:.0f} s; "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        *verdict.lines(),
        f"submissions refused and retried: {sum(campaign.refused.values())} "
        f"{dict(campaign.refused)}",
        "faults made: " + ", ".join(f"{k} {v}" for k, v in sorted(campaign.tally.items())),
        "sandbox faults applied: " + ", ".join(f"{k} {v}" for k, v in sorted(faults.items())),
        f"sandbox rules left: {[(rule['fault'], rule['times']) for rule in sandbox.faults()]}",
        f"worker deaths not caused by the run: {campaign.unexpected_exits}",
        f"verify_audit: {audit.getvalue().strip().splitlines()[-1]}",
        "timeline: " + "; ".join(campaign.events),
    ]
    with capsys.disabled():  # the table shows without -s
        print("\nfault campaign:\n  " + "\n  ".join(summary))
    assert len(verdict.duplicates) == 0, summary
    assert len(verdict.lost) == 0, summary
    assert len(verdict.disagreeing) == 0, summary
    assert len(verdict.stuck) == 0, summary
    assert len(verdict.blind) == 0, (summary, verdict.blind[:10])
    assert len(campaign.effect_ids) == len(set(campaign.effect_ids)) == EFFECTS
    assert campaign.unexpected_exits == 0, summary
    assert "BROKEN" not in audit.getvalue(), summary
    for kind in KINDS:
        assert campaign.tally[kind] >= min(2, TIMES), (kind, summary)
    for name in FAILPOINTS:
        assert campaign.tally[f"worker SIGKILL at {name}"] >= 1, (name, summary)
