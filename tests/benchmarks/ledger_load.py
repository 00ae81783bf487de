"""A ledger of N effects written in bulk, in the shape the gateway itself leaves behind.

Used by ``tests/benchmarks/ledger_scale.py``, in a scratch database of its own (the ledger
refuses DELETE and TRUNCATE, so the rows stay until the database is dropped).

What is written, per tenant ``scale`` and its agent ``scale-bot``:

- **history**: N settled effects, one every half second up to a minute ago, with every row
  the gateway writes for them: the command (sealed payload, redacted payload, digest computed
  as the gateway computes it, so that a history key replays), the effect, its events (about 3
  per effect, sealed into the tenant's chain), its attempts (about 1), its receipts (about 1),
  the reconciler's records and the closed cases. Per thousand: 965 confirmed at the first
  attempt, 15 after an approval, 8 after an UNKNOWN settled by lookup, 5 after a NOT_STARTED
  retry, 4 rejected, 1 cancelled, 1 expired, 1 mismatch resolved by an operator.
- **the open queue**, the same at every N: 300 UNKNOWN waiting for their next lookup, 100
  IN_PROGRESS (most overdue), 25 mismatches and 25 escalations with open cases, 50 waiting
  for an approver, spread over the last six hours. What needs a human does not grow with
  the history: it grows with what arrives and is not yet settled.

Ids are the gateway's own layout (``eff_`` + 10 characters of milliseconds + 16 more,
Crockford base32), so the history sorts before anything submitted later. The loaded events
are named by audit batches of 1000 in (txid, id) order, as the sequencer would have sealed
them, but with placeholder links (zeros: ``verify_audit`` would report a break; computing
them costs 3 200 events a second): what reads the chain by position (the /metrics tally,
reconciliation/tally.py) sees the history as a real ledger has it; the chain head's
transaction floor is raised above them, so the sequencer seals only what comes after.

How: ``INSERT … SELECT`` over ``generate_series`` in batches, with the foreign-key triggers
off (``session_replication_role = replica``: every reference is generated consistent), the
secondary indexes dropped during the load and rebuilt after it, then VACUUM ANALYZE (the
visibility map an index-only scan needs, as autovacuum would leave it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

TENANT = "scale"
AGENT = "scale-bot"
ONCALL = "scale-oncall"
APPROVER = "scale-approver"
STEP_SECONDS = 0.5  # one effect every half second: 5 M effects are 29 days of history
BATCH = 250_000
# The big tables: their secondary indexes are dropped for the load and rebuilt after it.
TABLES = (
    "gateway_command",
    "gateway_effect",
    "gateway_effectevent",
    "gateway_attempt",
    "gateway_receipt",
    "reconciliation_reconciliationrecord",
    "reconciliation_case",
)
EVENT_STRIDE = 8  # event ids: base + 8 × effect + step (gaps are harmless)
ATTEMPT_STRIDE = 2


@dataclass(frozen=True)
class Kind:
    """One way an effect's life went, and every row it left."""

    name: str
    status: str
    # (event kind, from, to, actor): "agent", "worker", "approver", "reconciler", "operator",
    # "sweeper"
    steps: tuple[tuple[str, str, str, str], ...]
    attempts: int = 1
    last_outcome: str = "confirmed"  # of the last attempt; the ones before: not_started
    receipt: str = ""  # its source, "" for none
    receipt_matches: bool = True
    provider_status: str = "succeeded"
    approval: str = "not_required"
    checks: int = 0
    mismatch: bool = False
    escalated: bool = False
    next_check: str | None = None  # an interval from now, for the open queue
    record: tuple[str, str] | None = None  # (kind, outcome) of one reconciliation record
    case: tuple[str, str] | None = None  # (reason, state)
    settle: str = "80 milliseconds"  # from creation to the last status change


_SUBMIT = ("submitted", "", "PREPARED", "agent")
_CLAIM = ("claimed", "PREPARED", "DISPATCHING", "worker")


def _sent(to: str) -> tuple[str, str, str, str]:
    return ("dispatched", "DISPATCHING", to, "worker")


