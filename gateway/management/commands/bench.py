"""``manage.py bench``: the product against a raw PostgreSQL floor, side by side, in one run.

For each concurrency (1, 8, 32 by default) and each round, three passes run one after the other
against the same loopback sandbox provider (SPEC §6, in this process):

- **the floor**: raw psycopg on a small connection pool, per effect ``INSERT … ON CONFLICT``
  → ``POST /operations`` → ``UPDATE``: the least any ledger-before-call design can cost. It
  runs twice: with httpx to the provider (the issue's floor, the reference of its targets) and
  with the standard library's client, as the product's adapter (the strict floor; skipped with
  ``--no-strict-floor``; gateway.lib.benchfloor says why both);
- **the product**: the real HTTP API served by gunicorn, real Celery workers (a thread pool, with
  the beat embedded, so the sweeper and the audit sequencer run) on PostgreSQL + Redis, from
  ``POST /api/v1/commands`` to CONFIRMED in the ledger, submitted by a client process of its
  own (gateway.lib.benchclient), as the floor runs in its own.

Printed per concurrency (medians of the rounds): effects/s of each and the ratios, submit and
end-to-end p50/p99, CPU ms per effect per process group read from ``/proc`` (web = gunicorn,
worker = Celery, pg = the PostgreSQL backends serving them), commits per effect (from
``pg_stat_database``), duplicates (the sandbox's operation log against the ledger), the audit
sealing lag and the machine's load. Then a replay pass at c=1 and, in process, the statements,
transactions and round trips of one submission and one dispatch.

The machine is shared and noisy: floor and product alternate within each round so that both
see the same noise, and the load average is printed with every line. Each round starts with a
``VACUUM (ANALYZE)`` of the database, outside the timed passes: autovacuum's work in a real
deployment, which the shared development server does not run. For the same reason, on a server
without autovacuum a stand-in (gateway.lib.autovacuum) analyzes and vacuums the tables during
the product's passes at autovacuum's thresholds, on a connection whose CPU counts as the
product's PostgreSQL time (``--no-autovacuum`` leaves it out).

The product's closed loop (``--loop``): by default a client thread sends its next submission
once the last is answered, so ``c`` bounds the submissions in flight and the effects queue
behind them; the floor's threads each finish an effect before the next. ``--loop effect``
makes a client thread wait until its effect is CONFIRMED, so that ``c`` effects are in flight
on both sides (gateway.lib.benchclient.Oracle says how it learns of it); ``--loop api`` learns
of it as an agent does, through ``GET /api/v1/effects/{id}?wait=``, whose cost is then the
product's (and whose caps on open long polls answer 429 beyond a few per web process).

Autovacuum analyzes a table once a tenth of it has changed, so an empty ledger's growing tables
are analyzed about every second, and in the paced passes those analyses set the submissions'
tail (the paced line says how many of the slowest 1 % overlapped one). ``--ledger N`` first
loads a settled history of N effects (tests/benchmarks/ledger_load.py, its tallies counted),
so that the run measures a ledger the size of a deployment's, analyzed as rarely as one is.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.utils import timezone

from gateway.choices import SETTLED, EffectStatus
from gateway.lib import benchclient, benchtargets
from gateway.lib.autovacuum import AutovacuumStandIn
from gateway.models import Effect, EffectEvent
from gateway.providers.sandbox import SandboxProvider, SandboxServer

ROOT = Path(settings.BASE_DIR)
PROVIDERS = ("billing", "inventory", "shipping", "deploy", "tickets", "mail", "verify")
TICKS = os.sysconf("SC_CLK_TCK")
# What a client thread waits for before its next submission, per --loop.
WAITS_FOR = {
    "submission": "its answer",
    "effect": "its effect, CONFIRMED in the ledger",
    "api": "its effect, through the API's long poll",
}
BODY = {
    "type": "ticket.create",
    "resource": {"type": "queue", "id": "bench"},
    "intent": {"summary": "benchmark"},
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * len(ordered)) - 1))
    return ordered[index]


def slowest_during(
    spans: list[tuple[float, float]], busy: list[tuple[float, float]], pct: float = 99
) -> tuple[int, int]:
    """Of the submissions at or above the ``pct`` percentile of latency (their (sent, answered)
    ``spans``), how many overlapped one of the ``busy`` intervals; and how many there were."""
    if not spans:
        return 0, 0
    cut = percentile([end - start for start, end in spans], pct)
    slow = [(start, end) for start, end in spans if end - start >= cut]
    during = sum(1 for start, end in slow if any(a < end and start < b for a, b in busy))
    return during, len(slow)


def _run_process(module: str, arguments: dict, what: str) -> dict:
    """``python -m module`` with its arguments and its result as JSON (the floor, the client)."""
    done = subprocess.run(
        [sys.executable, "-m", module, json.dumps(arguments)],
        cwd=ROOT,
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        raise CommandError(f"{what} failed: {done.stderr.decode()[-2000:]}")
    return json.loads(done.stdout)


def _ratio(product: float, floor: float) -> float:
    return product / floor if floor else float("nan")


def median(values: list[float]) -> float:
    values = [v for v in values if v == v]  # drop NaN
    return statistics.median(values) if values else float("nan")


def offered_rate(fraction: float, per_second: float, measured: list[float]) -> float:
    """The paced pass's rate (0: none): ``--paced-rate`` as given, else ``--paced``'s fraction
    of the median throughput just measured."""
    if per_second > 0:
        return per_second
    return fraction * median(measured) if fraction > 0 else 0.0


def web_node_env(specs: list[str], nodes: int) -> dict[int, dict[str, str]]:
    """``--web-node-env``'s ``NODE:NAME=VALUE`` items, by node."""
    by_node: dict[int, dict[str, str]] = {}
    for spec in specs:
        node, _, assignment = spec.partition(":")
        name, equals, value = assignment.partition("=")
        if not node.isdigit() or not name or not equals:
            raise CommandError(f"--web-node-env {spec!r}: expected NODE:NAME=VALUE")
        if int(node) >= nodes:
            raise CommandError(f"--web-node-env {spec!r}: there are {nodes} web node(s), from 0")
        by_node.setdefault(int(node), {})[name] = value
    return by_node


