"""The console at scale: triage, dashboard and search timed on a ledger of a million effects
with 5,000 open cases.

    .venv/bin/python -m tests.benchmarks.console_scale --effects 1000000 --cases 5000

Loads the ledger into a database of its own (``tests/benchmarks/ledger_load.py``: ``INSERT …
SELECT`` over ``generate_series`` in batches, the secondary indexes rebuilt after, VACUUM
ANALYZE), with an open queue of ``--cases`` effects that each carry an open case (half
receipts that disagree, half escalations after the lookups ran out) plus the loader's usual
UNKNOWN, overdue IN_PROGRESS and approvals. The database is a scratch one named after
DATABASE_URL's (``<name>_console_<effects>_<cases>``), loaded once and reused until ``--drop``;
without DATABASE_URL, on the embedded PostgreSQL with its data under ``var/`` (the demo's,
started for the run when it is not running).

Then the dashboard's roll-up is brought up to date as the beat task would after an outage
(the whole week, timed), one steady pass is timed, and each page is requested ``--requests``
times through Django's test client as the on-call engineer (server time: URL routing, the
queries, the template), in rotation. Printed: p50 / p95 / max per page and whether p95 is
under ``--target`` ms, the CPU time of the Django process per request (p50: what the page
costs whatever else the machine runs; the database's own CPU is not in it), the machine and
its load average before and after, and (``--explain``)
each page's slowest statements with their EXPLAIN ANALYZE time and the indexes they use.
No assertion: these are figures (``tests/benchmarks/test_console_scale.py`` runs it small).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import statistics
import sys
import time
import warnings
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[2]
# The index a plan's node reads: "Index Scan using x", "Bitmap Index Scan on x", …
INDEX_SCAN = re.compile(r"(?:Index|Index Only|Bitmap Index) Scan (?:Backward )?(?:using|on) (\w+)")


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(pct / 100 * len(ordered)) - 1))]


def machine() -> str:
    """CPU model, cores, memory and Python: the line the figures are read against."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        memory = next(
            int(line.split()[1]) // 1024
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
    except (OSError, StopIteration):
        memory = 0
    return (
        f"{model}, {os.cpu_count()} CPUs, {memory / 1024:.1f} GiB, "
        f"Python {platform.python_version()}, {platform.system()} {platform.release()}"
    )


def load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def open_mix(cases: int) -> tuple[tuple[int, str], ...]:
    """The open queue: ``cases`` effects with an open case (half mismatches, half escalated),
    and the loader's UNKNOWN, IN_PROGRESS and approvals beside them."""
    return (
        (300, "open_unknown"),
        (100, "open_in_progress"),
        (cases - cases // 2, "open_mismatch"),
        (cases // 2, "open_escalated"),
        (50, "open_approval"),
    )


def marker_of(effects: int, cases: int) -> str:
    """The comment on a database whose load finished."""
    return f"console_scale: {effects} effects, {cases} open cases"


# --- the database ------------------------------------------------------------------------------


def scratch_url(base: str, effects: int, cases: int) -> str:
    """A database of its own on the server of ``base``, created (or re-created when its load
    did not finish) and returned as a URL."""
    import psycopg

    parts = urlsplit(base)
    name = f"{parts.path.lstrip('/') or 'gateway'}_console_{effects}_{cases}"
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        found = conn.execute(
            "SELECT coalesce(shobj_description(oid, 'pg_database'), '') FROM pg_database "
            "WHERE datname = %s",
            [name],
        ).fetchone()
        if found is not None and found[0] != marker_of(effects, cases):
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        if found is None or found[0] != marker_of(effects, cases):
            conn.execute(f'CREATE DATABASE "{name}"')
    return urlunsplit(parts._replace(path=f"/{name}"))


def drop(url: str) -> None:
    import psycopg

    parts = urlsplit(url)
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{parts.path.lstrip("/")}" WITH (FORCE)')


def prepare(effects: int, cases: int, say) -> None:
    """Migrate, and load the ledger unless this database holds it already."""
    from django.core.management import call_command
    from django.db import connection

    from tests.benchmarks import ledger_load

    call_command("migrate", interactive=False, verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database "
            "WHERE datname = current_database()"
        )
        if cursor.fetchone()[0] == marker_of(effects, cases):
            say("ledger: already loaded")
            return
    started = time.perf_counter()
    ledger_load.create_principals()
    timings = ledger_load.load(effects=effects, mix=open_mix(cases), say=say)
    with connection.cursor() as cursor:
        cursor.execute(
            f'COMMENT ON DATABASE "{connection.settings_dict["NAME"]}" IS %s',
            [marker_of(effects, cases)],
        )
    phases = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in timings.items())
    say(f"ledger: loaded in {time.perf_counter() - started:.0f} s ({phases})")


def counts() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM gateway_effect),"
            " (SELECT count(*) FROM reconciliation_case WHERE state <> 'resolved'),"
            " (SELECT count(*) FROM gateway_effectevent),"
            " pg_size_pretty(pg_database_size(current_database())), version()"
        )
        effects, cases, events, size, version = cursor.fetchone()
    return (
        f"{effects:,} effects, {cases:,} open cases, {events:,} events, {size}; "
        f"{version.split(' on ')[0]}"
    )