KINDS = {
    kind.name: kind
    for kind in (
        Kind("ok", "CONFIRMED", (_SUBMIT, _CLAIM, _sent("CONFIRMED")), receipt="dispatch"),
        Kind(
            "approved",
            "CONFIRMED",
            (
                ("submitted", "", "AWAITING_APPROVAL", "agent"),
                ("approved", "AWAITING_APPROVAL", "PREPARED", "approver"),
                _CLAIM,
                _sent("CONFIRMED"),
            ),
            receipt="dispatch",
            approval="approved",
            settle="7 minutes",
        ),
        Kind(
            "reconciled",
            "CONFIRMED",
            (
                _SUBMIT,
                _CLAIM,
                _sent("UNKNOWN"),
                ("reconciled", "UNKNOWN", "CONFIRMED", "reconciler"),
            ),
            last_outcome="unknown",
            receipt="reconciler",
            checks=1,
            record=("lookup", "confirmed"),
            settle="5 seconds",
        ),
        Kind(
            "retried",
            "CONFIRMED",
            (
                _SUBMIT,
                _CLAIM,
                _sent("NOT_STARTED"),
                ("claimed", "NOT_STARTED", "DISPATCHING", "worker"),
                _sent("CONFIRMED"),
            ),
            attempts=2,
            receipt="dispatch",
            settle="2 seconds",
        ),
        Kind("rejected", "REJECTED", (_SUBMIT, _CLAIM, _sent("REJECTED")), last_outcome="rejected"),
        Kind(
            "cancelled",
            "CANCELLED",
            (
                ("submitted", "", "AWAITING_APPROVAL", "agent"),
                ("cancelled", "AWAITING_APPROVAL", "CANCELLED", "approver"),
            ),
            attempts=0,
            approval="pending",
            settle="20 minutes",
        ),
        Kind(
            "expired",
            "EXPIRED",
            (_SUBMIT, ("expired", "PREPARED", "EXPIRED", "sweeper")),
            attempts=0,
            settle="1 hour",
        ),
        Kind(
            "fixed",
            "CONFIRMED",
            (_SUBMIT, _CLAIM, _sent("UNKNOWN"), ("resolved", "UNKNOWN", "CONFIRMED", "operator")),
            receipt="dispatch",
            receipt_matches=False,
            record=("manual", "confirmed"),
            case=("mismatch", "resolved"),
            settle="3 hours",
        ),
        # The open queue.
        Kind(
            "open_unknown",
            "UNKNOWN",
            (_SUBMIT, _CLAIM, _sent("UNKNOWN")),
            last_outcome="unknown",
            checks=2,
            next_check="7 days",
            record=("lookup", "inconclusive"),
            settle="1 second",
        ),
        Kind(
            "open_in_progress",
            "IN_PROGRESS",
            (_SUBMIT, _CLAIM, _sent("IN_PROGRESS")),
            last_outcome="in_progress",
            receipt="dispatch",
            provider_status="processing",
            checks=1,
            next_check="7 days",
            settle="1 second",
        ),
        Kind(
            "open_mismatch",
            "UNKNOWN",
            (_SUBMIT, _CLAIM, _sent("UNKNOWN")),
            receipt="dispatch",
            receipt_matches=False,
            checks=1,
            mismatch=True,
            record=("lookup", "mismatch"),
            case=("mismatch", "open"),
            settle="1 second",
        ),
        Kind(
            "open_escalated",
            "UNKNOWN",
            (_SUBMIT, _CLAIM, _sent("UNKNOWN")),
            last_outcome="unknown",
            checks=8,
            escalated=True,
            record=("lookup", "escalated"),
            case=("lookup_budget_exhausted", "open"),
            settle="1 second",
        ),
        Kind(
            "open_approval",
            "AWAITING_APPROVAL",
            (("submitted", "", "AWAITING_APPROVAL", "agent"),),
            attempts=0,
            approval="pending",
            settle="0 seconds",
        ),
    )
}

# Per thousand effects of history: (upper bound of g % 1000, kind).
HISTORY = (
    (965, "ok"),
    (980, "approved"),
    (988, "reconciled"),
    (993, "retried"),
    (997, "rejected"),
    (998, "cancelled"),
    (999, "expired"),
    (1000, "fixed"),
)
OPEN_QUEUE = (
    (300, "open_unknown"),
    (100, "open_in_progress"),
    (25, "open_mismatch"),
    (25, "open_escalated"),
    (50, "open_approval"),
)
OPEN_TOTAL = sum(count for count, _ in OPEN_QUEUE)
OPEN_SPREAD_SECONDS = 6 * 3600

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def _base32_sql(expr: str, chars: int) -> str:
    """SQL for ``chars`` Crockford base32 characters of the bigint ``expr``, most significant
    first (gateway.lib.ids)."""
    return " || ".join(
        f"substr('{_ALPHABET}', (({expr} >> {5 * (chars - 1 - i)}) & 31)::int + 1, 1)"
        for i in range(chars)
    )


