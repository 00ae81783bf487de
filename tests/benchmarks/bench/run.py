"""One bench run, in the bench's process (Django set up by ``__main__``): the set-up, the
interleaved passes, the replay, the in-process count of round trips and what is printed
(tests.benchmarks.bench says what each pass is)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from io import StringIO
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from gateway.choices import SETTLED, EffectStatus
from gateway.models import Effect, EffectEvent
from gateway.providers.sandbox import SandboxProvider, SandboxServer
from tests.benchmarks.bench import client as bench_client
from tests.benchmarks.bench import faults, report, targets
from tests.benchmarks.bench.autovacuum import AutovacuumStandIn
from tests.benchmarks.bench.machine import CpuGroups
from tests.benchmarks.bench.options import BenchError
from tests.benchmarks.bench.stack import ROOT, Stack, free_port
from tests.benchmarks.bench.stats import offered_rate, pass_size, percentile, slowest_during

PROVIDERS = ("billing", "inventory", "shipping", "deploy", "tickets", "mail", "verify")
BODY = {
    "type": "ticket.create",
    "resource": {"type": "queue", "id": "bench"},
    "intent": {"summary": "benchmark"},
}


def run_process(module: str, arguments: dict, what: str) -> dict:
    """``python -m module`` with its arguments and its result as JSON (the floor, the client)."""
    done = subprocess.run(
        [sys.executable, "-m", module, json.dumps(arguments)],
        cwd=ROOT,
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        raise BenchError(f"{what} failed: {done.stderr.decode()[-2000:]}")
    return json.loads(done.stdout)


def libpq_dsn(db: Mapping[str, Any]) -> str:
    """Django's database settings as a libpq connection string (the floor's, the oracle's)."""
    return (
        f"host={db['HOST'] or '127.0.0.1'} port={db['PORT'] or 5432} "
        f"dbname={db['NAME']} user={db['USER']}"
        + (f" password={db['PASSWORD']}" if db.get("PASSWORD") else "")
    )


