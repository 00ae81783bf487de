"""Is the ledger flat? The hot paths timed side by side on a small and on large ledgers.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/eg_scale \\
    CELERY_BROKER_URL=redis://127.0.0.1:6379/4 \\
        .venv/bin/python -m tests.benchmarks.ledger_scale --sizes 10k,1m,5m --port 8900

Each size gets a scratch database of its own, named after DATABASE_URL's (``eg_scale_10k``,
``eg_scale_1m``, ``eg_scale_5m``), loaded once by ``tests/benchmarks/ledger_load.py`` (what
is written, and in what proportions, is described there: about 3 events, 1 attempt and 1
receipt per effect, and the same open queue at every size) and reused by later runs until
``--drop``. Loading here (2 shared cores at load 2–6, PostgreSQL 15 with its default 128 MB of
shared buffers): 10 k effects in 13 s, 1 M in 4 min (56 MB and 3.9 GB on disk), 5 M in 21 min
(rows 14 min, rebuilding the indexes 6, VACUUM ANALYZE 1; 19 GB). A measuring run of 8
rounds of the three sizes takes 15–40 minutes (the load of the machine).

Then, per size, one gunicorn (1 process × 2 threads, as the bench starts it) and one
probe process (Django, in process, its own connection), and rounds in which every size gets
one block in turn (the order rotates), so that all sizes see the same machine:

- over HTTP, one request at a time: submission (``POST /api/v1/commands``, a new key), replay
  of a key from deep in the history and of a key submitted a few blocks before, the
  console's on-call pages (the triage queue, its 5 s poll, by risk and newest first; the
  cases queue; approvals; an effect's page; the search box) and the API's list;
- in process: the submission service the API view calls (``services.command_submit``), the
  dispatch claim and record (``gateway.fastpath``) of the effects just submitted, and the
  periodic passes: the dispatch sweeper, the audit sequencer, the reconciler's sweep, lease
  recovery.

Printed: p50 / p95 / p99 per size and the ratio of the largest size's p95 to the smallest's;
then every statement each of them runs (captured with ``CaptureQueriesContext``), with the
indexes its plan uses, its time under ``EXPLAIN ANALYZE`` (reads) at each size, and a flag on
any sequential scan of a table of more than 50 000 rows. No assertion: these are figures.

Messages the submissions publish go to a queue of their own, purged at the end (nothing
consumes them: the probe dispatches in process). Provider calls, if the reconciler makes
any, go to a closed port of the range (``--port`` + 99).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import multiprocessing
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
import traceback
import uuid
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[2]
SIZES = {"10k": 10_000, "100k": 100_000, "1m": 1_000_000, "5m": 5_000_000, "10m": 10_000_000}
BIG_TABLE_ROWS = 50_000
SLOW_MS = 1000
BODY_TYPE = "ticket.create"


def size_of(label: str) -> int:
    if label in SIZES:
        return SIZES[label]
    return int(label)


def marker_of(effects: int) -> str:
    """The comment on a database whose load finished."""
    return f"ledger_scale: {effects} effects"


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(pct / 100 * len(ordered)) - 1))]


# --- the probe: one process per database ---------------------------------------------------


class Probe:
    """A child process with Django set up on one size's database; ``call`` runs one op there."""

    def __init__(self, context, label: str, url: str, env: dict[str, str]):
        self.label = label
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(url, env, child), daemon=True)
        self.process.start()

    def call(self, op: str, **kwargs):
        self.conn.send((op, kwargs))
        status, value = self.conn.recv()
        if status == "error":
            raise RuntimeError(f"probe {self.label}, {op}: {value}")
        return value

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(("quit", {}))
        self.process.join(10)
        if self.process.is_alive():
            self.process.terminate()


def _serve(url: str, env: dict[str, str], conn) -> None:
    os.environ.update(env)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")
    import django

    django.setup()
    ops = ProbeOps()
    while True:
        op, kwargs = conn.recv()
        if op == "quit":
            return
        try:
            conn.send(("ok", getattr(ops, op)(**kwargs)))
        except Exception:
            conn.send(("error", traceback.format_exc()))