def effect_id_sql(millis: str, g: str) -> str:
    return f"'eff_' || {_base32_sql(millis, 10)} || '00000000' || {_base32_sql(g, 8)}"


@dataclass(frozen=True)
class TypeRow:
    """An effect type of the history: its contract's example, with a resource id per effect."""

    index: int
    type: str
    provider: str
    owner: str
    resource_type: str
    resource_id_prefix: str
    version: int | None
    payload: dict
    canon_prefix: str  # canonical JSON of the digest's input around the resource id
    canon_suffix: str
    redacted: dict


def history_types() -> list[TypeRow]:
    """One row per contract, in a fixed order: effect g has type ``g % len(types)``."""
    from gateway.contracts import CONTRACTS
    from gateway.ledger import redact
    from gateway.lib.digest import canonical_json

    rows = []
    for index, contract in enumerate(sorted(CONTRACTS.values(), key=lambda c: c.type)):
        example = contract.example
        resource = dict(example["resource"])
        marker = "RESOURCEIDMARKER"
        canon = canonical_json(
            {
                "type": contract.type,
                "resource": {**resource, "id": marker},
                "payload": example["payload"],
            }
        ).decode()
        prefix, suffix = canon.split(marker)
        rows.append(
            TypeRow(
                index=index,
                type=contract.type,
                provider=contract.provider,
                owner=contract.owner,
                resource_type=resource["type"],
                resource_id_prefix=f"{resource['id']}-",
                version=resource.get("version"),
                payload=example["payload"],
                canon_prefix=prefix,
                canon_suffix=suffix,
                redacted=redact(example["payload"], contract),
            )
        )
    return rows


def resource_of(row: TypeRow, g: int) -> dict:
    resource: dict[str, object] = {
        "type": row.resource_type,
        "id": f"{row.resource_id_prefix}{g % 100_003}",
    }
    if row.version is not None:
        resource["version"] = row.version
    return resource


def history_kind(g: int) -> str:
    h = g % 1000
    return next(name for bound, name in HISTORY if h < bound)


# --- the load ------------------------------------------------------------------------------


def create_principals() -> None:
    """The tenant and the principals the loaded history names (its agent, approver, on-call)."""
    import uuid
    from io import StringIO

    from django.core.management import call_command

    for name, role in ((AGENT, "agent"), (APPROVER, "approver"), (ONCALL, "operator")):
        call_command(
            "issue_token",
            tenant=TENANT,
            principal=name,
            role=role,
            password=uuid.uuid4().hex if role != "agent" else None,
            stdout=StringIO(),
        )


def load(
    *,
    effects: int,
    open_queue: bool = True,
    say=print,
    mix: tuple[tuple[int, str], ...] = OPEN_QUEUE,
) -> dict[str, float]:
    """Write ``effects`` settled effects plus (unless ``open_queue`` is false) the open queue
    (``mix``: how many of each open kind; ``OPEN_QUEUE`` unless told) into a migrated scratch
    database. Returns seconds per phase."""
    from django.conf import settings
    from django.db import connection

    from gateway import audit
    from gateway.lib import vault
    from gateway.models import Tenant

    tenant = Tenant.objects.get(slug=TENANT)
    audit.seal_pending()  # the grant's control event: the loaded chain follows it
    # The vault key read once, not from its development file at every seal (10× faster).
    settings.GATEWAY_VAULT_KEY = vault._raw_keys()
    types = history_types()
    timings: dict[str, float] = {}
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        cursor.execute("SET synchronous_commit = off")
        cursor.execute("SET maintenance_work_mem = '1GB'")
        cursor.execute("SET work_mem = '64MB'")
        dropped = _drop_secondary_indexes(cursor)
        _temp_tables(cursor, types, mix)
        params = _load_params(cursor, tenant, effects, len(types))
        started = time.perf_counter()
        total = effects + (sum(count for count, _ in mix) if open_queue else 0)
        for low in range(1, total + 1, BATCH):
            high = min(total + 1, low + BATCH)
            _batch(cursor, {**params, "low": low, "high": high}, types)
            spent = time.perf_counter() - started
            say(f"  rows of effects {low:,}–{high - 1:,} written ({spent:.0f} s)")
        timings["rows"] = time.perf_counter() - started
        cursor.execute("RESET session_replication_role")
        _finish(cursor, tenant.pk, dropped, timings, say)
    _check_digest(types)
    return timings


