"""Provider health with a month of history: a million attempts and a million lookups (as many
as a million effects leave), written in time order, of which the last hour is a few
thousand. Prints how long ``provider_health`` takes and each query's plan; asserts only that
the attempts and the lookups are read through their time indexes (BRIN ``attempt_started``,
partial ``record_recent_lookup``), not by a scan of the tables.

    .venv/bin/pytest -n 0 -s -m slow tests/benchmarks/test_bench_provider_health.py
    PROVIDER_HEALTH_ROWS=200000 …   (fewer rows, for a quick look)
"""

from __future__ import annotations

import os
import statistics
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from gateway.providers.health import provider_health
from tests.console.conftest import REFUND, TICKET, person, set_state, submit

ROWS = int(os.environ.get("PROVIDER_HEALTH_ROWS", "1000000"))
EFFECTS = 200


def write_history(ids: list[str], tenant_id: int) -> None:
    """ROWS attempts and ROWS lookups of ``ids`` spread over 30 days, oldest first (as they
    are written), the last hour included."""
    from gateway.models import Attempt, Effect
    from reconciliation.models import ReconciliationRecord

    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {Attempt._meta.db_table}
              (effect_id, number, fence, worker, state, outcome, http_status,
               provider_operation_id, error, started_at, finished_at)
            SELECT (%(ids)s::text[])[1 + (g %% %(n)s)], 100 + g / %(n)s, 1, 'bench', 'finished',
                   CASE WHEN g %% 10 = 0 THEN 'unknown' ELSE 'confirmed' END,
                   CASE WHEN g %% 10 = 0 THEN NULL ELSE 201 END, '', '',
                   now() - interval '30 days' * (1 - g::float / %(rows)s),
                   now() - interval '30 days' * (1 - g::float / %(rows)s)
                         + interval '120 milliseconds'
              FROM generate_series(1, %(rows)s) AS g
            """,
            {"ids": ids, "n": EFFECTS, "rows": ROWS},
        )
        cursor.execute(
            f"""
            INSERT INTO {ReconciliationRecord._meta.db_table}
              (tenant_id, effect_id, kind, lookup_by, lookup_status, provider_operation_id,
               provider_status, provider_digest, effect_status, outcome, check_number, actor,
               evidence, created_at)
            SELECT %(tenant)s, (%(ids)s::text[])[1 + (g %% %(n)s)], 'lookup', 'idempotency_key',
                   CASE WHEN g %% 7 = 0 THEN 'unreachable' ELSE 'found' END, '', '', '',
                   'UNKNOWN', 'inconclusive', 1, 'bench', 'bench',
                   now() - interval '30 days' * (1 - g::float / %(rows)s)
              FROM generate_series(1, %(rows)s) AS g
            """,
            {"ids": ids, "n": EFFECTS, "rows": ROWS, "tenant": tenant_id},
        )
        cursor.execute(f"ANALYZE {Attempt._meta.db_table}")
        cursor.execute(f"ANALYZE {ReconciliationRecord._meta.db_table}")
        cursor.execute(f"ANALYZE {Effect._meta.db_table}")


@pytest.mark.slow
def test_provider_health_reads_only_the_last_hour(db):
    from gateway.capabilities import capability_grant
    from gateway.models import Attempt

    agent = person("acme", "refund-bot", "agent").principal
    capability_grant(granted_by="test", principal=agent, effect_types=["*"])
    effects = [
        set_state(
            submit(agent, body, resource={**body["resource"], "id": f"b{n}"}),
            status="UNKNOWN",
        )
        for n in range(EFFECTS)
        for body in [REFUND if n % 2 else TICKET]
    ]
    ids = [e.pk for e in effects]
    started = time.perf_counter()
    write_history(ids, agent.tenant_id)
    spent = time.perf_counter() - started
    print(f"\n{ROWS:,} attempts and {ROWS:,} lookups written in {spent:.1f} s")

    timings = []
    for _ in range(7):
        begun = time.perf_counter()
        health = provider_health(agent.tenant_id, now=timezone.now())
        timings.append((time.perf_counter() - begun) * 1000)
    billing = health["billing"]
    print(
        f"provider_health: median {statistics.median(timings):.1f} ms, "
        f"max {max(timings):.1f} ms over 7 runs; billing: {billing.sends.calls} sends, "
        f"{billing.lookups.calls} lookups in the last hour"
    )
    assert billing.sends.calls > 0 and billing.lookups.calls > 0
    assert billing.sends.calls < ROWS / 100

    with CaptureQueriesContext(connection) as queries:
        provider_health(agent.tenant_id)
    plans = []
    for query in queries.captured_queries:
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, COSTS OFF) " + query["sql"])
            plan = "\n".join(row[0] for row in cursor.fetchall())
        print(plan, end="\n\n")
        plans.append(plan)
    attempts, lookups = plans[0], plans[1]
    assert "attempt_started" in attempts and f"Seq Scan on {Attempt._meta.db_table}" not in attempts
    assert "record_recent_lookup" in lookups