class ProbeOps:
    """What the probe process does, on its own database (Django is set up)."""

    def prepare(self, *, effects: int) -> dict:
        from django.core.management import call_command
        from django.db import connection

        from tests.benchmarks import ledger_load

        call_command("migrate", interactive=False, verbosity=0)
        marker = marker_of(effects)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT shobj_description(oid, 'pg_database') FROM pg_database "
                "WHERE datname = current_database()"
            )
            loaded = cursor.fetchone()[0] == marker
        timings: dict[str, float] = {}
        if not loaded:
            ledger_load.create_principals()
            timings = ledger_load.load(effects=effects, say=lambda line: print(line, flush=True))
            with connection.cursor() as cursor:
                cursor.execute(
                    f"COMMENT ON DATABASE {connection.settings_dict['NAME']} IS %s", [marker]
                )
        return {"loaded_now": not loaded, "timings": timings, "tables": self._tables()}

    def _tables(self) -> dict[str, tuple[int, str]]:
        from django.db import connection

        from tests.benchmarks.ledger_load import TABLES

        with connection.cursor() as cursor:
            cursor.execute(
                """
                SELECT c.relname, c.reltuples::bigint,
                       pg_size_pretty(pg_total_relation_size(c.oid))
                  FROM pg_class c WHERE c.relname = ANY(%s)
                """,
                [list(TABLES)],
            )
            rows = {name: (count, size) for name, count, size in cursor.fetchall()}
            cursor.execute("SELECT pg_size_pretty(pg_database_size(current_database()))")
            rows["database"] = (0, cursor.fetchone()[0])
        return rows

    def setup(self, *, effects: int, samples: int) -> dict:
        """A fresh agent token, a console session, and history keys to replay."""
        from io import StringIO

        from django.core.management import call_command
        from django.test import Client

        from gateway.models import Principal
        from tests.benchmarks import ledger_load

        out = StringIO()
        call_command(
            "issue_token",
            tenant=ledger_load.TENANT,
            principal=ledger_load.AGENT,
            role="agent",
            stdout=out,
        )
        token = out.getvalue().strip().splitlines()[-1]
        self.agent = Principal.objects.select_related("tenant").get(
            tenant__slug=ledger_load.TENANT, name=ledger_load.AGENT
        )
        oncall = Principal.objects.get(tenant__slug=ledger_load.TENANT, name=ledger_load.ONCALL)
        client = Client()
        client.force_login(oncall.user)
        self.client = client
        self.effects = effects
        types = ledger_load.history_types()
        self.types = types
        chosen = random.Random(effects).sample(range(1, effects + 1), min(samples * 4, effects))
        history = []
        for g in chosen:
            if ledger_load.history_kind(g) != "ok":
                continue
            row = types[g % len(types)]
            body = {
                "type": row.type,
                "resource": ledger_load.resource_of(row, g),
                "payload": row.payload,
            }
            history.append((f"scale-{g}", body))
        history = history[:samples]
        self._seal(history)
        self._top_up_approvals()
        return {
            "tally": self._tally(),
            "token": token,
            "session": client.cookies["sessionid"].value,
            "history": history,
            "deep": self._deep_cursor(),
        }

    def _tally(self) -> dict:
        """The /metrics tallies brought up to the sealed chain (on a freshly loaded ledger:
        the whole backfill, timed), then compared with a count of the whole effect table."""
        from django.db import connection

        from gateway import audit
        from reconciliation.metrics import LIVE_STATUSES
        from reconciliation.tally import tally_pending

        audit.seal_pending()
        started, events, passes = time.perf_counter(), 0, 0
        while counted := tally_pending():
            events, passes = events + counted, passes + 1
        seconds = time.perf_counter() - started
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT status, type, count(*) FROM gateway_effect GROUP BY status, type"
            )
            table = {(status, type_): n for status, type_, n in cursor.fetchall()}
            cursor.execute(
                "SELECT status, type, sum(count) FROM reconciliation_effecttally "
                "GROUP BY status, type HAVING sum(count) <> 0"
            )
            tallied = {(status, type_): n for status, type_, n in cursor.fetchall()}
        settled = {key: n for key, n in table.items() if key[0] not in LIVE_STATUSES}
        differ = {
            f"{status} {type_}": (table.get((status, type_), 0), tallied.get((status, type_), 0))
            for status, type_ in set(settled) | {k for k in tallied if k[0] not in LIVE_STATUSES}
            if table.get((status, type_), 0) != tallied.get((status, type_), 0)
        }
        return {"events": events, "passes": passes, "seconds": seconds, "differ": differ}

    def _top_up_approvals(self, waiting: int = 50) -> None:
        """The approvals inbox holds ``waiting`` commands, half of them promotions to
        production of services the history promoted (what is live is looked up for those),
        submitted through the service; they expire in a week, after the run."""
        from gateway import services
        from gateway.models import Effect

        have = Effect.objects.filter(tenant=self.agent.tenant, status="AWAITING_APPROVAL").count()
        for index in range(have, waiting):
            if index % 2:
                body = {
                    "type": "billing.refund.create",
                    "resource": {"type": "order", "id": f"ord_881-{index}", "version": 17},
                    "payload": {"amount": 25_000, "currency": "EUR", "reason": "duplicate"},
                }
            else:
                body = {
                    "type": "deployment.release.promote",
                    "resource": {"type": "service", "id": f"catalog-{index}", "version": 41},
                    "payload": {"environment": "production", "sha": "a1b2c3d4e5f6",
                                "release": f"r-{index}"},
                }  # fmt: skip
            services.command_submit(
                principal=self.agent,
                idempotency_key=f"approval:{uuid.uuid4().hex}",
                expires_in=7 * 24 * 3600,
                **body,
            )

    def _seal(self, history: list[tuple[str, dict]]) -> None:
        """The loader writes one placeholder ciphertext; a replay answers with the clear
        payload, so the keys it replays get theirs sealed to their own effect, as the gateway
        seals (the trigger allows re-sealing that one column)."""
        from gateway.integrity import payload_binding
        from gateway.lib.vault import seal_bound
        from gateway.models import Command

        for key, body in history:
            command = Command.objects.get(tenant=self.agent.tenant, idempotency_key=key)
            binding = payload_binding(effect_id=command.pk, digest=command.payload_digest)
            Command.objects.filter(pk=command.pk).update(
                payload_sealed=seal_bound(body["payload"], bound_to=binding)
            )

    def block(self, *, ids: list[str], submits: int, run: str, block: int) -> dict:
        """In process: submissions through the service, claim and record of every effect
        submitted in this block, the periodic passes and the API's list queries."""
        from django.utils import timezone

        from gateway import audit, fastpath, services
        from gateway.choices import Outcome
        from gateway.models import Effect
        from gateway.providers.base import CallResult, ProviderOperation
        from gateway.recovery import attempts_close_abandoned
        from reconciliation import services as reconciliation
        from reconciliation.bulk import effects_probe_escalated
        from reconciliation.services.cases import cases_open_for_flagged
        from reconciliation.services.leases import effects_recover_expired_leases
        from reconciliation.tally import tally_pending

        timings: dict[str, list[float]] = {}

        def timed(name: str, function, *args, **kwargs):
            started = time.perf_counter()
            value = function(*args, **kwargs)
            timings.setdefault(name, []).append((time.perf_counter() - started) * 1000)
            return value

        ids = list(ids)
        for index in range(submits):
            submission = timed(
                "submit, in process (services.command_submit)",
                services.command_submit,
                principal=self.agent,
                idempotency_key=f"probe:{run}:{block}:{index}",
                type=BODY_TYPE,
                resource={"type": "queue", "id": "scale"},
                payload={"title": f"probe {index}", "priority": "P4"},
            )
            ids.append(submission.effect.pk)
        for effect_id in ids:
            claim = timed("dispatch claim (fastpath.claim)", fastpath.claim,
                          effect_id=effect_id, worker="scale")  # fmt: skip
            if claim is None:
                raise RuntimeError(f"{effect_id} could not be claimed by the fast path")
            now = timezone.now()
            operation = ProviderOperation(
                id=f"op_{effect_id}",
                status="succeeded",
                payload_digest=claim.payload_digest,
                result={"id": f"op_{effect_id}", "status": "succeeded"},
            )
            result = CallResult(Outcome.CONFIRMED, "201 succeeded", operation, http_status=201)
            counts = Effect(attempt_count=claim.attempt_number, check_count=claim.check_count)
            fields = services.outcome_fields(counts, result, now=now)
            recorded = timed("dispatch record (fastpath.record)", fastpath.record,
                             claim=claim, result=result, worker="scale", fields=fields,
                             now=now)  # fmt: skip
            if not recorded:
                raise RuntimeError(f"{effect_id}: the fast record did not apply")
        for _ in range(2):
            timed("sweeper: dispatch_sweep", services.dispatch_sweep)
            timed("lease recovery (recover_leases)", lambda: (
                effects_recover_expired_leases() + attempts_close_abandoned()))  # fmt: skip
            timed("reconciler: reconcile_due", reconciliation.reconcile_due, time_budget=5)
            timed("  of which cases_open_for_flagged", cases_open_for_flagged)
            timed("  of which effects_probe_escalated", effects_probe_escalated)
            timed(
                "  of which the due batch (reconcile_next_batch)",
                reconciliation.reconcile_next_batch,
            )
        timed("audit sequencer: seal_pending", audit.seal_pending)
        timed("metrics tally pass: tally_pending", tally_pending)
        for name, query in self._api_queries().items():
            timed(name, lambda query=query: list(query))
        return timings

    def _api_queries(self) -> dict:
        from gateway.console.selectors import effects_for_triage
        from gateway.models import Effect
        from gateway.providers.health import provider_health
        from gateway.selectors import effects_filtered

        agent = self.agent
        newest = effects_filtered(principal=agent).order_by("-command")
        from django.utils import timezone

        return {
            "API list: page at depth N/2 (cursor)": newest.filter(command__lt=self._deep_cursor())[
                :50
            ],
            "API list ?type=billing.refund.create": effects_filtered(
                principal=agent, type="billing.refund.create"
            ).order_by("-command")[:50],
            # A provider's webhook that names its operation but not our key.
            "webhook receipt: the effect of an operation id": Effect.objects.filter(
                command__provider="tickets", provider_operation_id=f"op_{self.effects // 3}"
            ).values_list("pk", flat=True)[:1],
            "triage selector, oldest first, page 1": effects_for_triage(
                principal=agent, now=timezone.now()
            ).order_by("command")[:51],
            # The triage strip's and the providers page's three grouped queries.
            "provider health, the last hour (providers.health)": _Deferred(
                lambda: provider_health(agent.tenant_id)
            ),
        }

    def _deep_cursor(self) -> str:
        if not hasattr(self, "deep"):
            from gateway.models import Command
            from tests.benchmarks import ledger_load

            self.deep = Command.objects.get(
                tenant__slug=ledger_load.TENANT, idempotency_key=f"scale-{self.effects // 2}"
            ).pk
        return self.deep

    def plans(self, *, pages: dict[str, str], ids: list[str], run: str) -> dict:
        """Every statement of each measured path, with its plan (EXPLAIN, and EXPLAIN ANALYZE
        for reads)."""
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        from gateway import audit, fastpath, services
        from reconciliation import services as reconciliation
        from reconciliation.services.leases import effects_recover_expired_leases
        from reconciliation.tally import tally_pending

        captured: dict[str, list[str]] = {}

        def capture(name: str, function) -> None:
            with CaptureQueriesContext(connection) as queries:
                function()
            captured[name] = [q["sql"] for q in queries.captured_queries]

        for name, path in pages.items():
            headers = {"HX-Request": "true"} if "(poll)" in name else {}
            capture(name, lambda path=path, headers=headers: self.client.get(path, headers=headers))
        capture(
            "submit (services.command_submit)",
            lambda: services.command_submit(
                principal=self.agent,
                idempotency_key=f"plan:{run}",
                type=BODY_TYPE,
                resource={"type": "queue", "id": "scale"},
                payload={"title": "plan", "priority": "P4"},
            ),
        )
        capture(
            "replay (services.command_submit, same key)",
            lambda: services.command_submit(
                principal=self.agent,
                idempotency_key=f"plan:{run}",
                type=BODY_TYPE,
                resource={"type": "queue", "id": "scale"},
                payload={"title": "plan", "priority": "P4"},
            ),
        )
        claims: list = []
        capture("dispatch claim", lambda: claims.append(
            fastpath.claim(effect_id=ids[0], worker="plan")))  # fmt: skip
        capture("sweeper: dispatch_sweep", services.dispatch_sweep)
        capture("lease recovery", effects_recover_expired_leases)
        capture("reconciler: reconcile_due", lambda: reconciliation.reconcile_due(time_budget=5))
        capture("audit sequencer: seal_pending", audit.seal_pending)
        capture("metrics tally pass: tally_pending", tally_pending)
        for name, query in self._api_queries().items():
            capture(name, lambda query=query: list(query))
        sizes = self._row_counts()
        return {
            name: [self._explain(sql, sizes) for sql in sqls] for name, sqls in captured.items()
        }

    def _row_counts(self) -> dict[str, int]:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT relname, reltuples::bigint FROM pg_class WHERE relkind = 'r' "
                "AND relnamespace = 'public'::regnamespace"
            )
            return dict(cursor.fetchall())

    def _explain(self, sql: str, sizes: dict[str, int]) -> dict:
        from django.db import connection

        head = sql.lstrip().upper()
        if not head.startswith(("SELECT", "WITH", "INSERT", "UPDATE", "DELETE")):
            return {"sql": sql, "skip": True}
        read = head.startswith("SELECT") and "FOR UPDATE" not in head and "NEXTVAL" not in head
        options = "ANALYZE, FORMAT JSON" if read else "FORMAT JSON"
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN ({options}) {sql}")
            plan = cursor.fetchone()[0]
        if isinstance(plan, str):
            plan = json.loads(plan)
        top = plan[0]
        uses, seq = [], []
        for node in _walk(top["Plan"]):
            relation = node.get("Relation Name")
            if node.get("Index Name"):
                uses.append(f"{node['Node Type']} {node['Index Name']}")
            elif node["Node Type"] == "Seq Scan" and relation:
                rows = sizes.get(relation, 0)
                uses.append(f"Seq Scan {relation}")
                if rows > BIG_TABLE_ROWS:
                    seq.append(f"{relation} (~{rows:,} rows)")
        return {
            "sql": sql,
            "uses": uses,
            "seq": seq,
            "ms": top.get("Execution Time"),
        }