def _load_params(cursor, tenant, effects: int, ntypes: int) -> dict:
    """The SQL parameters every batch shares: who the rows name, how many, and where the
    generated event and attempt ids start (above any already there)."""
    from gateway.models import Principal

    agent = Principal.objects.get(tenant=tenant, name=AGENT)
    approver = Principal.objects.get(tenant=tenant, name=APPROVER)
    oncall = Principal.objects.get(tenant=tenant, name=ONCALL)
    cursor.execute("SELECT coalesce(max(id), 0) FROM gateway_effectevent")
    event_base = cursor.fetchone()[0] + EVENT_STRIDE
    cursor.execute("SELECT coalesce(max(id), 0) FROM gateway_attempt")
    attempt_base = cursor.fetchone()[0] + ATTEMPT_STRIDE
    return {
        "tenant": tenant.pk,
        "slug": tenant.slug,
        "agent": agent.pk,
        "agent_label": agent.label,
        "approver": approver.pk,
        "approver_label": approver.label,
        "oncall": oncall.pk,
        "oncall_label": oncall.label,
        "n": effects,
        "step": f"{STEP_SECONDS} seconds",
        "spread": OPEN_SPREAD_SECONDS,
        "event_base": event_base,
        "attempt_base": attempt_base,
        "ntypes": ntypes,
    }


def _finish(cursor, tenant_id: int, dropped: list[str], timings: dict[str, float], say) -> None:
    """After the rows: the indexes rebuilt, the id sequences moved past the loaded ids, the
    chain head's floor raised above the loaded events (named in batches), VACUUM ANALYZE."""
    started = time.perf_counter()
    for definition in dropped:
        cursor.execute(definition)
    timings["indexes"] = time.perf_counter() - started
    say(f"  {len(dropped)} indexes rebuilt ({timings['indexes']:.0f} s)")
    for table in ("gateway_effectevent", "gateway_attempt", "gateway_receipt",
                  "reconciliation_reconciliationrecord"):  # fmt: skip
        cursor.execute(
            f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
            f"(SELECT coalesce(max(id), 1) FROM {table}))"
        )
    # The chain head's floor above the loaded events: the sequencer seals only new ones.
    cursor.execute(
        """
        UPDATE gateway_auditchainhead h
           SET floor_txid = e.top + 1, sealed_at = now()
          FROM (SELECT max(txid) AS top FROM gateway_effectevent WHERE tenant_id = %s) e
         WHERE h.tenant_id = %s AND e.top IS NOT NULL
        """,
        [tenant_id, tenant_id],
    )
    batch_loaded_events(cursor, tenant_id)
    started = time.perf_counter()
    for table in TABLES:
        cursor.execute(f"VACUUM ANALYZE {table}")
    timings["vacuum"] = time.perf_counter() - started
    say(f"  VACUUM ANALYZE ({timings['vacuum']:.0f} s)")


def count_tallies() -> int:
    """The /metrics tallies brought up to the loaded chain (reconciliation/tally.py), as a
    running gateway keeps them: otherwise its first tally pass counts the whole history while
    whatever runs next is measured. Returns the events counted."""
    from reconciliation.tally import tally_pending

    counted = 0
    while step := tally_pending():
        counted += step
    return counted