class Bench:
    """The product against its floor, side by side: set up, measure, print."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options
        # What the verdicts at the end read (targets): filled as the tables are printed.
        self.lines: dict[int, targets.Line] = {}
        self.paced_p99: dict[int, float] = {}
        self.replay_p50 = float("nan")
        self.counted: tuple[int, int] | None = None
        self.autovacuum: AutovacuumStandIn | None = None
        self.autovacuum_mode = ""
        self.stack = Stack(options, settings.VAR_DIR / "bench")

    def say(self, *lines: str) -> None:
        for line in lines:
            print(line, flush=True)

    def run(self) -> None:
        if connection.vendor != "postgresql":
            raise BenchError("the benchmark compares against PostgreSQL: set DATABASE_URL")
        # One line per request from the HTTP client would cost the floor more than its work.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        rounds = 1 if self.options["quick"] else self.options["rounds"]
        tokens = self._set_up()
        try:
            try:
                self.stack.start(self.run_id, self.ports, self.urls)
                self._measure(rounds, tokens)
                if not self.options["no_fault_pass"]:
                    self.say(*faults.fault_pass(self, tokens))
            finally:
                self._stop()
            self._round_trips(tokens[0], self.run_id)
        finally:
            self.sandbox.stop()
        self._verdicts()

    # -- set-up ----------------------------------------------------------------------------

    def _set_up(self) -> list[str]:
        """The database, the agents and their tokens, the sandbox provider, the ports; returns
        the tokens, one per tenant."""
        options = self.options
        call_command("migrate", interactive=False, verbosity=0)
        if options["ledger"]:
            self._preload(options["ledger"])
        self.run_id = run = uuid.uuid4().hex[:8]
        tenants = [f"bench{n}" if n else "bench" for n in range(options["tenants"])]
        tokens = [self._token(tenant, run) for tenant in tenants]
        if options["webhook_endpoint"]:
            for tenant in tenants:
                self._endpoint(tenant, run)
        base_port = options["port"]
        provider_port = base_port + 9 if base_port else 0
        self.sandbox = SandboxServer(SandboxProvider(), port=provider_port).start()
        self.urls = {name: self.sandbox.base_url(name) for name in PROVIDERS}
        self.dsn = libpq_dsn(settings.DATABASES["default"])
        self.floor_args = {"dsn": self.dsn, "pool_size": options["floor_pool"],
                           "url": self.urls["tickets"]}  # fmt: skip
        self.ports = [
            base_port + node if base_port else free_port() for node in range(options["web_nodes"])
        ]
        self.bases = [f"http://127.0.0.1:{port}" for port in self.ports]
        return tokens

    def _preload(self, effects: int) -> None:
        """A settled history of ``effects`` effects (``--ledger``), written in bulk as the
        gateway leaves it, without the open queue (the reconciler's work in an incident, not
        in the steady state measured here)."""
        from tests.benchmarks import ledger_load

        if Effect.objects.exists():
            raise BenchError("--ledger loads into a fresh database: this one has effects")
        started = time.perf_counter()
        ledger_load.create_principals()
        ledger_load.load(effects=effects, open_queue=False, say=lambda line: None)
        ledger_load.count_tallies()  # or the first tally pass counts it during the passes
        self.say(
            f"ledger: {effects:,} settled effects loaded ({time.perf_counter() - started:.0f} s)"
        )

    def _token(self, tenant: str, run: str) -> str:
        out = StringIO()
        grant = {}
        if self.options["budget_count"]:
            grant = {"types": "*", "budget_count": self.options["budget_count"]}
        call_command(
            "issue_token",
            tenant=tenant,
            principal=f"bench-{run}",
            role="agent",
            stdout=out,
            **grant,
        )
        return out.getvalue().strip().splitlines()[-1]

    def _endpoint(self, tenant: str, run: str) -> None:
        """An enabled endpoint of ``tenant`` that hears of nothing the run does."""
        from gateway.models import Principal
        from gateway.webhooks.choices import EventType
        from gateway.webhooks.services import endpoint_create

        call_command(
            "issue_token", tenant=tenant, principal=f"ops-{run}", role="operator", stdout=StringIO()
        )
        operator = Principal.objects.get(tenant__slug=tenant, name=f"ops-{run}")
        endpoint_create(
            principal=operator,
            url="http://127.0.0.1:9/never",
            event_types=[EventType.COMPENSATION_FAILED],
            description="bench: an endpoint the run never calls",
        )

    def _autovacuum(self) -> AutovacuumStandIn | None:
        """The stand-in for autovacuum (tests.benchmarks.bench), on a server that does not
        run it."""
        with connection.cursor() as cursor:
            cursor.execute("SHOW autovacuum")
            running = cursor.fetchone()[0] == "on"
        if running or self.options["no_autovacuum"]:
            self.autovacuum_mode = "the server's" if running else "none"
            return None
        self.autovacuum_mode = "a stand-in during the product's passes"
        return AutovacuumStandIn(self.dsn).start()

    def _warm(self, token: str) -> None:
        """A few effects first: imports, connections and pools are not what is measured."""
        self._product_pass(2, 6, [token], f"warm:{self.run_id}")
        self._floor_pass(2, 6, f"floorwarm:{self.run_id}", client="httpx")

    def _stop(self) -> None:
        self.stack.stop()
        if self.autovacuum is not None:
            self.autovacuum.stop()
            self.say(
                f"autovacuum stand-in: {len(self.autovacuum.runs)} ANALYZE/VACUUM during "
                "the product's passes"
            )

    # -- the passes ------------------------------------------------------------------------

    def _measure(self, rounds: int, tokens: list[str]) -> None:
        """Every concurrency's rounds (and paced pass), the replay, the tables."""
        # Inside the caller's try: a stand-in that cannot connect still stops the children.
        self.autovacuum = self._autovacuum()
        self.stack.wait_ready(self.bases)
        self.say(report.header(self.options, self.run_id, rounds, self.autovacuum_mode))
        self._warm(tokens[0])
        results: dict[int, list[dict]] = {}
        paced: dict[int, dict] = {}
        levels = self.options["concurrency"]
        for c in levels:
            results[c], paced_pass = self._level(c, rounds, tokens)
            if paced_pass is not None:
                paced[c] = paced_pass
        first = results[levels[0]][0]["product"]["n"]
        replay = self._replay(tokens, f"bench:{self.run_id}:{levels[0]}:0", min(25, first))
        lines, self.lines = report.summary_table(results, replay)
        self.replay_p50 = percentile(replay, 50) * 1000
        self.say(*lines)
        if paced:
            lines, self.paced_p99 = report.paced_table(paced)
            self.say(*lines)

    def _level(self, c: int, rounds: int, tokens: list[str]) -> tuple[list[dict], dict | None]:
        """At concurrency ``c``: each round's floor, strict floor and product passes, one
        after the other; then the paced pass, if asked for."""
        options, run = self.options, self.run_id
        n = pass_size(c, options["effects"], options["quick"])
        rows: list[dict[str, Any]] = []
        for r in range(rounds):
            self._vacuum()
            floor = self._floor_pass(c, n, f"floor:{run}:{c}:{r}", client="httpx")
            strict = None
            if not options["no_strict_floor"]:
                strict = self._floor_pass(c, n, f"strict:{run}:{c}:{r}", client="stdlib")
            product = self._product_pass(c, n, tokens, f"bench:{run}:{c}:{r}")
            rows.append({"floor": floor, "strict": strict, "product": product})
            self.say(*report.round_lines(c, r, rows[-1]))
        rate = offered_rate(
            options["paced"], options["paced_rate"], [row["product"]["rate"] for row in rows]
        )
        if rate <= 0:
            return rows, None
        self._vacuum()
        paced = self._product_pass(c, n, tokens, f"paced:{run}:{c}", rate=rate)
        self.say(*report.paced_lines(c, paced, stand_in=self.autovacuum is not None))
        return rows, paced

    def _vacuum(self) -> None:
        """What autovacuum does in production, between rounds and outside the timed passes: a
        development server may run without it, and the dead rows of earlier passes (every
        effect is updated at claim and at record) would otherwise tax later ones."""
        with connection.cursor() as cursor:
            cursor.execute("VACUUM (ANALYZE)")

    def _pids(self) -> dict[str, list[int]]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()"
            )
            backends = [pid for (pid,) in cursor.fetchall()]
        # This process: the sandbox provider's threads, and the ledger polled for the end.
        return {**self.stack.pids(), "pg": backends, "bench": [os.getpid()]}

    def _commits(self) -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            )
            return int(cursor.fetchone()[0])

    def _floor_pass(self, c: int, n: int, prefix: str, *, client: str) -> dict:
        """One floor pass; ``client`` is its HTTP client for the provider call (the floor's
        module says why two)."""
        load = os.getloadavg()[0]
        arguments = {
            **self.floor_args, "concurrency": c, "count": n, "prefix": prefix, "client": client,
        }  # fmt: skip
        before = os.times()
        result = run_process("tests.benchmarks.bench.floor", arguments, "the floor")
        after = os.times()
        # This process's threads: the sandbox provider answering the floor (and its warm-up).
        spent = (after.user + after.system) - (before.user + before.system)
        result["cpu"]["bench"] = spent * 1000 / n
        result["load"] = max(load, os.getloadavg()[0])
        result["dups"] = self._duplicates(prefix)
        return result

    def _product_pass(
        self, c: int, n: int, tokens: list[str], prefix: str, *, rate: float = 0
    ) -> dict:
        """One product pass; ``rate`` > 0 offers the submissions at that rate (an open loop,
        tests.benchmarks.bench.client) instead of as fast as they are answered."""
        pids = self._pids()
        commits_before = self._commits()
        before, load = CpuGroups.take(pids), os.getloadavg()[0]
        if self.autovacuum is not None:
            self.autovacuum.resume()
        # The client in a process of its own, as the floor's is (tests.benchmarks.bench.client).
        arguments = {
            "bases": self.bases, "tokens": tokens, "body": BODY,
            "prefix": prefix, "concurrency": c, "count": n, "rate": rate,
            "loop": self.options["loop"], "dsn": self.dsn,
        }  # fmt: skip
        client = run_process("tests.benchmarks.bench.client", arguments, "the client")
        busy = list(self.autovacuum.spans) if self.autovacuum is not None else []
        ids: list[str] = client["ids"]
        self._await_settled(ids)
        if self.autovacuum is not None:
            self.autovacuum.pause()
        # Listed again: a backend or a worker child born during the pass counts from birth.
        cpu = CpuGroups.take(self._pids()).spent_since(before)
        commits = self._commits() - commits_before
        started_at = datetime.fromtimestamp(client["started_at"], tz=UTC)
        confirmed = self._confirmed(ids)
        last = max((done for _, done in confirmed), default=timezone.now())
        elapsed = max((last - started_at).total_seconds(), 1e-6)
        return {
            "n": n,
            "ok": len(confirmed),
            "wrong": client["wrong"],
            "rate": len(confirmed) / elapsed,
            "submit": client["submit"],
            "e2e": [(done - created).total_seconds() for created, done in confirmed],
            "cpu": {
                **{name: seconds * 1000 / n for name, seconds in cpu.items()},
                "client": client["cpu"] * 1000,
            },
            "commits": commits / n,
            "nodes": client["nodes"],
            "offered": rate,
            "late": client.get("late", 0),
            "tail": slowest_during([tuple(span) for span in client["spans"]], busy),
            "load": max(load, os.getloadavg()[0]),
            "dups": self._duplicates(prefix, ids=ids),
            "seal": self._seal_lag(ids),
        }

    def _await_settled(self, ids: list[str]) -> None:
        """Until every effect of the pass has settled, or ``--timeout`` seconds."""
        deadline = time.monotonic() + self.options["timeout"]
        while time.monotonic() < deadline:
            if not Effect.objects.filter(pk__in=ids).exclude(status__in=SETTLED).exists():
                return
            time.sleep(0.02)

    def _confirmed(self, ids: list[str]) -> list[tuple[datetime, datetime]]:
        """(created, confirmed) of each CONFIRMED effect among ``ids``."""
        rows = Effect.objects.filter(pk__in=ids).values_list("status", "created_at", "confirmed_at")
        return [
            (created, done)
            for status, created, done in rows
            if status == EffectStatus.CONFIRMED and done is not None
        ]

    def _duplicates(self, prefix: str, *, ids: list[str] | None = None) -> int:
        """Keys the provider executed more than once, plus CONFIRMED effects it never saw."""
        counts: dict[str, int] = {}
        for op in self.sandbox.provider.operations(provider="tickets"):
            key = op["idempotency_key"]
            if prefix in key:
                counts[key] = counts.get(key, 0) + 1
        extra = sum(count - 1 for count in counts.values() if count > 1)
        if ids is None:
            return extra
        ledger = Effect.objects.filter(pk__in=ids, status=EffectStatus.CONFIRMED).values_list(
            "command__provider_key", flat=True
        )
        return extra + sum(1 for key in ledger if key not in counts)

    def _seal_lag(self, ids: list[str]) -> list[float]:
        """Seconds from an event's creation to its seal, for this pass's events (sealed ones);
        waits up to 3 s for the sequencer to catch up."""
        from gateway.audit import seal_times

        events = dict(EffectEvent.objects.filter(effect_id__in=ids).values_list("pk", "created_at"))
        deadline = time.monotonic() + 3
        sealed = seal_times(list(events))
        while time.monotonic() < deadline and len(sealed) < len(events):
            time.sleep(0.1)
            sealed = seal_times(list(events))
        return [(at - events[pk]).total_seconds() for pk, at in sealed.items()]

    def _replay(self, tokens: list[str], prefix: str, keys: int, count: int = 200) -> list[float]:
        """``count`` replays at c=1, over the first ``keys`` keys of a pass, after a few that
        are not timed (25 samples made the p50 swing 2-4 ms between runs of the same code)."""
        latencies = []
        conn = bench_client.Connection(self.bases[0])  # the load generator's client (its doc)
        try:
            for attempt in range(count + 5):
                index = attempt % keys
                body = {**BODY, "payload": {"title": f"bench {index}", "priority": "P4"}}
                t0 = time.perf_counter()
                status, _ = bench_client.submit(
                    conn, tokens[index % len(tokens)], f"{prefix}:{index}", body
                )
                if attempt >= 5:
                    latencies.append(time.perf_counter() - t0)
                if status != 200:
                    raise BenchError(f"replay answered {status}, not 200")
        finally:
            conn.close()
        return latencies

    # -- in process ------------------------------------------------------------------------

    def _round_trips(self, token: str, run: str) -> None:
        """One submission (through the API view, in process) and one dispatch, counted; then
        a drainer's batch of ten (gateway.dispatcher), its window already open."""
        from django.test import Client

        from gateway import dispatcher, services
        from gateway.celery import app
        from tests.support.querycount import count_round_trips

        settings.GATEWAY_PROVIDER_URLS = self.urls
        client = Client(HTTP_HOST="127.0.0.1")

        def post(title: str, key: str) -> Any:
            return client.post(
                "/api/v1/commands",
                data=json.dumps({**BODY, "payload": {"title": title, "priority": "P4"}}),
                content_type="application/json",
                HTTP_AUTHORIZATION=f"Bearer {token}",
                HTTP_IDEMPOTENCY_KEY=key,
            )

        # The steady state: this process's first request fills the token and capability
        # caches (two reads and the token's last-use write), as a web worker's first does.
        post("warm", f"count:{run}:warm")
        with count_round_trips() as submitted:
            response = post("counted", f"count:{run}")
        with count_round_trips() as dispatched:
            services.effect_dispatch(effect_id=response.json()["effect_id"])
        for index in range(10):
            post(f"batch {index}", f"count:{run}:{index}")
        dispatcher._process_state()[1].size = settings.GATEWAY_DISPATCH_BATCH
        with count_round_trips() as batch:
            drained = dispatcher.drain(flag=None)
        with app.connection_for_write() as conn:  # the messages nobody consumes any more
            conn.default_channel.queue_purge(f"bench-{run}")  # type: ignore[attr-defined]
        self.counted = (
            submitted.round_trips + dispatched.round_trips,
            submitted.commits + dispatched.commits,
        )
        self.say(report.round_trips_line(submitted, dispatched, drained, batch))

    def _verdicts(self) -> None:
        """The targets against this run's figures (tests.benchmarks.bench.targets)."""
        round_trips, commits = self.counted or (None, None)
        rows = targets.verdicts(
            lines=self.lines,
            replay_p50_ms=self.replay_p50,
            paced_submit_p99_ms=self.paced_p99,
            ledger=self.options["ledger"],
            loop=self.options["loop"],
            round_trips=round_trips,
            commits=commits,
        )
        self.say("", *targets.table(rows))