def rollup(say) -> None:
    """The dashboard's roll-up: the whole retention window at once (what the beat task does
    on its first pass, or after an outage), then the steady pass it runs every minute."""
    from django.db import connection
    from django.utils import timezone

    from gateway.rollup import RETENTION, rollup_recent, rollup_span

    started = time.perf_counter()
    written = rollup_span(since=timezone.now() - RETENTION, until=timezone.now())
    catch_up = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE gateway_ledgerrollup")
    steady = []
    for _ in range(5):
        started = time.perf_counter()
        rollup_recent()
        steady.append((time.perf_counter() - started) * 1000)
    say(
        f"roll-up: the retention window (8 days) in {catch_up:.1f} s ({written:,} minute rows); "
        f"a steady pass (the last 10 minutes) p50 {statistics.median(steady):.0f} ms, "
        f"max {max(steady):.0f} ms"
    )


# --- the pages ---------------------------------------------------------------------------------


def pages(effects: int) -> dict[str, str]:
    """The measured requests: the triage queue (two sorts), the dashboard (three ranges), the
    search (an effect id, the agent's key, a provider operation id, a resource id)."""
    from gateway.models import Command
    from tests.benchmarks import ledger_load

    middle = max(1, effects // 2)
    command = Command.objects.get(
        tenant__slug=ledger_load.TENANT, idempotency_key=f"scale-{middle}"
    )
    return {
        "triage, oldest first": "/",
        "triage, by risk": "/?sort=risk",
        "dashboard, last hour": "/dashboard?range=hour",
        "dashboard, last day": "/dashboard?range=day",
        "dashboard, last week": "/dashboard?range=week",
        "search: effect id": f"/search?q={command.pk}",
        "search: agent's key": f"/search?q=scale-{middle}",
        "search: provider operation id": f"/search?q=op_{middle}",
        "search: resource id": f"/search?q={command.resource_id}",
    }


def client():
    from django.test import Client
    from django.test.utils import setup_test_environment

    from gateway.models import Principal
    from tests.benchmarks import ledger_load

    setup_test_environment()  # "testserver" among the allowed hosts
    oncall = Principal.objects.get(tenant__slug=ledger_load.TENANT, name=ledger_load.ONCALL)
    browser = Client()
    browser.force_login(oncall.user)
    return browser


def measure(browser, urls: dict[str, str], requests: int) -> dict[str, list[tuple[float, float]]]:
    """Each URL ``requests`` times (after two warm-up requests), in rotation: (wall, CPU of
    this process) in milliseconds per request."""
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in urls}
    for name, url in urls.items():
        for _ in range(2):
            answer = browser.get(url)
            if answer.status_code not in (200, 302):
                raise RuntimeError(f"{name}: {url} answered {answer.status_code}")
    for _ in range(requests):
        for name, url in urls.items():
            started, cpu = time.perf_counter(), time.process_time()
            browser.get(url)
            times[name].append(
                ((time.perf_counter() - started) * 1000, (time.process_time() - cpu) * 1000)
            )
    return times