# The tenant's events that no batch names, as the next batches of its chain (1000 links each,
# placeholder links), and the head moved past them. Cheap when few batches exist (at load).
_BATCH_LOADED = """
WITH head AS (SELECT length FROM gateway_auditchainhead WHERE tenant_id = %(tenant)s),
named AS (SELECT unnest(event_ids) AS id FROM gateway_auditbatch WHERE tenant_id = %(tenant)s),
loose AS (
    SELECT e.id, e.txid, row_number() OVER (ORDER BY e.txid, e.id) AS pos
      FROM gateway_effectevent e
     WHERE e.tenant_id = %(tenant)s AND e.txid IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM named WHERE named.id = e.id)
), batches AS (
    INSERT INTO gateway_auditbatch (tenant_id, first, last, event_ids, links, prev_hash, hash,
                                    max_txid, sealed_at)
    SELECT %(tenant)s, head.length + min(pos), head.length + max(pos), array_agg(id ORDER BY pos),
           decode(repeat('00', 32 * count(*)::int), 'hex'), repeat('0', 64), repeat('0', 64),
           max(txid), now()
      FROM loose, head
     GROUP BY (pos - 1) / 1000, head.length
    RETURNING last, event_ids[array_length(event_ids, 1)] AS last_event
)
UPDATE gateway_auditchainhead h
   SET length = b.last, last_event_id = b.last_event, last_hash = repeat('0', 64)
  FROM (SELECT last, last_event FROM batches ORDER BY last DESC LIMIT 1) b
 WHERE h.tenant_id = %(tenant)s
"""


def batch_loaded_events(cursor, tenant_id: int) -> None:
    """Name the loaded events in audit batches (see the module's docstring)."""
    cursor.execute(_BATCH_LOADED, {"tenant": tenant_id})


def _drop_secondary_indexes(cursor) -> list[str]:
    """Drop the indexes that back no constraint (the primary and unique keys stay: ids are
    written in order, so they grow at their right edge); their definitions to rebuild."""
    cursor.execute(
        """
        SELECT i.tablename, i.indexname, i.indexdef
          FROM pg_indexes i
         WHERE i.schemaname = 'public' AND i.tablename = ANY(%s)
           AND NOT EXISTS (SELECT 1 FROM pg_constraint c
                            WHERE c.conindid = (quote_ident(i.indexname))::regclass)
        """,
        [list(TABLES)],
    )
    found = cursor.fetchall()
    for _table, name, _definition in found:
        cursor.execute(f'DROP INDEX "{name}"')
    return [definition for _table, _name, definition in found]


def _temp_tables(cursor, types: list[TypeRow], mix: tuple[tuple[int, str], ...]) -> None:
    import json

    cursor.execute(
        """
        CREATE TEMP TABLE scale_type (
            ti int PRIMARY KEY, type text, provider text, owner text, resource_type text,
            rid_prefix text, version bigint, canon_prefix text, canon_suffix text,
            redacted jsonb)
        """
    )
    for row in types:
        cursor.execute(
            "INSERT INTO scale_type VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            [row.index, row.type, row.provider, row.owner, row.resource_type,
             row.resource_id_prefix, row.version, row.canon_prefix, row.canon_suffix,
             json.dumps(row.redacted)],
        )  # fmt: skip
    cursor.execute(
        """
        CREATE TEMP TABLE scale_kind (
            kind text PRIMARY KEY, status text, attempts int, last_outcome text,
            receipt text, receipt_matches bool, provider_status text, approval text,
            checks int, mismatch bool, escalated bool, next_check interval,
            record_kind text, record_outcome text, case_reason text, case_state text,
            settle interval, steps int)
        """
    )
    cursor.execute(
        """
        CREATE TEMP TABLE scale_step (
            kind text, step int, ev text, from_status text, to_status text, actor text,
            last bool)
        """
    )
    for kind in KINDS.values():
        cursor.execute(
            "INSERT INTO scale_kind VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
            "%s::interval, %s, %s, %s, %s, %s::interval, %s)",
            [kind.name, kind.status, kind.attempts, kind.last_outcome, kind.receipt,
             kind.receipt_matches, kind.provider_status, kind.approval, kind.checks,
             kind.mismatch, kind.escalated, kind.next_check,
             kind.record[0] if kind.record else None, kind.record[1] if kind.record else None,
             kind.case[0] if kind.case else None, kind.case[1] if kind.case else None,
             kind.settle, len(kind.steps)],
        )  # fmt: skip
        for step, (ev, from_status, to_status, actor) in enumerate(kind.steps, start=1):
            cursor.execute(
                "INSERT INTO scale_step VALUES (%s, %s, %s, %s, %s, %s, %s)",
                [kind.name, step, ev, from_status, to_status, actor, step == len(kind.steps)],
            )
    history = " ".join(f"WHEN g %% 1000 < {bound} THEN '{name}'" for bound, name in HISTORY)
    open_queue, upper = [], 0
    for count, name in mix:
        upper += count
        open_queue.append(f"WHEN g - %(n)s <= {upper} THEN '{name}'")
    # The open queue (g > n) spread over the last six hours; the history before it.
    _BATCH_SQL["b"] = f"""
        CREATE TEMP TABLE b AS
        SELECT g, kind, ti, at,
               {effect_id_sql("(extract(epoch FROM at) * 1000)::bigint", "g")} AS eid,
               rid, 'sha256:' || encode(sha256(convert_to(
                   t.canon_prefix || rid || t.canon_suffix, 'UTF8')), 'hex') AS digest
          FROM (SELECT g, g %% %(ntypes)s AS ti,
                       CASE WHEN g <= %(n)s THEN CASE {history} END
                            ELSE CASE {" ".join(open_queue)} END END AS kind,
                       CASE WHEN g <= %(n)s
                            THEN now() - interval '1 minute' - (%(n)s - g) * %(step)s::interval
                            ELSE now() - ((g * 7919) %% %(spread)s) * interval '1 second'
                       END AS at
                  FROM generate_series(%(low)s::bigint, %(high)s - 1) AS g) s
          JOIN scale_type t USING (ti)
          CROSS JOIN LATERAL (SELECT t.rid_prefix || (g %% 100003) AS rid) r
    """


