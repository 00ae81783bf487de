"""What PostgreSQL spends per effect, statement by statement.

    DATABASE_URL=postgres://postgres@127.0.0.1:PORT/eg_cost \
        .venv/bin/python -m tests.benchmarks.pg_cost --effects 400

In one process, against the in-process sandbox provider, it runs N effects phase by phase —
the submissions through the HTTP API (Django's test client), then the claims, then the
provider calls with their records, then the audit sequencer's pass — and then calls every
periodic task with nothing due. For each phase it reads, around the loop:

- the CPU of this connection's PostgreSQL backend (``/proc/PID/schedstat``: nanoseconds, so
  the server must run on this machine);
- the WAL written (``pg_current_wal_insert_lsn``), and with ``pg_walinspect`` installed, the
  WAL records by kind (heap inserts, HOT and non-HOT updates, b-tree leaf inserts: one per
  index entry) and the bytes of full-page images;
- ``pg_stat_user_tables``: rows inserted, updated, HOT-updated;
- with ``pg_stat_statements`` loaded, each statement's calls, mean time and WAL.

Use a scratch database on a server of your own (the WAL and the statement statistics are
the whole server's). Nothing here is timed in a test: it is a measuring tool.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

TABLES = (
    "gateway_command",
    "gateway_effect",
    "gateway_effectevent",
    "gateway_attempt",
    "gateway_receipt",
    "gateway_auditchainhead",
    "gateway_auditbatch",
)


@dataclass
class Phase:
    name: str
    per: int
    cpu_ns: int = 0
    wal: int = 0
    records: Counter = field(default_factory=Counter)
    fpi: int = 0
    tables: dict = field(default_factory=dict)
    statements: list = field(default_factory=list)


def _backend_cpu_ns(cursor) -> int:
    cursor.execute("SELECT pg_backend_pid()")
    (pid,) = cursor.fetchone()
    with open(f"/proc/{pid}/schedstat") as stat:
        return int(stat.read().split()[0])


def _lsn(cursor) -> str:
    cursor.execute("SELECT pg_current_wal_insert_lsn()")
    return cursor.fetchone()[0]


def _table_counts(cursor) -> dict[str, tuple[int, int, int]]:
    cursor.execute("SELECT pg_stat_force_next_flush()")
    cursor.execute("SELECT pg_stat_clear_snapshot()")
    cursor.execute(
        "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
        "WHERE relname = ANY(%s)",
        [list(TABLES)],
    )
    return {name: (ins, upd, hot) for name, ins, upd, hot in cursor.fetchall()}


def _has(cursor, extension: str) -> bool:
    cursor.execute("SELECT 1 FROM pg_extension WHERE extname = %s", [extension])
    return cursor.fetchone() is not None


@contextmanager
def measured(connection, name: str, per: int, phases: list[Phase]):
    """Measure the block; the figures are divided by ``per`` when printed."""
    phase = Phase(name, per)
    with connection.cursor() as cursor:
        statements = _has(cursor, "pg_stat_statements")
        walinspect = _has(cursor, "pg_walinspect")
        if statements:
            cursor.execute("SELECT pg_stat_statements_reset()")
        tables_before = _table_counts(cursor)
        start = _lsn(cursor)
        cpu = _backend_cpu_ns(cursor)
    yield phase
    with connection.cursor() as cursor:
        phase.cpu_ns = _backend_cpu_ns(cursor) - cpu
        end = _lsn(cursor)
        cursor.execute("SELECT %s::pg_lsn - %s::pg_lsn", [end, start])
        phase.wal = int(cursor.fetchone()[0])
        if walinspect and phase.wal > 0:
            cursor.execute(
                'SELECT "resource_manager/record_type", count, fpi_size '
                "FROM pg_get_wal_stats(%s, least(%s::pg_lsn, pg_current_wal_flush_lsn()), true) "
                "WHERE count > 0",
                [start, end],
            )
            for kind, count, fpi in cursor.fetchall():
                phase.records[kind] += count
                phase.fpi += fpi
        after = _table_counts(cursor)
        phase.tables = {
            name: tuple(
                a - b for a, b in zip(after[name], tables_before.get(name, (0, 0, 0)), strict=True)
            )
            for name in after
            if after[name] != tables_before.get(name)
        }
        if statements:
            cursor.execute(
                "SELECT calls, total_plan_time, total_exec_time, wal_bytes, wal_fpi, "
                "shared_blks_dirtied, left(regexp_replace(query, '\\s+', ' ', 'g'), 90) "
                "FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database "
                "WHERE datname = current_database()) AND query NOT LIKE '%%pg_stat%%' "
                "AND query NOT LIKE '%%pg_current_wal%%' AND query NOT LIKE '%%pg_backend%%' "
                "ORDER BY total_exec_time DESC LIMIT 8"
            )
            phase.statements = cursor.fetchall()
    phases.append(phase)


def report(phases: list[Phase], *, as_json: bool) -> None:
    if as_json:
        print(
            json.dumps(
                [
                    {
                        "phase": p.name,
                        "per": p.per,
                        "cpu_ms": p.cpu_ns / 1e6 / p.per,
                        "wal_bytes": p.wal / p.per,
                        "fpi_bytes": p.fpi / p.per,
                        "records": {k: v / p.per for k, v in p.records.items()},
                        "tables": {k: [x / p.per for x in v] for k, v in p.tables.items()},
                    }
                    for p in phases
                ]
            )
        )
        return
    print(f"{'phase':<34} {'CPU ms':>8} {'WAL B':>8} {'FPI B':>7}  WAL records / rows (per unit)")
    for p in phases:
        records = ", ".join(
            f"{kind.split('/', 1)[1].lower()} {count / p.per:.2g}"
            for kind, count in sorted(p.records.items())
            if kind.split("/")[0] in ("Heap", "Heap2", "Btree") and count / p.per >= 0.05
        )
        tables = ", ".join(
            f"{name.removeprefix('gateway_')} +{ins / p.per:.2g}/u{upd / p.per:.2g}"
            f"/hot{hot / p.per:.2g}"
            for name, (ins, upd, hot) in sorted(p.tables.items())
        )
        print(
            f"{p.name:<34} {p.cpu_ns / 1e6 / p.per:8.3f} {p.wal / p.per:8.0f} "
            f"{p.fpi / p.per:7.0f}  {records}"
        )
        if tables:
            print(f"{'':<34} {'':>8} {'':>8} {'':>7}  rows: {tables}")
        for calls, plan, execute, wal, _fpi, _dirtied, query in p.statements:
            if calls < 2:
                continue
            print(
                f"    {calls:6d} × plan {plan / calls:6.3f} + run {execute / calls:6.3f} ms, "
                f"WAL {int(wal) / calls:5.0f} B  {query}"
            )


def main() -> int:
    args = _arguments()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")
    import django

    django.setup()
    if args.no_prepare:
        from django.db import connection as default

        default.settings_dict["OPTIONS"]["prepare_threshold"] = None
    from django.core.management import call_command
    from django.db import connection

    if connection.vendor != "postgresql":
        print("pg_cost needs PostgreSQL (set DATABASE_URL)")
        return 2
    call_command("migrate", interactive=False, verbosity=0)
    if args.setup_sql:
        with connection.cursor() as cursor, open(args.setup_sql) as sql:
            cursor.execute(sql.read())
    cost = Cost(os.urandom(4).hex())
    try:
        cost.cycle(f"warm:{cost.run}", 20)
        if args.only_whole:
            cost.whole_effects(args.effects)
        else:
            cost.phases_of_an_effect(args.effects)
            cost.idle_passes(args.idle_calls)
    finally:
        cost.sandbox.stop()
    if not args.only_whole:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*), sum(generic_plans), sum(custom_plans) FROM pg_prepared_statements"
            )
            print("prepared statements (count, generic plans, custom plans):", cursor.fetchone())
    report(cost.phases, as_json=args.json)
    return 0


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--effects", type=int, default=400)
    parser.add_argument("--idle-calls", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--setup-sql", help="a file of SQL run after migrating (experiments)")
    parser.add_argument("--only-whole", action="store_true", help="only whole effects + seal")
    parser.add_argument(
        "--no-prepare",
        action="store_true",
        help="the hot statements planned at every execution (GATEWAY_DB_PREPARE=false)",
    )
    return parser.parse_args()


class Cost:
    """Effects through the API (Django's test client) and the fast path, against the sandbox
    provider in this process; the broker's messages dropped (the claims are made here)."""

    BODY: ClassVar[dict] = {"type": "ticket.create", "resource": {"type": "queue", "id": "cost"}}

    def __init__(self, run: str) -> None:
        from django.conf import settings
        from django.test import Client

        from gateway import hooks
        from gateway.providers.sandbox import SandboxProvider, SandboxServer
        from tests.conftest import PROVIDER_NAMES, issue_token

        self.run = run
        self.phases: list[Phase] = []
        token = issue_token("cost", f"cost-{run}", "agent")
        self.sandbox = SandboxServer(SandboxProvider(), port=0).start()
        settings.GATEWAY_PROVIDER_URLS = {
            name: self.sandbox.base_url(name) for name in PROVIDER_NAMES
        }
        # The broker is not what is measured: the messages are dropped (the claims come below).
        hooks.dispatch_sender.send = lambda value: None  # type: ignore[method-assign]
        self.client = Client(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION=f"Bearer {token}")

    def post(self, key: str) -> Any:
        return self.client.post(
            "/api/v1/commands",
            data=json.dumps({**self.BODY, "payload": {"title": key, "priority": "P4"}}),
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY=key,
        )

    def submit(self, key: str) -> str:
        response = self.post(key)
        assert response.status_code == 201, response.content
        return response.json()["effect_id"]

    def send_and_record(self, claim) -> None:
        """The provider call of a claimed effect and its record, as the drainer makes them."""
        from django.utils import timezone

        from gateway import fastpath, services
        from gateway.contracts import get_contract
        from gateway.integrity import verified_claimed_payload
        from gateway.models import Effect
        from gateway.providers.base import ExecuteRequest
        from gateway.providers.registry import adapter_for

        payload, problem = verified_claimed_payload(
            effect_id=claim.effect_id,
            sealed=claim.payload_sealed,
            type=claim.type,
            resource=claim.resource,
            digest=claim.payload_digest,
        )
        assert payload is not None, problem
        contract = get_contract(claim.type)
        assert contract is not None
        result = adapter_for(contract).execute(
            ExecuteRequest(
                effect_id=claim.effect_id,
                type=claim.type,
                idempotency_key=claim.provider_key,
                resource=claim.resource,
                payload=payload,
                payload_digest=claim.payload_digest,
                timeout=5,
            )
        )
        now = timezone.now()
        counts = Effect(attempt_count=claim.attempt_number, check_count=claim.check_count)
        fields = services.outcome_fields(counts, result, now=now)
        assert fastpath.record(claim=claim, result=result, worker="cost", fields=fields, now=now)

    def whole(self, prefix: str, n: int) -> None:
        """``n`` effects submitted, claimed, sent and recorded one after the other."""
        from gateway import fastpath

        for index in range(n):
            claim = fastpath.claim(effect_id=self.submit(f"{prefix}:{index}"), worker="cost")
            self.send_and_record(claim)

    def cycle(self, prefix: str, n: int) -> None:
        from gateway import audit

        self.whole(prefix, n)
        audit.seal_pending()

    def phase(self, name: str, per: int):
        """Measure the block as the phase ``name``, its figures per ``per`` (:func:`measured`)."""
        from django.db import connection

        return measured(connection, name, per, self.phases)

    def whole_effects(self, n: int) -> None:
        """``--only-whole``: three rounds of whole effects, each followed by its seal."""
        from gateway import audit

        for round_ in range(3):
            with self.phase(f"whole effect #{round_ + 1}", n):
                self.whole(f"whole{round_}:{self.run}", n)
            with self.phase(f"seal of those #{round_ + 1}", n):
                audit.seal_pending()

    def phases_of_an_effect(self, n: int) -> None:
        """Submit, replay, claim, call + record and seal, each phase over ``n`` effects; then
        the sequencer in passes and whole effects again."""
        from gateway import audit, fastpath

        run = self.run
        with self.phase("submit (API)", n):
            ids = [self.submit(f"cost:{run}:{index}") for index in range(n)]
        with self.phase("replay (API)", n):
            for index in range(n):
                self.post(f"cost:{run}:{index}")
        with self.phase("claim", n):
            claims = [fastpath.claim(effect_id=effect_id, worker="cost") for effect_id in ids]
        with self.phase("provider call + record", n):
            for claim in claims:
                self.send_and_record(claim)
        with self.phase("audit seal, per effect (3 events)", n):
            audit.seal_pending()
        # The sequencer's pass at the bench's rate: 0.5 s of 100 effects/s is 50 effects.
        per_pass = 50
        with self.phase(f"audit seal in passes of {per_pass} effects", n):
            for start in range(0, n, per_pass):
                self.cycle(f"pass:{run}:{start}", min(per_pass, n - start))
        # Whole effects again, as the bench runs them, for the per-effect total.
        with self.phase("whole effect (submit+claim+record)", n):
            self.whole(f"whole:{run}", n)
        with self.phase("seal of those", n):
            audit.seal_pending()

    def idle_passes(self, calls: int) -> None:
        """Every periodic task with nothing due, ``calls`` times each (after one unmeasured)."""
        from gateway.recovery import attempts_close_abandoned
        from gateway.tasks import seal_audit, sweep_dispatch
        from gateway.webhooks.tasks import sweep_webhooks
        from reconciliation.services import effects_recover_expired_leases
        from reconciliation.services.reconciler import reconcile_due
        from sagas.tasks import sweep_sagas

        idle = {
            "idle: seal_audit": lambda: seal_audit(),
            "idle: sweep_dispatch": lambda: sweep_dispatch(),
            "idle: recover_leases": lambda: (
                effects_recover_expired_leases() + attempts_close_abandoned()
            ),
            "idle: reconcile_due": lambda: reconcile_due(time_budget=0),
            "idle: sweep_sagas": lambda: sweep_sagas(),
            "idle: sweep_webhooks": lambda: sweep_webhooks(),
        }
        for name, call in idle.items():
            call()
            with self.phase(name, calls):
                for _ in range(calls):
                    call()


if __name__ == "__main__":
    started = time.perf_counter()
    code = main()
    print(f"({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    sys.exit(code)