class _Deferred:
    """A read that is not a queryset, run when it is iterated (as the querysets are)."""

    def __init__(self, read) -> None:
        self.read = read

    def __iter__(self):
        return iter(self.read())


def _walk(node: dict):
    yield node
    for child in node.get("Plans", []):
        yield from _walk(child)


# --- the driver -----------------------------------------------------------------------------


def database_url(base: str, name: str) -> str:
    parts = urlsplit(base)
    return urlunsplit(parts._replace(path=f"/{name}"))


def ensure_database(base: str, name: str, marker: str) -> None:
    """The database, created if missing; one whose load did not finish (no marker) is
    dropped and created again."""
    import psycopg

    parts = urlsplit(base)
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        found = conn.execute(
            "SELECT coalesce(shobj_description(oid, 'pg_database'), '') FROM pg_database "
            "WHERE datname = %s",
            [name],
        ).fetchone()
        if found is not None and found[0] != marker:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        if found is None or found[0] != marker:
            conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(base: str, name: str) -> None:
    import psycopg

    parts = urlsplit(base)
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Web:
    """One gunicorn per size, started the way the bench starts its nodes."""

    def __init__(self, url: str, port: int, env: dict[str, str], log: Path):
        self.base = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "gateway.wsgi", "-b", f"127.0.0.1:{port}",
             "-w", "1", "--threads", "2", "-k", "gthread", "--log-level", "warning"],
            cwd=ROOT,
            env={**os.environ, **env, "DATABASE_URL": url},
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def wait(self) -> None:
        import httpx

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.base}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"gunicorn at {self.base} did not start")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)