def by_node(latencies: list[float], nodes: list[int]) -> dict[int, list[float]]:
    """Each web node's latencies (the client sends submission i to node i mod nodes)."""
    split: dict[int, list[float]] = {}
    for latency, node in zip(latencies, nodes, strict=True):
        split.setdefault(node, []).append(latency)
    return split


def web_server_command(options: dict, port: int) -> list[str]:
    """One web node: ``--web-workers`` processes × ``--web-threads`` threads each."""
    workers, threads = str(options["web_workers"]), str(options["web_threads"])
    if options["web_server"] == "granian":
        return [
            sys.executable, "-m", "granian", "--interface", "wsgi",
            "--host", "127.0.0.1", "--port", str(port),
            "--workers", workers, "--blocking-threads", threads, "--runtime-threads", "1",
            "--log-level", "warning", "gateway.wsgi:application",
        ]  # fmt: skip
    return [
        sys.executable, "-m", "gunicorn", "gateway.wsgi", "-b", f"127.0.0.1:{port}",
        "-w", workers, "--threads", threads, "-k", "gthread", "--log-level", "warning",
    ]  # fmt: skip


# --- CPU from /proc ----------------------------------------------------------------------------


def python_speed(additions: int = 5_000_000) -> float:
    """CPU seconds of this thread for a loop of ``additions`` in pure Python: how fast the
    machine runs the interpreter, which the milliseconds of every CPU figure depend on
    (docs/performance.md: one machine ran the same code at 3.1 ms per effect and another
    at 7.1). Runs that read differently here were made on different machines:
    compare their ratios to the floor, not their milliseconds."""
    started = time.thread_time()
    total = 0
    for number in range(additions):
        total += number
    return time.thread_time() - started


def scheduler_grouping(path: str = "/proc/sys/kernel/sched_autogroup_enabled") -> str:
    """How the kernel shares the cores out, which moves the ratio more than most changes to
    the product do (docs/performance.md). With autogroups, every session weighs
    the same: a PostgreSQL backend (PostgreSQL gives each its own) as much as the whole web
    server or the whole Celery worker. Without, every runnable thread weighs the same."""
    try:
        with open(path) as setting:
            enabled = setting.read().strip()
    except OSError:
        return "unknown"
    return "autogroup (a share per session)" if enabled == "1" else "per thread, no autogroup"


