"""A ledger of thousands of settled effects in one statement per table, and what a statement
reads from it.

The flatness tests (test_flat_*.py) load a few thousand rows inside the test's transaction,
ANALYZE them (allowed in a transaction; rolled back with it), run a page or a pass under
``CaptureQueriesContext`` and replay each read with ``EXPLAIN ANALYZE``: a statement that
reads only its page reads tens of rows, one that walks the ledger reads all of them. Rows
read, not milliseconds: the test must fail on the old plan on any machine, never on a slow
one. tests/benchmarks/ledger_scale.py measures the same paths at 1 M and 5 M effects.
"""

from __future__ import annotations

import json

from django.db import connection

# The tables that grow with the ledger.
LEDGER_TABLES = (
    "gateway_command",
    "gateway_effect",
    "gateway_effectevent",
    "gateway_attempt",
    "gateway_receipt",
    "reconciliation_reconciliationrecord",
    "reconciliation_case",
)


def load_history(*, tenant_id: int, principal_id: int, effects: int) -> None:
    """``effects`` confirmed effects of the tenant, older than anything the test submits
    (their ids sort first), each with a receipt and a day-old reconciler lookup, and every
    third a charge naming its customer; then ANALYZE."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO gateway_command (effect_id, tenant_id, type, provider, idempotency_key,
                provider_key, payload_digest, resource, resource_type, resource_id,
                resource_version, payload_sealed, payload_redacted, intent, context,
                requested_by_id, capability_id, budget_amount, approval_required,
                compensates_id, saga_id, saga_step, expires_at, created_at)
            SELECT 'eff_' || lpad(g::text, 26, '0'), %(tenant)s,
                   (ARRAY['ticket.create', 'billing.charge.create',
                          'deployment.release.promote'])[1 + g %% 3],
                   (ARRAY['tickets', 'billing', 'deploy'])[1 + g %% 3],
                   'history-' || g, 'acme:history-' || g,
                   'sha256:' || md5(g::text) || md5(g::text || 'x'),
                   jsonb_build_object('type', 'order', 'id', 'ord_h' || g), 'order',
                   'ord_h' || g, NULL, 'sealed',
                   CASE g %% 3 WHEN 1 THEN jsonb_build_object('customer_id', 'cus_h' || g)
                               WHEN 2 THEN '{"environment": "production"}'::jsonb
                               ELSE '{}'::jsonb END,
                   '{}', '{}', %(principal)s, NULL, 0, false, NULL, '', '',
                   now() - interval '1 day', now() - interval '2 days'
              FROM generate_series(1, %(n)s) AS g;
            INSERT INTO gateway_effect (effect_id, tenant_id, type, owner, status,
                status_changed_at, fence, attempt_count, check_count, frozen, mismatch,
                escalated, provider_operation_id, confirmed_at, approval_state,
                approved_digest, created_at, updated_at)
            SELECT effect_id, tenant_id, type, 'history', 'CONFIRMED', created_at, 1, 1, 1,
                   false, false, false, 'op_h' || substr(effect_id, 5), created_at,
                   'not_required', '', created_at, created_at
              FROM gateway_command WHERE idempotency_key LIKE 'history-%%';
            INSERT INTO gateway_receipt (effect_id, attempt_id, source, provider,
                provider_operation_id, provider_status, payload_digest, digest_matches,
                result, result_digest, received_at, seal)
            SELECT effect_id, NULL, 'reconciler', provider, 'rop_h' || substr(effect_id, 5),
                   'succeeded', payload_digest, true, '{}', 'sha256:x', created_at, ''
              FROM gateway_command WHERE idempotency_key LIKE 'history-%%';
            INSERT INTO reconciliation_reconciliationrecord (tenant_id, effect_id, kind,
                lookup_by, lookup_status, provider_operation_id, provider_status,
                provider_digest, effect_status, outcome, check_number, actor, evidence,
                created_at)
            SELECT tenant_id, effect_id, 'lookup', 'idempotency_key', 'found', '',
                   'succeeded', '', 'UNKNOWN', 'confirmed', 1, 'reconciler', 'found',
                   now() - interval '1 day'
              FROM gateway_command WHERE idempotency_key LIKE 'history-%%';
            """,
            {"tenant": tenant_id, "principal": principal_id, "n": effects},
        )
        for table in LEDGER_TABLES:
            cursor.execute(f"ANALYZE {table}")


def rows_read(sql: str) -> dict[str, int]:
    """Rows each ledger table gave up to the statement (kept or filtered out), replaying it
    under EXPLAIN ANALYZE. Reads only: a write is not replayed."""
    head = sql.lstrip().upper()
    if not head.startswith("SELECT") or "FOR UPDATE" in head:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}")
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    read: dict[str, int] = {}
    nodes = [plan[0]["Plan"]]
    while nodes:
        node = nodes.pop()
        nodes.extend(node.get("Plans", []))
        table = node.get("Relation Name")
        if table in LEDGER_TABLES:
            rows = (
                node.get("Actual Rows", 0)
                + node.get("Rows Removed by Filter", 0)
                + node.get("Rows Removed by Index Recheck", 0)
            ) * node.get("Actual Loops", 1)
            read[table] = read.get(table, 0) + int(rows)
    return read


def most_read(queries) -> tuple[int, str]:
    """The largest number of rows one captured statement read from one ledger table, and
    that statement."""
    worst, which = 0, ""
    for query in queries.captured_queries:
        for _table, rows in rows_read(query["sql"]).items():
            if rows > worst:
                worst, which = rows, query["sql"]
    return worst, which