class Size:
    """One ledger size under test: its database, gunicorn, probe and what was measured."""

    def __init__(self, label: str, effects: int, db: str):
        self.label, self.effects, self.db = label, effects, db
        self.timings: dict[str, list[float]] = {}
        self.recent: list[tuple[str, dict]] = []
        self.ids: list[str] = []

    def add(self, name: str, ms: float) -> None:
        self.timings.setdefault(name, []).append(ms)


def http_block(size: Size, client, k: int, run: str, block: int, pages: dict[str, str]) -> list:
    """One block over HTTP against this size's gunicorn; returns the new effects' ids."""
    headers = {"Authorization": f"Bearer {size.token}"}
    body_of = {"type": BODY_TYPE, "resource": {"type": "queue", "id": "scale"}}
    ids = []

    def post(name: str, key: str, body: dict, expect: int) -> dict:
        started = time.perf_counter()
        response = client.post(
            f"{size.web.base}/api/v1/commands",
            headers={**headers, "Idempotency-Key": key},
            json=body,
        )
        size.add(name, (time.perf_counter() - started) * 1000)
        if response.status_code != expect:
            raise RuntimeError(f"{name}: {response.status_code} {response.text[:300]}")
        return response.json()

    for index in range(k):
        key = f"http:{run}:{block}:{index}"
        body = {**body_of, "payload": {"title": f"scale {index}", "priority": "P4"}}
        answer = post("submit over HTTP (POST /api/v1/commands)", key, body, 201)
        ids.append(answer["effect_id"])
        size.recent.append((key, body))
    for key, body in random.sample(size.history, k):
        post("replay over HTTP, a key from the history", key, body, 200)
    for key, body in random.sample(size.recent[: max(k, len(size.recent) - k)], k):
        post("replay over HTTP, a key of a few seconds ago", key, body, 200)
    cookies = {"sessionid": size.session}
    for repeat in range(max(1, k // 4)):
        for name, path in pages.items():
            # A page that takes seconds is sampled once a block: its figure is clear enough,
            # and the round stays short enough to interleave the sizes.
            if repeat and size.timings.get(name, [0])[-1] > SLOW_MS:
                continue
            path = path.replace("{effect}", size.ids[0] if size.ids else ids[0])
            extra = {"HX-Request": "true"} if "(poll)" in name else {}
            if path.startswith("/api/"):
                extra = headers
            started = time.perf_counter()
            response = client.get(f"{size.web.base}{path}", headers=extra, cookies=cookies)
            size.add(name, (time.perf_counter() - started) * 1000)
            if response.status_code not in (200, 204, 302):
                raise RuntimeError(f"{name}: {response.status_code} {response.text[:300]}")
    return ids


PAGES = {
    "console: triage queue (/)": "/",
    "console: triage poll (/, htmx) (poll)": "/",
    "console: triage by risk (/?sort=risk)": "/?sort=risk",
    "console: triage newest first": "/?sort=newest",
    "console: triage ?status=UNKNOWN": "/?status=UNKNOWN",
    "console: cases queue (/cases)": "/cases",
    "console: approvals (/approvals)": "/approvals",
    "console: an effect's page": "/effects/{effect}",
    "console: search by key (/search?q=)": "/search?q=scale-777",
    "API: GET /api/v1/effects (newest)": "/api/v1/effects",
    "API: GET /api/v1/effects?status=UNKNOWN": "/api/v1/effects?status=UNKNOWN",
    # A Prometheus scrape (loopback needs no token): the ledger's gauges, read at scrape time.
    "metrics scrape (/metrics)": "/metrics",
}


def main() -> int:
    args = _arguments()
    base = os.environ.get("DATABASE_URL", "")
    if not base.startswith("postgres"):
        print("ledger_scale needs PostgreSQL: set DATABASE_URL")
        return 2
    prefix = urlsplit(base).path.lstrip("/")
    sizes = [Size(label, size_of(label), f"{prefix}_{label}") for label in args.sizes.split(",")]
    if args.drop_only:
        for size in sizes:
            drop_database(base, size.db)
        return 0
    run = uuid.uuid4().hex[:8]
    env = _probe_env(run, closed=args.port + 99)
    # Stopped with SIGTERM (a background run ignores SIGINT): clean up as on Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(f"ledger_scale {run}: sizes {args.sizes}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    probes: list[Probe] = []
    webs: list[Web] = []
    try:
        _prepare(sizes, base, env, probes)
        if args.load_only:
            return 0
        logs = ROOT / "var" / "ledger_scale"
        logs.mkdir(parents=True, exist_ok=True)
        for index, size in enumerate(sizes):
            size.web = Web(
                database_url(base, size.db), args.port + index, env, logs / f"{size.label}.log"
            )
            webs.append(size.web)
        for size in sizes:
            _set_up(size, samples=args.block * 20)
        measure(sizes, args, run)
        report(sizes, args, run)
    finally:
        for web in webs:
            web.stop()
        purge(run)
        for probe in probes:
            probe.close()
        if args.drop:
            for size in sizes:
                drop_database(base, size.db)
    return 0


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10k,1m,5m")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--block", type=int, default=20, help="requests of each kind per block")
    parser.add_argument("--port", type=int, default=8900, help="first port; one per size")
    parser.add_argument("--load-only", action="store_true")
    parser.add_argument("--drop", action="store_true", help="drop the databases at the end")
    parser.add_argument("--drop-only", action="store_true")
    return parser.parse_args()


def _probe_env(run: str, closed: int) -> dict[str, str]:
    """The environment of the probes and the web servers: the run's own queue, and every
    provider on a closed port."""
    return {
        "GATEWAY_TASK_QUEUE": f"scale-{run}",
        "LOG_LEVEL": "ERROR",
        "GATEWAY_DB_CONN_MAX_AGE": "600",
        "GATEWAY_PROVIDER_URLS": json.dumps(
            {name: f"http://127.0.0.1:{closed}/{name}" for name in
             ("billing", "inventory", "shipping", "deploy", "tickets", "mail", "verify")}
        ),
        "GATEWAY_PROVIDER_TIMEOUT": "1",
        "GATEWAY_DISPATCH_LEASE": "60",
    }  # fmt: skip


def _prepare(sizes: list[Size], base: str, env: dict[str, str], probes: list[Probe]) -> None:
    """Each size's database (loaded once, then reused) and its probe process."""
    context = multiprocessing.get_context("spawn")
    for size in sizes:
        ensure_database(base, size.db, marker_of(size.effects))
        size.probe = Probe(context, size.label, database_url(base, size.db), env)
        probes.append(size.probe)
        started = time.perf_counter()
        prepared = size.probe.call("prepare", effects=size.effects)
        spent = time.perf_counter() - started
        tables = prepared["tables"]
        counts = ", ".join(
            f"{name.split('_', 1)[1]} {rows:,}" for name, (rows, _) in tables.items() if rows
        )
        print(
            f"{size.label}: {size.db} "
            + (f"loaded in {spent:.0f} s {prepared['timings']}" if prepared["loaded_now"]
               else "already loaded")
            + f"; {tables['database'][1]}; rows ≈ {counts}",
            flush=True,
        )  # fmt: skip


def _set_up(size: Size, samples: int) -> None:
    """Once its gunicorn answers: the size's token, console session, history keys and pages;
    the /metrics tallies brought up to its chain."""
    size.web.wait()
    setup = size.probe.call("setup", effects=size.effects, samples=samples)
    tally = setup["tally"]
    print(
        f"{size.label}: metrics tallies brought up to the chain: {tally['events']:,} "
        f"events in {tally['seconds']:.1f} s ({tally['passes']} passes); "
        + (f"DIFFER from the effect table: {tally['differ']}" if tally["differ"]
           else "equal to a count of the effect table"),
        flush=True,
    )  # fmt: skip
    size.token, size.session, size.history = (
        setup["token"], setup["session"], setup["history"])  # fmt: skip
    # DRF's cursor for the page after the effect half-way down the history.
    cursor = base64.b64encode(f"p={setup['deep']}".encode()).decode()
    size.pages = {**PAGES, "API: GET /api/v1/effects?cursor= (depth N/2)":
                  f"/api/v1/effects?cursor={quote(cursor)}"}  # fmt: skip


def measure(sizes: list[Size], args, run: str) -> None:
    import httpx

    loads = []
    with httpx.Client(timeout=300) as client:
        # A first block each, not counted: imports, connections, caches.
        for size in sizes:
            ids = http_block(size, client, 4, run, -1, size.pages)
            size.ids.extend(ids)
            size.probe.call("block", ids=ids, submits=2, run=run, block=-1)
            size.timings.clear()
        for round_ in range(args.rounds):
            order = sizes[round_ % len(sizes) :] + sizes[: round_ % len(sizes)]
            for size in order:
                loads.append(os.getloadavg()[0])
                ids = http_block(size, client, args.block, run, round_, size.pages)
                size.ids.extend(ids)
                spent = size.probe.call(
                    "block", ids=ids, submits=args.block // 2, run=run, block=round_
                )
                for name, values in spent.items():
                    size.timings.setdefault(name, []).extend(values)
            print(f"  round {round_ + 1}/{args.rounds} done, load {loads[-1]:.2f}", flush=True)
    for size in sizes:
        size.loads = loads


def report(sizes: list[Size], args, run: str) -> None:
    loads = sizes[0].loads
    print()
    print(
        f"load average during the rounds: min {min(loads):.2f}, median "
        f"{statistics.median(loads):.2f}, max {max(loads):.2f}"
    )
    head = " | ".join(f"{s.label} p50 / p95 / p99 ms" for s in sizes)
    print(f"| measurement | n | {head} | p95 {sizes[-1].label} ÷ {sizes[0].label} |")
    print("|---|---:|" + "---:|" * len(sizes) + "---:|")
    names = list(dict.fromkeys(name for s in sizes for name in s.timings))
    for name in names:
        cells = []
        for size in sizes:
            values = size.timings.get(name, [])
            cells.append(
                f"{percentile(values, 50):.1f} / {percentile(values, 95):.1f} / "
                f"{percentile(values, 99):.1f}"
            )
        first = percentile(sizes[0].timings.get(name, []), 95)
        last = percentile(sizes[-1].timings.get(name, []), 95)
        count = len(sizes[-1].timings.get(name, []))
        print(f"| {name} | {count} | " + " | ".join(cells) + f" | {last / first:.2f} |")
    print()
    print("Statements and plans (EXPLAIN; reads also EXPLAIN ANALYZE, ms per size):")
    plans = {
        size.label: size.probe.call(
            "plans",
            pages={
                name: path.replace("{effect}", size.ids[0]) for name, path in size.pages.items()
            },
            ids=[_fresh(size, run)],
            run=run,
        )
        for size in sizes
    }
    largest = sizes[-1].label
    for name, statements in plans[largest].items():
        print(f"\n{name}: {len(statements)} statements")
        previous, repeats = "", 0
        for index, statement in enumerate(statements):
            if statement.get("skip"):
                continue
            shape = _shape(statement["sql"])
            if shape == previous:  # an N+1: the same statement for another row
                repeats += 1
                continue
            if repeats:
                print(f"      … and {repeats} more of the same shape")
            previous, repeats = shape, 0
            times = []
            for size in sizes:
                other = plans[size.label].get(name, [])
                ms = other[index].get("ms") if index < len(other) else None
                times.append("-" if ms is None else f"{ms:.2f}")
            uses = "; ".join(dict.fromkeys(statement["uses"])) or "(no table scan)"
            flag = f"  ** SEQ SCAN {', '.join(statement['seq'])}" if statement["seq"] else ""
            print(f"  {index:>2}. [{' / '.join(times)} ms] {uses}{flag}\n      {shape[:160]}")
        if repeats:
            print(f"      … and {repeats} more of the same shape")


def _shape(sql: str) -> str:
    """The statement without its column list and literals: what repeats in an N+1."""
    sql = " ".join(sql.split()).replace('"', "")
    sql = re.sub(r"^SELECT (DISTINCT )?.*? FROM ", r"SELECT \1… FROM ", sql)
    return re.sub(r"'[^']*'|\b\d+\b", "?", sql)


def _fresh(size: Size, run: str) -> str:
    """An effect submitted now over HTTP, PREPARED, for the claim's plan."""
    import httpx

    response = httpx.post(
        f"{size.web.base}/api/v1/commands",
        headers={"Authorization": f"Bearer {size.token}", "Idempotency-Key": f"fresh:{run}"},
        json={"type": BODY_TYPE, "resource": {"type": "queue", "id": "scale"},
              "payload": {"title": "fresh", "priority": "P4"}},
        timeout=30,
    )  # fmt: skip
    return response.json()["effect_id"]


def purge(run: str) -> None:
    """The queue the submissions published to: nobody consumes it."""
    try:
        import redis

        broker = redis.Redis.from_url(os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1"))
        broker.delete(f"scale-{run}", f"scale-{run}.recovery")
    except Exception as error:  # the purge is tidiness, not the measurement
        print(f"(queue scale-{run} not purged: {error})")


if __name__ == "__main__":
    sys.exit(main())