def _cpu_seconds(pid: int) -> float:
    """utime + stime of one process (all its threads), in seconds; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            with open(f"/proc/{current}/task/{current}/children") as children:
                todo.extend(int(child) for child in children.read().split())
        except OSError:
            continue
    return found


@dataclass
class CpuGroups:
    """Per group, a snapshot {pid: cpu seconds}; the difference of two is what was spent."""

    groups: dict[str, dict[int, float]] = field(default_factory=dict)

    @classmethod
    def take(cls, pids: dict[str, list[int]]) -> CpuGroups:
        return cls({name: {pid: _cpu_seconds(pid) for pid in ids} for name, ids in pids.items()})

    def spent_since(self, before: CpuGroups) -> dict[str, float]:
        spent = {}
        for name, now in self.groups.items():
            then = before.groups.get(name, {})
            spent[name] = sum(max(0.0, cpu - then.get(pid, 0.0)) for pid, cpu in now.items())
        return spent


# --- the command -------------------------------------------------------------------------------


class Command(BaseCommand):
    help = "Benchmark: the product over HTTP against a raw-psycopg floor, interleaved."

    def add_arguments(self, parser):
        parser.add_argument(
            "--concurrency",
            default="1,8,32",
            help="comma-separated client concurrencies (default 1,8,32)",
        )
        parser.add_argument("--rounds", type=int, default=3, help="rounds per concurrency")
        parser.add_argument(
            "--effects",
            type=int,
            default=0,
            help="effects per pass (default: 50 × c, ≥ 1000; --quick: 4 × c, ≥ 16)",
        )
        parser.add_argument("--quick", action="store_true", help="one round, small passes")
        parser.add_argument(
            "--paced",
            type=float,
            default=0.0,
            metavar="FRACTION",
            help="after each concurrency's rounds, one more product pass whose submissions are "
            "offered at FRACTION of the throughput just measured (an open loop, e.g. 0.5): "
            "latency under a load the machine carries, where a closed loop at saturation "
            "measures its queue (c ÷ throughput)",
        )
        parser.add_argument(
            "--paced-rate",
            type=float,
            default=0.0,
            metavar="PER_SECOND",
            help="as --paced, at this many submissions a second instead of a fraction of the "
            "throughput just measured: the same offered load in runs to compare",
        )
        parser.add_argument(
            "--no-autovacuum",
            action="store_true",
            help="on a server without autovacuum, run no stand-in for it during the product's "
            "passes (the prepared claim then keeps the plan of an empty ledger: "
            "gateway/lib/autovacuum.py)",
        )
        parser.add_argument("--web-nodes", type=int, default=1, help="gunicorn servers")
        parser.add_argument(
            "--web-node-env",
            action="append",
            default=[],
            metavar="NODE:NAME=VALUE",
            help="an environment variable for one web node only (0-based, repeatable), e.g. "
            "--web-nodes 2 --web-node-env 1:GATEWAY_TOKEN_CACHE_TTL=0: two settings of the web "
            "tier side by side in the same passes, with each node's submit latency printed (runs "
            "one after the other on this machine differ more than most such settings do)",
        )
        parser.add_argument("--web-workers", type=int, default=2)
        parser.add_argument("--web-threads", type=int, default=3)
        parser.add_argument(
            "--web-server",
            default="gunicorn",
            choices=["gunicorn", "granian"],
            help="gunicorn's gthread worker (the deployment advice, docs/guides/operations.md) or "
            "granian, measured against it (docs/performance.md)",
        )
        parser.add_argument("--worker-concurrency", type=int, default=4)
        parser.add_argument("--worker-processes", type=int, default=1)
        # threads: the deployment advice (docs/guides/operations.md): no pipe to a child per task.
        parser.add_argument("--worker-pool", default="threads", choices=["prefork", "threads"])
        parser.add_argument("--floor-pool", type=int, default=4)
        parser.add_argument(
            "--no-strict-floor",
            action="store_true",
            help="run only the issue's floor (httpx to the provider), not also the strict one "
            "(the standard library's client, as the product's adapter uses)",
        )
        parser.add_argument("--tenants", type=int, default=1, help="submitting tenants")
        parser.add_argument(
            "--webhook-endpoint",
            action="store_true",
            help="each tenant has an enabled webhook endpoint (subscribed to an event the run "
            "never fires, so nothing is delivered): what an endpoint costs the record path",
        )
        parser.add_argument(
            "--budget-count",
            type=int,
            default=0,
            help="agents submit under a grant with a count budget this large (reserved at "
            "every submission), not under an unlimited one",
        )
        parser.add_argument(
            "--loop",
            default="submission",
            choices=["submission", "effect", "api"],
            help="what a client thread waits for before its next submission: the answer (c "
            "submissions in flight, the effects queue behind them), its effect CONFIRMED in "
            "the ledger (c effects in flight, as in the floor; gateway.lib.benchclient.Oracle), "
            "or the same learnt through the API's long poll, as an agent learns it (api)",
        )
        parser.add_argument(
            "--ledger",
            type=int,
            default=0,
            metavar="EFFECTS",
            help="before the passes, load a history of this many settled effects (another "
            "tenant's, tests/benchmarks/ledger_load.py) into the fresh database: a ledger the "
            "size of a deployment's, whose tables autovacuum analyzes when a tenth of them has "
            "changed, not every second as it does an empty ledger's growing tables",
        )
        parser.add_argument("--timeout", type=float, default=180)
        parser.add_argument(
            "--port",
            type=int,
            default=0,
            help="first of the ports to use (web nodes from it, the provider at +9); "
            "default: free ports",
        )

    def handle(self, *args, **options):
        if connection.vendor != "postgresql":
            raise CommandError("the benchmark compares against PostgreSQL: set DATABASE_URL")
        self.options = options
        # What the verdicts at the end read (benchtargets): filled as the tables are printed.
        self.lines: dict[int, benchtargets.Line] = {}
        self.paced_p99: dict[int, float] = {}
        self.replay_p50 = float("nan")
        self.counted: tuple[int, int] | None = None
        # One line per request from the HTTP client would cost the floor more than its work.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        levels = [int(c) for c in options["concurrency"].split(",") if c.strip()]
        rounds = 1 if options["quick"] else max(1, options["rounds"])
        call_command("migrate", interactive=False, verbosity=0)
        if options["ledger"]:
            self._preload(options["ledger"])
        run = uuid.uuid4().hex[:8]
        self.run_id = run
        tenants = [f"bench{n}" if n else "bench" for n in range(options["tenants"])]
        tokens = [self._token(tenant, run) for tenant in tenants]
        if options["webhook_endpoint"]:
            for tenant in tenants:
                self._endpoint(tenant, run)
        base_port = options["port"]
        self.sandbox = SandboxServer(
            SandboxProvider(), port=base_port + 9 if base_port else 0
        ).start()
        urls = {name: self.sandbox.base_url(name) for name in PROVIDERS}
        db = settings.DATABASES["default"]
        dsn = (
            f"host={db['HOST'] or '127.0.0.1'} port={db['PORT'] or 5432} "
            f"dbname={db['NAME']} user={db['USER']}"
            + (f" password={db['PASSWORD']}" if db.get("PASSWORD") else "")
        )
        self.floor_args = {
            "dsn": dsn,
            "pool_size": options["floor_pool"],
            "url": urls["tickets"],
        }
        ports = [
            base_port + node if base_port else free_port() for node in range(options["web_nodes"])
        ]
        self.bases = [f"http://127.0.0.1:{port}" for port in ports]
        self.base = self.bases[0]
        self.children = self._start(run, ports, urls)
        self.autovacuum: AutovacuumStandIn | None = None
        results: dict[int, list[dict]] = {}
        paced: dict[int, dict] = {}
        try:
            # Inside the try: a stand-in that cannot connect still stops the children.
            self.autovacuum = self._autovacuum(dsn)
            self._wait_ready()
            self._header(run, levels, rounds)
            self._warm(tokens[0])
            for c in levels:
                # A pass of a second or less measures the ramp (a worker's window opens one
                # effect at a time, pools warm up) and the last effect's tail, not the rate.
                n = options["effects"] or (
                    max(16, 4 * c) if options["quick"] else max(1000, 50 * c)
                )
                for r in range(rounds):
                    self._vacuum()
                    floor = self._floor_pass(c, n, f"floor:{run}:{c}:{r}", client="httpx")
                    strict = None
                    if not options["no_strict_floor"]:
                        strict = self._floor_pass(c, n, f"strict:{run}:{c}:{r}", client="stdlib")
                    product = self._product_pass(c, n, tokens, f"bench:{run}:{c}:{r}")
                    row = {"floor": floor, "strict": strict, "product": product}
                    results.setdefault(c, []).append(row)
                    self._line(c, r, row)
                rate = offered_rate(
                    options["paced"],
                    options["paced_rate"],
                    [x["product"]["rate"] for x in results[c]],
                )
                if rate > 0:
                    self._vacuum()
                    paced[c] = self._product_pass(c, n, tokens, f"paced:{run}:{c}", rate=rate)
                    self._paced_line(c, paced[c])
            first = results[levels[0]][0]["product"]["n"]
            replay = self._replay(tokens, f"bench:{run}:{levels[0]}:0", min(25, first))
            self._summary(results, replay)
            if paced:
                self._paced_summary(paced)
        finally:
            self._stop()
            if self.autovacuum is not None:
                self.autovacuum.stop()
                self.stdout.write(
                    f"autovacuum stand-in: {len(self.autovacuum.runs)} ANALYZE/VACUUM during "
                    "the product's passes"
                )
        self._round_trips(tokens[0], run)
        self.sandbox.stop()
        self._verdicts()

    # -- set-up ----------------------------------------------------------------------------

    def _preload(self, effects: int) -> None:
        """A settled history of ``effects`` effects (``--ledger``), written in bulk as the
        gateway leaves it, without the open queue (the reconciler's work in an incident, not
        in the steady state measured here)."""
        try:
            from tests.benchmarks import ledger_load
        except ImportError as exc:  # an installed package without the repository's tests/
            raise CommandError("--ledger needs the repository's tests/benchmarks/") from exc
        if Effect.objects.exists():
            raise CommandError("--ledger loads into a fresh database: this one has effects")
        started = time.perf_counter()
        ledger_load.create_principals()
        ledger_load.load(effects=effects, open_queue=False, say=lambda line: None)
        ledger_load.count_tallies()  # or the first tally pass counts it during the passes
        self.stdout.write(
            f"ledger: {effects:,} settled effects loaded ({time.perf_counter() - started:.0f} s)"
        )

    def _token(self, tenant: str, run: str) -> str:
        from io import StringIO

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
        from io import StringIO

        from gateway.models import Principal
        from gateway.webhooks.choices import EventType
        from gateway.webhooks.services import endpoint_create

        call_command(
            "issue_token",
            tenant=tenant,
            principal=f"ops-{run}",
            role="operator",
            stdout=StringIO(),
        )
        operator = Principal.objects.get(tenant__slug=tenant, name=f"ops-{run}")
        endpoint_create(
            principal=operator,
            url="http://127.0.0.1:9/never",
            event_types=[EventType.COMPENSATION_FAILED],
            description="bench: an endpoint the run never calls",
        )

    def _start(self, run: str, ports: list[int], urls: dict) -> list[subprocess.Popen]:
        options = self.options
        env = {
            **os.environ,
            "GATEWAY_PROVIDER_URLS": json.dumps(urls),
            "GATEWAY_TASK_QUEUE": f"bench-{run}",
            "PYTHONUNBUFFERED": "1",
            "LOG_LEVEL": "WARNING",
            # Backends that live for the whole run: their CPU is read from /proc per pass.
            "GATEWAY_DB_CONN_MAX_AGE": "600",
            # The sequencer on a queue of its own: a seal pass does not wait behind dispatches.
            "GATEWAY_AUDIT_QUEUE": f"bench-{run}-audit",
        }
        logs = settings.VAR_DIR / "bench"
        logs.mkdir(parents=True, exist_ok=True)
        node_env = web_node_env(options["web_node_env"], len(ports))
        children = [
            self._spawn(
                web_server_command(options, port),
                {**env, **node_env.get(node, {})},
                logs / f"web{node}.log",
            )
            for node, port in enumerate(ports)
        ]
        web = len(children)
        for index in range(options["worker_processes"]):
            worker = [
                sys.executable, "-m", "celery", "-A", "gateway", "worker",
                "--loglevel", "WARNING",
                "--concurrency", str(options["worker_concurrency"]),
                "--pool", options["worker_pool"],
                "--prefetch-multiplier", "1",
                "-Q", f"bench-{run},bench-{run}-audit",
                "-n", f"bench{index}-{run}@%h",
                "--without-heartbeat", "--without-mingle", "--without-gossip",
            ]  # fmt: skip
            if index == 0:  # one beat: the sweeper and the audit sequencer
                worker += ["-B", "-s", str(logs / f"beat-{run}")]
            children.append(self._spawn(worker, env, logs / f"worker{index}.log"))
        self.groups = {"web": children[:web], "worker": children[web:]}
        return children

    def _spawn(self, args: list[str], env: dict, log: Path) -> subprocess.Popen:
        return subprocess.Popen(
            args,
            cwd=ROOT,
            env=env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _stop(self) -> None:
        for child in self.children:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGTERM)
        for child in self.children:
            try:
                child.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        waiting = list(self.bases)
        while waiting and time.monotonic() < deadline:
            try:
                if httpx.get(f"{waiting[0]}/healthz", timeout=1).status_code == 200:
                    waiting.pop(0)
                    continue
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        if not waiting:
            return
        raise CommandError("the web server did not start; see var/bench/web.log")

    def _warm(self, token: str) -> None:
        """A few effects first: imports, connections and pools are not what is measured."""
        self._product_pass(2, 6, [token], f"warm:{self.run_id}", quiet=True)
        self._floor_pass(2, 6, f"floorwarm:{self.run_id}", client="httpx")

    # -- what is measured ------------------------------------------------------------------

    def _pids(self) -> dict[str, list[int]]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()"
            )
            backends = [pid for (pid,) in cursor.fetchall()]
        return {
            "web": [p for child in self.groups["web"] for p in _descendants(child.pid)],
            "worker": [p for child in self.groups["worker"] for p in _descendants(child.pid)],
            "pg": backends,
            # This process: the sandbox provider's threads, and the ledger polled for the end.
            "bench": [os.getpid()],
        }

    def _autovacuum(self, dsn: str) -> AutovacuumStandIn | None:
        """The stand-in for autovacuum (module doc), on a server that does not run it."""
        with connection.cursor() as cursor:
            cursor.execute("SHOW autovacuum")
            running = cursor.fetchone()[0] == "on"
        if running or self.options["no_autovacuum"]:
            self.autovacuum_mode = "the server's" if running else "none"
            return None
        self.autovacuum_mode = "a stand-in during the product's passes"
        return AutovacuumStandIn(dsn).start()

    def _vacuum(self) -> None:
        """What autovacuum does in production, between rounds and outside the timed passes:
        the shared development server runs without it, and the dead rows of earlier passes
        (every effect is updated at claim and at record) would otherwise tax later ones."""
        with connection.cursor() as cursor:
            cursor.execute("VACUUM (ANALYZE)")

    def _commits(self) -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            )
            return int(cursor.fetchone()[0])

    def _floor_pass(self, c: int, n: int, prefix: str, *, client: str) -> dict:
        """One floor pass; ``client`` is its HTTP client for the provider call (module doc)."""
        load = os.getloadavg()[0]
        arguments = {
            **self.floor_args, "concurrency": c, "count": n, "prefix": prefix, "client": client,
        }  # fmt: skip
        before = os.times()
        result = _run_process("gateway.lib.benchfloor", arguments, "the floor")
        after = os.times()
        # This process's threads: the sandbox provider answering the floor (and its warm-up).
        spent = (after.user + after.system) - (before.user + before.system)
        result["cpu"]["bench"] = spent * 1000 / n
        result["load"] = max(load, os.getloadavg()[0])
        result["dups"] = self._duplicates(prefix, n)
        return result

    def _product_pass(
        self,
        c: int,
        n: int,
        tokens: list[str],
        prefix: str,
        *,
        rate: float = 0,
        quiet: bool = False,
    ) -> dict:
        """One product pass; ``rate`` > 0 offers the submissions at that rate (an open loop,
        gateway.lib.benchclient) instead of as fast as they are answered."""
        pids = self._pids()
        commits_before = self._commits()
        before, load = CpuGroups.take(pids), os.getloadavg()[0]
        started = time.perf_counter()
        if self.autovacuum is not None:
            self.autovacuum.resume()
        # The client in a process of its own, as the floor's is (gateway.lib.benchclient).
        arguments = {
            "bases": self.bases, "tokens": tokens, "body": BODY,
            "prefix": prefix, "concurrency": c, "count": n, "rate": rate,
            "loop": self.options["loop"], "dsn": self.floor_args["dsn"],
        }  # fmt: skip
        client = _run_process("gateway.lib.benchclient", arguments, "the client")
        busy = list(self.autovacuum.spans) if self.autovacuum is not None else []
        ids: list[str] = client["ids"]
        submit: list[float] = client["submit"]
        wrong: list[int] = client["wrong"]
        started_at = datetime.fromtimestamp(client["started_at"], tz=UTC)
        deadline = time.monotonic() + self.options["timeout"]
        while time.monotonic() < deadline:
            if not Effect.objects.filter(pk__in=ids).exclude(status__in=SETTLED).exists():
                break
            time.sleep(0.02)
        if self.autovacuum is not None:
            self.autovacuum.pause()
        # Listed again: a backend or a worker child born during the pass counts from birth.
        cpu = CpuGroups.take(self._pids()).spent_since(before)
        commits = self._commits() - commits_before
        rows = list(
            Effect.objects.filter(pk__in=ids).values_list("status", "created_at", "confirmed_at")
        )
        confirmed = [
            (created, done)
            for status, created, done in rows
            if status == EffectStatus.CONFIRMED and done is not None
        ]
        last = max((done for _, done in confirmed), default=timezone.now())
        elapsed = max((last - started_at).total_seconds(), 1e-6)
        return {
            "n": n,
            "ok": len(confirmed),
            "wrong": wrong,
            "rate": len(confirmed) / elapsed,
            "submit": submit,
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
            "dups": self._duplicates(prefix, n, ids=ids),
            "seal": self._seal_lag(ids),
            "elapsed": time.perf_counter() - started,
        }

    def _duplicates(self, prefix: str, n: int, *, ids: list[str] | None = None) -> int:
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
        missing = sum(1 for key in ledger if key not in counts)
        return extra + missing

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
        conn = benchclient.Connection(self.base)  # the load generator's client (its doc)
        try:
            for attempt in range(count + 5):
                index = attempt % keys
                body = {**BODY, "payload": {"title": f"bench {index}", "priority": "P4"}}
                t0 = time.perf_counter()
                status, _ = benchclient.submit(
                    conn, tokens[index % len(tokens)], f"{prefix}:{index}", body
                )
                if attempt >= 5:
                    latencies.append(time.perf_counter() - t0)
                if status != 200:
                    raise CommandError(f"replay answered {status}, not 200")
        finally:
            conn.close()
        return latencies

    def _round_trips(self, token: str, run: str) -> None:
        """One submission (through the API view, in process) and one dispatch, counted."""
        from django.test import Client

        from gateway import services
        from gateway.lib.querycount import count_round_trips

        settings.GATEWAY_PROVIDER_URLS = {name: self.sandbox.base_url(name) for name in PROVIDERS}
        client = Client(HTTP_HOST="127.0.0.1")
        # The steady state: this process's first request fills the token and capability
        # caches (two reads and the token's last-use write), as a web worker's first does.
        client.post(
            "/api/v1/commands",
            data=json.dumps({**BODY, "payload": {"title": "warm", "priority": "P4"}}),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
            HTTP_IDEMPOTENCY_KEY=f"count:{run}:warm",
        )
        with count_round_trips() as submitted:
            response = client.post(
                "/api/v1/commands",
                data=json.dumps({**BODY, "payload": {"title": "counted", "priority": "P4"}}),
                content_type="application/json",
                HTTP_AUTHORIZATION=f"Bearer {token}",
                HTTP_IDEMPOTENCY_KEY=f"count:{run}",
            )
        effect_id = response.json()["effect_id"]
        with count_round_trips() as dispatched:
            services.effect_dispatch(effect_id=effect_id)
        # A drainer's batch of ten (gateway.dispatcher), its window already open.
        from gateway import dispatcher

        for index in range(10):
            client.post(
                "/api/v1/commands",
                data=json.dumps({**BODY, "payload": {"title": f"batch {index}", "priority": "P4"}}),
                content_type="application/json",
                HTTP_AUTHORIZATION=f"Bearer {token}",
                HTTP_IDEMPOTENCY_KEY=f"count:{run}:{index}",
            )
        dispatcher._process_state()[1].size = settings.GATEWAY_DISPATCH_BATCH
        with count_round_trips() as batch:
            drained = dispatcher.drain(flag=None)
        from gateway.celery import app

        with app.connection_for_write() as conn:  # the messages nobody consumes any more
            conn.default_channel.queue_purge(f"bench-{run}")  # type: ignore[attr-defined]
        self.counted = (
            submitted.round_trips + dispatched.round_trips,
            submitted.commits + dispatched.commits,
        )
        self.stdout.write(
            f"round trips per effect (in process): submission {submitted.summary()}; "
            f"dispatch {dispatched.summary()}; total "
            f"{submitted.round_trips + dispatched.round_trips} round trips, "
            f"{submitted.commits + dispatched.commits} commits; a drainer's batch of "
            f"{drained}: {batch.summary()}"
        )

    # -- printing ----------------------------------------------------------------------------

    def _header(self, run: str, levels: list[int], rounds: int) -> None:
        o = self.options
        self.stdout.write(
            f"bench {run}: c={levels}, {rounds} round(s); {o['web_nodes']} {o['web_server']} × "
            f"{o['web_workers']}×{o['web_threads']} threads, "
            f"{o['worker_processes']} Celery worker(s) ×"
            f"{o['worker_concurrency']} {o['worker_pool']}, floor pool {o['floor_pool']}, "
            f"tenants {o['tenants']}, a client thread waits for {WAITS_FOR[o['loop']]}"
            + (f", grants with a budget of {o['budget_count']}" if o["budget_count"] else "")
            + (", a webhook endpoint per tenant" if o["webhook_endpoint"] else "")
            + f"; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
            + f"; pure Python: 5 M additions in {python_speed():.2f} s of CPU"
            + f"; scheduler: {scheduler_grouping()}"
            + f"; autovacuum: {self.autovacuum_mode}"
            + (
                f"; ledger: {o['ledger']:,} settled effects loaded"
                if o["ledger"]
                else "; ledger: empty at the start"
            )
        )

    def _line(self, c: int, r: int, row: dict) -> None:
        floor, strict, product = row["floor"], row["strict"], row["product"]
        cpu = product["cpu"]
        strict_part = ""
        if strict is not None:
            strict_part = (
                f"  strict floor {strict['rate']:6.1f}/s ratio "
                f"{_ratio(product['rate'], strict['rate']):.3f}"
            )
        self.stdout.write(
            f"  c={c:<3} round {r + 1}: floor {floor['rate']:6.1f}/s  product "
            f"{product['rate']:6.1f}/s ({product['ok']}/{product['n']}, "
            f"wrong {len(product['wrong'])})  ratio {_ratio(product['rate'], floor['rate']):.3f}"
            f"{strict_part}  e2e p50 {percentile(product['e2e'], 50) * 1000:.0f} ms"
        )
        line = (
            f"      CPU ms/effect: product web {cpu['web']:.1f} worker {cpu['worker']:.1f} pg "
            f"{cpu['pg']:.1f}, its client {cpu['client']:.1f}, sandbox+poll {cpu['bench']:.1f};"
            f" floor pg {floor['cpu']['pg']:.1f} own {floor['cpu']['client']:.1f} sandbox "
            f"{floor['cpu']['bench']:.1f}"
        )
        if strict is not None:
            line += (
                f"; strict pg {strict['cpu']['pg']:.1f} own {strict['cpu']['client']:.1f} "
                f"sandbox {strict['cpu']['bench']:.1f}"
            )
        dups = [floor["dups"], *([strict["dups"]] if strict else []), product["dups"]]
        self.stdout.write(f"{line}; dups {'/'.join(map(str, dups))}; load {product['load']:.2f}")
        self._node_line(product)

    def _node_line(self, p: dict) -> None:
        """With several web nodes, each one's submit latency (``--web-node-env``)."""
        split = by_node(p["submit"], p["nodes"])
        if len(split) < 2:
            return
        self.stdout.write(
            "      submit p50/p90/p99 ms by web node: "
            + ", ".join(
                f"{node}: {percentile(values, 50) * 1000:.1f} / "
                f"{percentile(values, 90) * 1000:.1f} / {percentile(values, 99) * 1000:.1f}"
                for node, values in sorted(split.items())
            )
        )

    def _paced_line(self, c: int, p: dict) -> None:
        cpu = p["cpu"]
        self.stdout.write(
            f"  c={c:<3} paced: offered {p['offered']:6.1f}/s, confirmed {p['rate']:6.1f}/s "
            f"({p['ok']}/{p['n']}, late {p['late']}, wrong {len(p['wrong'])})  submit p50/p99 "
            f"{percentile(p['submit'], 50) * 1000:.1f} / {percentile(p['submit'], 99) * 1000:.1f}"
            f" ms  e2e p50/p99 {percentile(p['e2e'], 50) * 1000:.0f} / "
            f"{percentile(p['e2e'], 99) * 1000:.0f} ms  CPU ms/effect "
            f"{cpu['web']:.1f}+{cpu['worker']:.1f}+{cpu['pg']:.1f}; commits/effect "
            f"{p['commits']:.2f}; dups {p['dups']}; load {p['load']:.2f}"
        )
        self._node_line(p)
        if self.autovacuum is not None:
            during, slow = p["tail"]
            self.stdout.write(
                f"      slowest 1 % of submissions: {during} of {slow} overlapped a pass of the "
                "autovacuum stand-in"
            )

    def _paced_summary(self, paced: dict[int, dict]) -> None:
        self.stdout.write("")
        self.stdout.write(
            "| c | offered/s (paced) | confirmed/s | late | submit p50/p99 ms | e2e p50/p99 ms | "
            "CPU ms/effect web+worker+pg | dups | load |"
        )
        self.stdout.write("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for c, p in paced.items():
            cpu = p["cpu"]
            self.paced_p99[c] = percentile(p["submit"], 99) * 1000
            self.stdout.write(
                f"| {c} | {p['offered']:.0f} | {p['rate']:.1f} | {p['late']} | "
                f"{percentile(p['submit'], 50) * 1000:.1f} / "
                f"{percentile(p['submit'], 99) * 1000:.1f} | "
                f"{percentile(p['e2e'], 50) * 1000:.0f} / {percentile(p['e2e'], 99) * 1000:.0f} | "
                f"{cpu['web']:.1f}+{cpu['worker']:.1f}+{cpu['pg']:.1f} = "
                f"{cpu['web'] + cpu['worker'] + cpu['pg']:.1f} | {p['dups']} | {p['load']:.2f} |"
            )

    def _verdicts(self) -> None:
        """The benchmark's targets against this run's figures (gateway.lib.benchtargets)."""
        round_trips, commits = self.counted or (None, None)
        rows = benchtargets.verdicts(
            lines=self.lines,
            replay_p50_ms=self.replay_p50,
            paced_submit_p99_ms=self.paced_p99,
            ledger=self.options["ledger"],
            loop=self.options["loop"],
            round_trips=round_trips,
            commits=commits,
        )
        self.stdout.write("")
        for line in benchtargets.table(rows):
            self.stdout.write(line)

    def _summary(self, results: dict[int, list[dict]], replay: list[float]) -> None:
        self.stdout.write("")
        self.stdout.write(
            "| c | floor/s | product/s | ratio | strict floor/s | ratio | submit p50/p99 ms | "
            "e2e p50/p99 ms | CPU ms/effect web+worker+pg (floor pg+own) | commits/effect | "
            "seal lag p50/p99 ms | dups | load |"
        )
        self.stdout.write("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for c, rows in results.items():
            floors = [row["floor"] for row in rows]
            products = [row["product"] for row in rows]
            floor_rate = median([f["rate"] for f in floors])
            rate = median([p["rate"] for p in products])
            # Each round's product against the floor measured beside it, then the median:
            # the floor swings with the machine (755-1165/s within one run), and a ratio of
            # the two medians would set a product pass against another round's floor.
            ratio = median(
                [_ratio(p["rate"], f["rate"]) for f, p in zip(floors, products, strict=True)]
            )
            stricts = [row["strict"] for row in rows if row["strict"] is not None]
            strict_rate = median([f["rate"] for f in stricts])
            strict_ratio = median(
                [_ratio(r["product"]["rate"], r["strict"]["rate"]) for r in rows if r["strict"]]
            )
            submit = [x for p in products for x in p["submit"]]
            e2e = [x for p in products for x in p["e2e"]]
            seal = [x for p in products for x in p["seal"]]
            web = median([p["cpu"]["web"] for p in products])
            worker = median([p["cpu"]["worker"] for p in products])
            pg = median([p["cpu"]["pg"] for p in products])
            fpg = median([f["cpu"]["pg"] for f in floors])
            fclient = median([f["cpu"]["client"] for f in floors])
            dups = sum(f["dups"] for f in floors + stricts), sum(p["dups"] for p in products)
            self.lines[c] = benchtargets.Line(
                rate=rate,
                ratio=ratio,
                strict_ratio=strict_ratio,
                cpu_ms=web + worker + pg,
                submit_p99_ms=percentile(submit, 99) * 1000,
                e2e_p50_ms=percentile(e2e, 50) * 1000,
                seal_p99_ms=percentile(seal, 99) * 1000,
                duplicates=dups[0] + dups[1],
                floor_cpu_ms=fpg + fclient,
            )
            self.stdout.write(
                f"| {c} | {floor_rate:.0f} | {rate:.1f} | {ratio:.3f} | {strict_rate:.0f} | "
                f"{strict_ratio:.3f} | "
                f"{percentile(submit, 50) * 1000:.0f} / {percentile(submit, 99) * 1000:.0f} | "
                f"{percentile(e2e, 50) * 1000:.0f} / {percentile(e2e, 99) * 1000:.0f} | "
                f"{web:.1f}+{worker:.1f}+{pg:.1f} = {web + worker + pg:.1f} "
                f"({fpg:.1f}+{fclient:.1f}) | {median([p['commits'] for p in products]):.1f} | "
                f"{percentile(seal, 50) * 1000:.0f} / {percentile(seal, 99) * 1000:.0f} | "
                f"{dups[0]}/{dups[1]} | {max(p['load'] for p in products):.2f} |"
            )
        self.replay_p50 = percentile(replay, 50) * 1000
        self.stdout.write(
            f"replay over HTTP at c=1: p50 {percentile(replay, 50) * 1000:.1f} ms, "
            f"p99 {percentile(replay, 99) * 1000:.1f} ms ({len(replay)} requests)"
        )