def report(times: dict[str, list[tuple[float, float]]], target: float, say) -> bool:
    say(f"| page | requests | p50 ms | p95 ms | max ms | p95 < {target:g} ms | CPU p50 ms |")
    say("|---|---|---|---|---|---|---|")
    met = True
    for name, pairs in times.items():
        values = [wall for wall, _ in pairs]
        p95 = percentile(values, 95)
        met = met and p95 < target
        say(
            f"| {name} | {len(values)} | {percentile(values, 50):.0f} | {p95:.0f} | "
            f"{max(values):.0f} | {'yes' if p95 < target else 'NO'} | "
            f"{percentile([c for _, c in pairs], 50):.0f} |"
        )
    return met


def explain(browser, urls: dict[str, str], say, top: int = 3) -> None:
    """Each page's slowest statements under EXPLAIN ANALYZE, with the indexes they use and
    a flag on a sequential scan of a big table."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for name, url in urls.items():
        with CaptureQueriesContext(connection) as captured:
            browser.get(url)
        timed = []
        for query in captured.captured_queries:
            sql = query["sql"]
            if not sql.lstrip().upper().startswith(("SELECT", "WITH", "(SELECT")):
                continue
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN (ANALYZE, FORMAT TEXT) " + sql)
                plan = "\n".join(row[0] for row in cursor.fetchall())
            ms = float(re.search(r"Execution Time: ([\d.]+) ms", plan).group(1))
            timed.append((ms, sql, plan))
        timed.sort(reverse=True)
        total = sum(ms for ms, _, _ in timed)
        say(
            f"{name}: {len(captured.captured_queries)} statements, "
            f"{total:.1f} ms under EXPLAIN ANALYZE"
        )
        for ms, sql, plan in timed[:top]:
            indexes = sorted(set(INDEX_SCAN.findall(plan)))
            seq = sorted(set(re.findall(r"Seq Scan on (\w+)", plan)))
            say(
                f"  {ms:7.1f} ms  {sql[:110]}…\n"
                f"             indexes: {', '.join(indexes) or 'none'}"
                + (f"; sequential scans: {', '.join(seq)}" if seq else "")
            )


# --- main --------------------------------------------------------------------------------------


def run(args: argparse.Namespace, say=print) -> bool:
    """Load (or reuse) the ledger, roll it up, time the pages. True when every p95 met the
    target."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")
    os.environ.setdefault("LOG_LEVEL", "ERROR")
    warnings.filterwarnings("ignore", message="No directory at")  # no collectstatic needed
    import django

    django.setup()
    say(f"console_scale: {args.effects:,} effects, {args.cases:,} open cases")
    say(f"machine: {machine()}")
    say(f"load average before: {load_average()}")
    prepare(args.effects, args.cases, say)
    say(f"database: {counts()}")
    rollup(say)
    browser = client()
    urls = pages(args.effects)
    times = measure(browser, urls, args.requests)
    met = report(times, args.target, say)
    say(f"load average after: {load_average()}")
    if args.explain:
        explain(browser, urls, say)
    return met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--effects", type=int, default=1_000_000)
    parser.add_argument("--cases", type=int, default=5000, help="open cases in the queue")
    parser.add_argument("--requests", type=int, default=40, help="timed requests per page")
    parser.add_argument("--target", type=float, default=300, help="p95 target, ms")
    parser.add_argument("--explain", action="store_true", help="EXPLAIN ANALYZE each page")
    parser.add_argument("--drop", action="store_true", help="drop the scratch database after")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        if not os.environ.get("DATABASE_URL"):
            from gateway import embedded

            os.environ.update(stack.enter_context(embedded.for_command(ROOT / "var")))
        url = scratch_url(os.environ["DATABASE_URL"], args.effects, args.cases)
        os.environ["DATABASE_URL"] = url
        try:
            met = run(args, say=lambda line: print(line, flush=True))
        finally:
            if args.drop:
                from django.db import connections

                connections.close_all()
                drop(url)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