_BATCH_SQL: dict[str, str] = {}

_ACTOR = """CASE {actor} WHEN 'agent' THEN %(agent_label)s WHEN 'approver' THEN %(approver_label)s
    WHEN 'operator' THEN %(oncall_label)s WHEN 'worker' THEN 'worker:celery@scale'
    WHEN 'reconciler' THEN 'reconciler' ELSE 'sweeper' END"""

_ROWS = [
    """
    INSERT INTO gateway_command (effect_id, tenant_id, type, provider, idempotency_key,
        provider_key, payload_digest, resource, resource_type, resource_id, resource_version,
        payload_sealed, payload_redacted, intent, context, requested_by_id, capability_id,
        budget_amount, approval_required, compensates_id, saga_id, saga_step, expires_at,
        created_at)
    SELECT b.eid, %(tenant)s, t.type, t.provider, 'scale-' || b.g, %(slug)s || ':scale-' || b.g,
           b.digest,
           jsonb_strip_nulls(jsonb_build_object('type', t.resource_type, 'id', b.rid,
                                                'version', t.version)),
           t.resource_type, b.rid, t.version, bs.sealed, t.redacted,
           '{"summary": "scale history"}'::jsonb,
           jsonb_build_object('runtime', 'claude-code', 'agent', 'scale-bot',
                              'run_id', 'run_' || (b.g / 40)),
           %(agent)s, NULL, 0, k.approval <> 'not_required', NULL, '', '',
           -- the open queue stays open for the run (the sweeper expires what is due)
           CASE WHEN b.kind LIKE 'open%%' THEN now() + interval '7 days'
                ELSE b.at + interval '1 hour' END, b.at
      FROM b JOIN b_sealed bs USING (g) JOIN scale_type t USING (ti) JOIN scale_kind k USING (kind)
     ORDER BY b.g
    """,
    """
    INSERT INTO gateway_effect (effect_id, tenant_id, type, owner, status, status_changed_at,
        fence, attempt_count, lease_expires_at, next_dispatch_at, next_check_at, check_count,
        frozen, mismatch, escalated, provider_operation_id, confirmed_at, approval_state,
        approved_by_id, approved_digest, approved_at, compensated_by_id, created_at,
        updated_at)
    SELECT b.eid, %(tenant)s, t.type, t.owner, k.status, b.at + k.settle, k.attempts,
           k.attempts, NULL, NULL,
           CASE WHEN k.next_check IS NOT NULL
                THEN now() + k.next_check + (b.g %% 3600) * interval '1 second' END,
           k.checks, false, k.mismatch, k.escalated,
           CASE WHEN k.attempts > 0 AND k.last_outcome <> 'rejected' THEN 'op_' || b.g
                ELSE '' END,
           CASE WHEN k.status = 'CONFIRMED' THEN b.at + k.settle END,
           k.approval,
           CASE WHEN k.approval = 'approved' THEN %(approver)s END,
           CASE WHEN k.approval = 'approved' THEN b.digest ELSE '' END,
           CASE WHEN k.approval = 'approved' THEN b.at + interval '6 minutes' END,
           NULL, b.at, b.at + k.settle
      FROM b JOIN scale_type t USING (ti) JOIN scale_kind k USING (kind)
     ORDER BY b.g
    """,
    f"""
    INSERT INTO gateway_effectevent (id, tenant_id, effect_id, subject, kind, from_status,
        to_status, actor, principal_id, reason, data, created_at)
    SELECT e.id, %(tenant)s, b.eid, '', s.ev, s.from_status, s.to_status,
           {_ACTOR.format(actor="s.actor")},
           CASE s.actor WHEN 'agent' THEN %(agent)s WHEN 'approver' THEN %(approver)s
                        WHEN 'operator' THEN %(oncall)s END,
           CASE s.ev WHEN 'dispatched' THEN 'the provider answered'
                     WHEN 'resolved' THEN 'operator: the provider shows the charge once'
                     ELSE '' END,
           CASE s.ev
             WHEN 'submitted' THEN jsonb_build_object('idempotency_key', 'scale-' || b.g,
                                                      'payload_digest', b.digest)
             WHEN 'claimed' THEN jsonb_build_object('fence', 1)
             WHEN 'dispatched' THEN jsonb_build_object(
                 'attempt', 1, 'fence', 1, 'outcome', lower(s.to_status),
                 'http_status', 201, 'provider_operation_id', 'op_' || b.g,
                 'provider_status', k.provider_status, 'mismatch', false, 'error', '')
             ELSE '{{}}'::jsonb END,
           ts.at
      FROM b JOIN scale_kind k USING (kind) JOIN scale_step s USING (kind)
     CROSS JOIN LATERAL (
           SELECT %(event_base)s + (b.g - 1) * {EVENT_STRIDE} + s.step AS id) e
     CROSS JOIN LATERAL (
           SELECT CASE WHEN s.last THEN b.at + k.settle
                       ELSE b.at + s.step * interval '15 milliseconds' END AS at) ts
     ORDER BY e.id
    """,
    f"""
    INSERT INTO gateway_attempt (id, effect_id, number, fence, worker, state, outcome,
        http_status, provider_operation_id, error, started_at, finished_at)
    SELECT %(attempt_base)s + (b.g - 1) * {ATTEMPT_STRIDE} + n, b.eid, n, n,
           'celery@scale', 'finished', o.outcome,
           CASE o.outcome WHEN 'confirmed' THEN 201 WHEN 'in_progress' THEN 202
                          WHEN 'rejected' THEN 409 END,
           CASE WHEN o.outcome IN ('confirmed', 'in_progress') THEN 'op_' || b.g ELSE '' END,
           CASE o.outcome WHEN 'unknown' THEN 'read timed out after 10 s'
                          WHEN 'not_started' THEN 'connection refused' ELSE '' END,
           b.at + n * interval '20 milliseconds', b.at + n * interval '20 milliseconds'
               + interval '3 milliseconds'
      FROM b JOIN scale_kind k USING (kind)
     CROSS JOIN generate_series(1, k.attempts) AS n
     CROSS JOIN LATERAL (SELECT CASE WHEN n < k.attempts THEN 'not_started'
                                     ELSE k.last_outcome END AS outcome) o
     ORDER BY 1
    """,
    f"""
    INSERT INTO gateway_receipt (effect_id, attempt_id, source, provider,
        provider_operation_id, provider_status, payload_digest, digest_matches, result,
        result_digest, received_at, seal)
    SELECT b.eid,
           CASE WHEN k.receipt = 'dispatch'
                THEN %(attempt_base)s + (b.g - 1) * {ATTEMPT_STRIDE} + k.attempts END,
           k.receipt, t.provider, 'op_' || b.g, k.provider_status,
           CASE WHEN k.receipt_matches THEN b.digest
                ELSE 'sha256:' || md5(b.eid) || md5(b.eid || 'x') END,
           k.receipt_matches,
           jsonb_build_object('id', 'op_' || b.g, 'status', k.provider_status,
                              'reference', 'ref-' || b.g, 'created', b.at),
           'sha256:' || md5(b.g::text) || md5(b.g::text || 'r'),
           b.at + k.settle, md5(b.eid) || md5(b.eid || 's')
      FROM b JOIN scale_type t USING (ti) JOIN scale_kind k USING (kind)
     WHERE k.receipt <> ''
     ORDER BY b.g
    """,
    """
    INSERT INTO reconciliation_reconciliationrecord (tenant_id, effect_id, kind, lookup_by,
        lookup_status, http_status, provider_operation_id, provider_status, provider_digest,
        effect_status, outcome, check_number, actor, principal_id, evidence, created_at)
    SELECT %(tenant)s, b.eid, k.record_kind,
           CASE WHEN k.record_kind = 'lookup' THEN 'idempotency_key' ELSE '' END,
           CASE k.record_outcome WHEN 'inconclusive' THEN 'unreachable'
                                 WHEN 'escalated' THEN 'unreachable'
                                 WHEN 'confirmed' THEN 'found' ELSE 'found' END,
           CASE WHEN k.record_outcome IN ('inconclusive', 'escalated') THEN NULL ELSE 200 END,
           'op_' || b.g, k.provider_status, b.digest, 'UNKNOWN', k.record_outcome,
           greatest(k.checks, 1),
           CASE k.record_kind WHEN 'manual' THEN %(oncall_label)s ELSE 'reconciler' END,
           CASE k.record_kind WHEN 'manual' THEN %(oncall)s END,
           'the provider''s lookup by key said so', b.at + k.settle
      FROM b JOIN scale_kind k USING (kind)
     WHERE k.record_kind IS NOT NULL
     ORDER BY b.g
    """,
    """
    INSERT INTO reconciliation_case (id, tenant_id, effect_id, owner, reason, reason_text,
        state, evidence, opened_by, opened_at, acknowledged_by_id, acknowledged_at,
        resolved_by_id, resolved_actor, resolved_at, resolution)
    SELECT 'case_' || substr(b.eid, 5), %(tenant)s, b.eid, t.owner, k.case_reason,
           'handed to its owner by the reconciler', k.case_state,
           jsonb_build_object('status', 'UNKNOWN', 'check_count', k.checks), 'reconciler',
           b.at + interval '2 seconds', NULL, NULL,
           CASE WHEN k.case_state = 'resolved' THEN %(oncall)s END,
           CASE WHEN k.case_state = 'resolved' THEN %(oncall_label)s ELSE '' END,
           CASE WHEN k.case_state = 'resolved' THEN b.at + k.settle END,
           CASE WHEN k.case_state = 'resolved' THEN 'confirmed by hand' ELSE '' END
      FROM b JOIN scale_type t USING (ti) JOIN scale_kind k USING (kind)
     WHERE k.case_reason IS NOT NULL
     ORDER BY b.g
    """,
]


