"""What PostgreSQL spends per effect, statement by statement (issue 12).

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
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")
    import django

    django.setup()
    from django.conf import settings

    if args.no_prepare:
        from django.db import connection as default

        default.settings_dict["OPTIONS"]["prepare_threshold"] = None
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client

    from gateway import audit, fastpath, hooks, services
    from gateway.integrity import verified_claimed_payload
    from gateway.models import Effect
    from gateway.providers.base import ExecuteRequest
    from gateway.providers.registry import adapter_for
    from gateway.providers.sandbox import SandboxProvider, SandboxServer
    from tests.conftest import PROVIDER_NAMES, issue_token

    if connection.vendor != "postgresql":
        print("pg_cost needs PostgreSQL (set DATABASE_URL)")
        return 2
    call_command("migrate", interactive=False, verbosity=0)
    if args.setup_sql:
        with connection.cursor() as cursor, open(args.setup_sql) as sql:
            cursor.execute(sql.read())
    run = os.urandom(4).hex()
    token = issue_token("cost", f"cost-{run}", "agent")
    sandbox = SandboxServer(SandboxProvider(), port=0).start()
    settings.GATEWAY_PROVIDER_URLS = {name: sandbox.base_url(name) for name in PROVIDER_NAMES}
    # The broker is not what is measured: the messages are dropped (the claims come below).
    hooks.dispatch_sender.send = lambda value: None  # type: ignore[method-assign]
    client = Client(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION=f"Bearer {token}")
    body = {"type": "ticket.create", "resource": {"type": "queue", "id": "cost"}}

    def submit(key: str) -> str:
        response = client.post(
            "/api/v1/commands",
            data=json.dumps({**body, "payload": {"title": key, "priority": "P4"}}),
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY=key,
        )
        assert response.status_code == 201, response.content
        return response.json()["effect_id"]

    def send_and_record(claim) -> None:
        payload, problem = verified_claimed_payload(
            effect_id=claim.effect_id,
            sealed=claim.payload_sealed,
            type=claim.type,
            resource=claim.resource,
            digest=claim.payload_digest,
        )
        assert payload is not None, problem
        from gateway.contracts import get_contract

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
        from django.utils import timezone

        now = timezone.now()
        counts = Effect(attempt_count=claim.attempt_number, check_count=claim.check_count)
        fields = services.outcome_fields(counts, result, now=now)
        assert fastpath.record(claim=claim, result=result, worker="cost", fields=fields, now=now)

    def cycle(prefix: str, n: int) -> None:
        for index in range(n):
            claim = fastpath.claim(effect_id=submit(f"{prefix}:{index}"), worker="cost")
            send_and_record(claim)
        audit.seal_pending()

    cycle(f"warm:{run}", 20)
    phases: list[Phase] = []
    n = args.effects
    if args.only_whole:
        for round_ in range(3):
            with measured(connection, f"whole effect #{round_ + 1}", n, phases):
                for index in range(n):
                    claim = fastpath.claim(
                        effect_id=submit(f"whole{round_}:{run}:{index}"), worker="cost"
                    )
                    send_and_record(claim)
            with measured(connection, f"seal of those #{round_ + 1}", n, phases):
                audit.seal_pending()
        sandbox.stop()
        report(phases, as_json=args.json)
        return 0
    with measured(connection, "submit (API)", n, phases):
        ids = [submit(f"cost:{run}:{index}") for index in range(n)]
    with measured(connection, "replay (API)", n, phases):
        for index in range(n):
            client.post(
                "/api/v1/commands",
                data=json.dumps(
                    {**body, "payload": {"title": f"cost:{run}:{index}", "priority": "P4"}}
                ),
                content_type="application/json",
                HTTP_IDEMPOTENCY_KEY=f"cost:{run}:{index}",
            )
    with measured(connection, "claim", n, phases):
        claims = [fastpath.claim(effect_id=effect_id, worker="cost") for effect_id in ids]
    with measured(connection, "provider call + record", n, phases):
        for claim in claims:
            send_and_record(claim)
    with measured(connection, "audit seal, per effect (3 events)", n, phases):
        audit.seal_pending()
    # The sequencer's pass at the bench's rate: 0.5 s of 100 effects/s is 50 effects.
    per_pass = 50
    with measured(connection, f"audit seal in passes of {per_pass} effects", n, phases):
        for start in range(0, n, per_pass):
            for index in range(start, min(n, start + per_pass)):
                claim = fastpath.claim(effect_id=submit(f"pass:{run}:{index}"), worker="cost")
                send_and_record(claim)
            audit.seal_pending()
    # Whole effects again, as the bench runs them, for the per-effect total.
    with measured(connection, "whole effect (submit+claim+record)", n, phases):
        for index in range(n):
            claim = fastpath.claim(effect_id=submit(f"whole:{run}:{index}"), worker="cost")
            send_and_record(claim)
    with measured(connection, "seal of those", n, phases):
        audit.seal_pending()

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
        with measured(connection, name, args.idle_calls, phases):
            for _ in range(args.idle_calls):
                call()
    sandbox.stop()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), sum(generic_plans), sum(custom_plans) FROM pg_prepared_statements"
        )
        print("prepared statements (count, generic plans, custom plans):", cursor.fetchone())
    report(phases, as_json=args.json)
    return 0


if __name__ == "__main__":
    started = time.perf_counter()
    code = main()
    print(f"({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    sys.exit(code)
