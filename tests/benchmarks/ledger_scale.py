"""How the ledger's hot queries behave with a million effects (PostgreSQL).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/eg_scale \
        .venv/bin/python -m tests.benchmarks.ledger_scale --effects 1000000

Loads N effects into one tenant with ``INSERT … SELECT generate_series`` (about 1% UNKNOWN, 1%
IN_PROGRESS, a few hundred mismatched or escalated, the rest settled) and one event per effect,
which the audit sequencer seals; then times — median of 7 runs through Django, warm cache — the
queries the API, the console, the workers and the sequencer run, and prints each one's
execution time in the server (EXPLAIN ANALYZE) and the scans of its plan. Use a scratch
database: the ledger refuses deletes, so the rows stay.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--effects", type=int, default=1_000_000)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from gateway.lib.vault import seal_json
    from gateway.models import Effect, Principal, Tenant

    if connection.vendor != "postgresql":
        print("ledger_scale needs PostgreSQL (set DATABASE_URL)")
        return 2
    call_command("migrate", interactive=False, verbosity=0)
    tenant, _ = Tenant.objects.get_or_create(slug="scale")
    principal, _ = Principal.objects.get_or_create(
        tenant=tenant, name="scale-bot", defaults={"role": "agent"}
    )
    have = Effect.objects.filter(tenant=tenant).count()
    if have < args.effects:
        started = time.perf_counter()
        _load(connection, tenant.pk, principal.pk, have, args.effects, seal_json({"x": 1}))
        print(f"loaded {args.effects - have} effects in {time.perf_counter() - started:.1f}s")
    from gateway import audit
    from gateway.models import EffectEvent

    events = EffectEvent.objects.filter(tenant=tenant).count()
    if events < args.effects:
        # One event per effect, sealed by the audit sequencer as it would be.
        started = time.perf_counter()
        _load_events(connection, tenant.pk, events, args.effects)
        print(f"loaded {args.effects - events} events in {time.perf_counter() - started:.1f}s")
    if audit.seal_state(tenant.pk).unsealed:
        with connection.cursor() as cursor:  # statistics first: the read is in txid order
            cursor.execute("ANALYZE gateway_effectevent; ANALYZE gateway_auditbatch;")
        started = time.perf_counter()
        sealed = audit.seal_pending()
        print(f"sealed {sealed} events in {time.perf_counter() - started:.1f}s")
    with connection.cursor() as cursor:
        cursor.execute(
            "ANALYZE gateway_effect; ANALYZE gateway_command; ANALYZE gateway_effectevent; "
            "ANALYZE gateway_auditbatch;"
        )
    total = Effect.objects.filter(tenant=tenant).count()
    print(f"tenant 'scale' holds {total} effects")

    now = timezone.now()
    newest = Effect.objects.filter(tenant=tenant).order_by("-command_id")
    deep_cursor = newest.values_list("command_id", flat=True)[total // 2]
    from datetime import timedelta

    from gateway.console.selectors import effects_for_triage
    from gateway.models import Attempt, Command, Receipt

    some = newest.values_list("command_id", flat=True)[total // 3]
    queries = {
        "API list, newest first, page 1": newest[:50],
        "API list, page at depth N/2 (cursor)": newest.filter(command_id__lt=deep_cursor)[:50],
        "API list ?status=UNKNOWN": newest.filter(status="UNKNOWN")[:50],
        "API list ?type=billing.refund.create": newest.filter(type="billing.refund.create")[:50],
        "console triage, oldest first": effects_for_triage(principal=principal, now=now).order_by(
            "command_id"
        )[:50],
        "console triage count": None,
        "reconciler: due lookups": Effect.objects.filter(
            status__in=["UNKNOWN", "IN_PROGRESS"], next_check_at__lte=now
        ).order_by("next_check_at")[:50],
        "dispatch sweeper: due effects": Effect.objects.filter(
            status__in=["PREPARED", "NOT_STARTED"], next_dispatch_at__lte=now, frozen=False
        ).order_by("next_dispatch_at")[:500],
        "dispatch sweeper: expiry pass": Effect.objects.select_related("command").filter(
            status__in=["PREPARED", "NOT_STARTED", "AWAITING_APPROVAL"],
            command__expires_at__lte=now,
        )[:500],
        "lease recovery": Effect.objects.filter(
            status="DISPATCHING", lease_expires_at__lte=now + timedelta(days=1)
        ).order_by("lease_expires_at")[:500],
        "recovery: abandoned attempts": Attempt.objects.filter(
            state="sending", started_at__lt=now
        ).values_list("pk", flat=True)[:500],
        "console effect: its events": EffectEvent.objects.filter(effect_id=some).order_by("id"),
        "console effect: its receipts": Receipt.objects.filter(effect_id=some).order_by(
            "-received_at", "-id"
        )[:1],
        "console effect: its compensations": Command.objects.filter(compensates_id=some),
        "provider webhook: command by key": Command.objects.filter(
            provider="tickets", provider_key="scale:scale-7"
        ),
        "audit sequencer: pass, nothing to seal": "seal_pending",
        "audit: sealed head and lag (console)": "seal_state",
    }
    print(f"{'query':<42} {'median ms':>10}  server: plan")
    for name, query in queries.items():
        run: Callable[[], object]
        if query is None:
            run = effects_for_triage(principal=principal, now=now).count
            sql_plan = "count"
        elif query == "seal_pending":
            run = audit.seal_pending
            sql_plan = _plan_sql(connection, audit._TENANTS_WITH_WORK, {"shard": 0, "shards": 1})
        elif query == "seal_state":
            run = partial(audit.seal_state, tenant.pk)
            sql_plan = _plan_sql(connection, audit._SEAL_STATE, {"tenant": tenant.pk})
        else:
            run = partial(_fetch, query)
            sql_plan = _plan(connection, query)
        timings = []
        for _ in range(7):
            started = time.perf_counter()
            run()
            timings.append((time.perf_counter() - started) * 1000)
        print(f"{name:<42} {statistics.median(timings):>10.2f}  {sql_plan}")
    return 0


def _fetch(query) -> list:
    return list(query.all())


def _plan(connection, query) -> str:
    sql, params = query.query.sql_with_params()
    return _plan_sql(connection, sql, params)


def _plan_sql(connection, sql, params) -> str:
    """The server's execution time and the plan's scans, in plan order:
    ``0.05 ms: Index Scan Backward gateway_effect_pkey; …``."""
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE) " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    server = re.search(r"Execution Time: ([\d.]+) ms", plan)
    scans = re.findall(
        r"((?:Bitmap |Parallel )?(?:Index Only Scan|Index Scan|Seq Scan)(?: Backward)?)"
        r"(?: using (\w+))?(?: on (\w+))?",
        plan,
    )
    named = [f"{kind} {index or table}" for kind, index, table in scans]
    return f"{float(server.group(1)) if server else float('nan'):.2f} ms: " + "; ".join(
        dict.fromkeys(named)
    )


def _load(connection, tenant_id: int, principal_id: int, start: int, end: int, sealed: str) -> None:
    """Commands and effects in bulk, in batches of 100k, ids in time order."""
    batch = 100_000
    for low in range(start, end, batch):
        high = min(end, low + batch)
        with connection.cursor() as cursor:
            cursor.execute(
                """
                INSERT INTO gateway_command (effect_id, tenant_id, type, provider,
                    idempotency_key, provider_key, payload_digest, resource, resource_type,
                    resource_id, payload_sealed, payload_redacted, intent, context,
                    requested_by_id, approval_required, expires_at, created_at, saga_id,
                    saga_step, budget_amount)
                SELECT 'eff_SCALE' || lpad(g::text, 17, '0'), %(tenant)s,
                    (ARRAY['ticket.create','billing.refund.create','shipment.create',
                           'email.message.send'])[1 + g %% 4],
                    'tickets', 'scale-' || g, 'scale:scale-' || g, 'sha256:' || md5(g::text),
                    '{"type": "queue", "id": "scale"}', 'queue', 'scale', %(sealed)s,
                    '{"title": "x"}', '{}', '{}', %(principal)s, false,
                    now() + interval '1 day', now() - (%(end)s - g) * interval '1 second',
                    '', '', 0
                FROM generate_series(%(low)s, %(high)s - 1) AS g;
                INSERT INTO gateway_effect (effect_id, tenant_id, type, owner, status,
                    status_changed_at, fence, attempt_count, check_count, frozen, mismatch,
                    escalated, provider_operation_id, approval_state, approved_digest,
                    created_at, updated_at,
                    next_check_at)
                SELECT 'eff_SCALE' || lpad(g::text, 17, '0'), %(tenant)s,
                    (ARRAY['ticket.create','billing.refund.create','shipment.create',
                           'email.message.send'])[1 + g %% 4],
                    (ARRAY['support-tools','billing-oncall','fulfillment-oncall',
                           'lifecycle-messaging'])[1 + g %% 4],
                    CASE WHEN g %% 100 = 0 THEN 'UNKNOWN' WHEN g %% 100 = 1 THEN 'IN_PROGRESS'
                         WHEN g %% 100 = 2 THEN 'REJECTED' ELSE 'CONFIRMED' END,
                    now() - (%(end)s - g) * interval '1 second', 1, 1, 0, false,
                    g %% 5000 = 3, g %% 5000 = 4, 'op_' || g, 'not_required', '',
                    now() - (%(end)s - g) * interval '1 second', now(),
                    CASE WHEN g %% 100 IN (0, 1) THEN now() + (g %% 600) * interval '1 second'
                    END
                FROM generate_series(%(low)s, %(high)s - 1) AS g;
                """,
                {
                    "tenant": tenant_id,
                    "principal": principal_id,
                    "sealed": sealed,
                    "low": low,
                    "high": high,
                    "end": end,
                },
            )
        print(f"  loaded {high}/{end}", flush=True)


def _load_events(connection, tenant_id: int, start: int, end: int) -> None:
    """One ``submitted`` event per loaded effect, unsealed (the caller has the sequencer seal
    them), a thousand per transaction: the ledger's transactions write a few events each, and
    the sequencer reads in transaction order (a single transaction of a million events would
    be sealed in quadratic time, see gateway.audit)."""
    step = 1000
    for low in range(start, end, step):
        high = min(end, low + step)
        with connection.cursor() as cursor:
            cursor.execute(
                """
                INSERT INTO gateway_effectevent (tenant_id, effect_id, subject, kind,
                    from_status, to_status, actor, reason, data, created_at)
                SELECT %(tenant)s, 'eff_SCALE' || lpad(g::text, 17, '0'), '', 'submitted',
                    '', 'PREPARED', 'agent:scale-bot', '', '{}',
                    now() - (%(end)s - g) * interval '1 second'
                FROM generate_series(%(low)s, %(high)s - 1) AS g
                """,
                {"tenant": tenant_id, "low": low, "high": high, "end": end},
            )
        if high % 100_000 == 0 or high == end:
            print(f"  loaded events {high}/{end}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