def _batch(cursor, params: dict, types: list[TypeRow]) -> None:
    cursor.execute("DROP TABLE IF EXISTS b")
    cursor.execute(_BATCH_SQL["b"], params)
    _seal_payloads(cursor, types)
    for statement in _ROWS:
        cursor.execute(statement, params)


def _seal_payloads(cursor, types: list[TypeRow]) -> None:
    """Each command's payload sealed to its own effect id and digest, as the gateway seals it
    (AES-GCM, gateway.integrity): the API answers a replay or a list with the clear payload,
    which opens only for the row it was sealed for. Written back with COPY."""
    from gateway.integrity import payload_binding
    from gateway.lib.vault import seal_bound

    cursor.execute("SELECT g, eid, digest, ti FROM b ORDER BY g")
    rows = cursor.fetchall()
    cursor.execute("DROP TABLE IF EXISTS b_sealed")
    cursor.execute("CREATE TEMP TABLE b_sealed (g bigint PRIMARY KEY, sealed text)")
    with cursor.cursor.copy("COPY b_sealed (g, sealed) FROM STDIN") as copy:
        for g, eid, digest, ti in rows:
            binding = payload_binding(effect_id=eid, digest=digest)
            copy.write_row((g, seal_bound(types[ti].payload, bound_to=binding)))


def _check_digest(types: list[TypeRow]) -> None:
    """The digest written in SQL is the one the gateway computes: history keys replay."""
    from gateway.lib.digest import payload_digest
    from gateway.models import Command

    for g in (1, 2, 3):
        row = types[g % len(types)]
        command = Command.objects.get(tenant__slug=TENANT, idempotency_key=f"scale-{g}")
        expected = payload_digest(type=row.type, resource=resource_of(row, g), payload=row.payload)
        if command.payload_digest != expected:
            raise RuntimeError(f"digest of scale-{g}: {command.payload_digest} != {expected}")
