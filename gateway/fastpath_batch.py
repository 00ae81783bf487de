"""The dispatch half of the hot path for many effects at once: claim a batch in one statement,
record a batch of outcomes in one statement.

``gateway.fastpath`` claims and records one effect per statement; a worker that drains due
work (``gateway.dispatcher``) uses these instead. The rules are the same, written once more
as WHERE clauses over a set of rows:

- **claim_batch**: picks up to *n* due effects (``FOR UPDATE SKIP LOCKED``: a second drainer,
  the sweeper or a single dispatch holding one of them makes this statement pass it by) and
  moves to DISPATCHING, at ``fence + 1``, exactly those for which every check of
  ``fastpath._CLAIM`` holds; each gets its ``claimed`` event and its ``sending`` attempt. The
  picked rows whose checks do not all hold come back too, without a claim: the caller hands
  them to the general path, which decides what each needs (expire, reject, re-ask approval,
  escalate). Committed before any provider is called.
- **record_batch**: writes each outcome at its claim's fence (status, event, attempt end,
  receipt) under the conditions of ``fastpath._RECORD``; it returns the effects it wrote, and
  the caller records the others the general way (a stale claim, a compensation, a tenant with
  a webhook endpoint).

"Due" is what the dispatch sweep would send (``effect_dispatch_due``): PREPARED with a
dispatch time (a new or approved command), or NOT_STARTED once its retry backoff has passed.
An effect that is held — frozen, its principal or type frozen, a step of a saga (sagas send
theirs one by one, ``hooks.dispatch_holds``) — is not picked at all, so a drainer never
locks what it may not send and never picks it again and again. PostgreSQL only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from typing import Any, Self

import psycopg
from django.conf import settings
from django.db import connection
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper
from django.utils import timezone
from psycopg.abc import Params, QueryNoTemplate

from gateway.checkpoints import receipt_seal
from gateway.choices import OUTCOME_STATUS
from gateway.fastpath import FastClaim
from gateway.lib.digest import sha256_digest
from gateway.models import Receipt
from gateway.providers.base import CallResult, ProviderOperation
from gateway.webhooks.models import WebhookEndpoint


class _PreparedCursor(psycopg.Cursor[Any]):
    """Binds on the server and prepares: a drainer runs these statements over and over on one
    connection, and planning them (CTEs over five tables) cost PostgreSQL more CPU than
    running them: an empty claim 3 ms planned each time, 0.5-1 ms prepared."""

    # Django's cursor wrapper calls execute(sql, params): the one place to ask for prepare.
    def execute(  # type: ignore[override]
        self,
        query: QueryNoTemplate,
        params: Params | None = None,
        *,
        prepare: bool | None = None,
        binary: bool | None = None,
    ) -> Self:
        return super().execute(query, params, prepare=settings.GATEWAY_DB_PREPARE, binary=binary)


def _execute(sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Run one of these statements through Django's cursor wrapper (query logging and the
    round-trip counters see it), prepared unless ``GATEWAY_DB_PREPARE`` is off."""
    connection.ensure_connection()
    raw = connection.connection
    if raw.prepare_threshold is None:
        # Django turns psycopg's automatic preparing off (connection poolers): with this
        # threshold nothing is prepared but what asks for it (prepare=True), these statements.
        raw.prepare_threshold = 2**31 - 1
    wrapper = CursorDebugWrapper if connection.queries_logged else CursorWrapper
    with wrapper(_PreparedCursor(raw), connection) as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _compact(sql: str) -> str:
    """One line (see ``fastpath._compact``: psycopg caches the parse of a statement up to
    4096 bytes). No literal here holds two spaces in a row."""
    return " ".join(sql.split())


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


# --- claim ------------------------------------------------------------------------------------

# The checks of ``fastpath._CLAIM`` (keep the two in step: tests/gateway/test_dispatch_batch.py
# runs each refusal through both), applied to the rows ``due`` locked. ``due`` already leaves
# out what is held (frozen effect, principal or type; saga steps) so that those stay unlocked;
# the UPDATE repeats every condition so that it reads as the single claim does.
_CLAIM_BATCH = _compact("""
WITH due AS (
    SELECT e.effect_id, e.status
      FROM gateway_effect e
      JOIN gateway_command c ON c.effect_id = e.effect_id
      JOIN gateway_principal p ON p.id = c.requested_by_id
     WHERE e.status IN ('NOT_STARTED', 'PREPARED') AND NOT e.frozen
       AND e.next_dispatch_at IS NOT NULL
       AND (e.status = 'PREPARED' OR e.next_dispatch_at <= %(now)s)
       AND c.saga_id = '' AND NOT p.frozen
       AND NOT EXISTS (SELECT 1 FROM gateway_effecttypefreeze f
                        WHERE f.tenant_id = e.tenant_id AND f.type = e.type)
       AND e.effect_id <> ALL(%(skip)s::text[])
     ORDER BY e.next_dispatch_at
     LIMIT %(limit)s
       FOR UPDATE OF e SKIP LOCKED
), claimed AS (
    UPDATE gateway_effect e
       SET status = 'DISPATCHING', fence = e.fence + 1, attempt_count = e.attempt_count + 1,
           next_dispatch_at = NULL, lease_expires_at = %(lease)s, status_changed_at = %(now)s,
           updated_at = %(now)s
      FROM due, gateway_command c, gateway_principal p,
           unnest(%(types)s::text[], %(budgets)s::int[]) AS budget (type, attempts)
     WHERE e.effect_id = due.effect_id AND e.status = due.status AND NOT e.frozen
       AND c.effect_id = e.effect_id AND p.id = c.requested_by_id
       AND c.expires_at > %(now)s
       AND budget.type = e.type AND e.attempt_count < budget.attempts
       AND NOT p.frozen
       AND c.saga_id = ''
       AND (NOT c.approval_required OR e.approved_at > %(approved_after)s)
       AND (NOT c.approval_required OR (e.approval_state = 'approved'
                                        AND e.approved_digest = c.payload_digest))
       AND NOT EXISTS (SELECT 1 FROM gateway_effecttypefreeze f
                        WHERE f.tenant_id = e.tenant_id AND f.type = e.type)
       AND (c.capability_id IS NULL OR EXISTS (
            SELECT 1 FROM gateway_capability k WHERE k.id = c.capability_id
               AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > %(now)s)))
    RETURNING e.effect_id, e.tenant_id, e.fence, e.attempt_count, e.check_count,
              due.status AS from_status, c.type, c.provider_key, c.resource, c.payload_sealed,
              c.payload_digest, c.provider, c.compensates_id IS NOT NULL AS compensates
), ev AS (
    INSERT INTO gateway_effectevent (
        tenant_id, effect_id, subject, kind, from_status, to_status, actor, principal_id,
        reason, data, created_at)
    SELECT tenant_id, effect_id, '', 'claimed', from_status, 'DISPATCHING', %(actor)s, NULL,
           'attempt ' || attempt_count, jsonb_build_object('fence', fence), %(now)s
      FROM claimed
), attempt AS (
    INSERT INTO gateway_attempt (
        effect_id, number, fence, worker, state, outcome, http_status, provider_operation_id,
        error, started_at, finished_at)
    SELECT effect_id, attempt_count, fence, %(worker)s, 'sending', '', NULL, '', '', %(now)s,
           NULL
      FROM claimed
    RETURNING id, effect_id
)
SELECT claimed.effect_id, claimed.tenant_id, claimed.fence, claimed.attempt_count,
       claimed.check_count, claimed.type, claimed.provider_key, claimed.resource,
       claimed.payload_sealed, claimed.payload_digest, attempt.id, claimed.provider,
       claimed.compensates
  FROM claimed JOIN attempt ON attempt.effect_id = claimed.effect_id
UNION ALL
SELECT due.effect_id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
  FROM due WHERE NOT EXISTS (SELECT 1 FROM claimed WHERE claimed.effect_id = due.effect_id)
""")


@dataclass(frozen=True)
class BatchClaim(FastClaim):
    """A fast claim, with what its record needs from the command (commands never change):
    its provider, and whether it compensates another effect (then the general record
    settles the original)."""

    provider: str
    compensates: bool


@dataclass(frozen=True)
class Batch:
    """What one claim statement picked: the effects it claimed, and the ones it locked but
    may not claim (the general path decides what they need)."""

    claims: list[BatchClaim]
    refused: list[str]

    @property
    def picked(self) -> int:
        return len(self.claims) + len(self.refused)


@cache
def _budgets() -> tuple[list[str], list[int]]:
    """Each type's attempt budget (its contract's recovery policy); unknown types: none."""
    from gateway.contracts import CONTRACTS

    return list(CONTRACTS), [c.recovery.max_dispatch_attempts for c in CONTRACTS.values()]


def claim_batch(*, limit: int, worker: str, skip: list[str] | tuple[str, ...] = ()) -> Batch:
    """Claim up to ``limit`` due effects in one statement (autocommit: committed when it
    returns). ``skip``: effects this drainer already handed to the general path."""
    now = timezone.now()
    types, budgets = _budgets()
    params: dict[str, Any] = {
        "now": now,
        "limit": limit,
        "skip": list(skip),
        "lease": now + timedelta(seconds=settings.GATEWAY_DISPATCH_LEASE),
        "types": types,
        "budgets": budgets,
        "approved_after": now - timedelta(seconds=settings.GATEWAY_APPROVAL_TTL),
        "actor": f"worker:{worker}",
        "worker": worker,
    }
    rows = _execute(_CLAIM_BATCH, params)
    claims, refused = [], []
    for row in rows:
        (eid, tenant_id, fence, number, checks, type_, key, resource, sealed, digest, aid) = row[
            :11
        ]
        if aid is None:
            refused.append(eid)
            continue
        if isinstance(resource, str):
            resource = json.loads(resource)
        provider, compensates = row[11:]
        claims.append(
            BatchClaim(
                eid, tenant_id, fence, aid, number, checks, type_, key, resource, sealed, digest,
                provider=provider, compensates=compensates,
            )
        )  # fmt: skip
    return Batch(claims, refused)


# The same choice of due effects, read without claiming: the drain when the fast path is off
# (every effect then goes through the general path, one by one).
_DUE = _compact("""
SELECT e.effect_id
  FROM gateway_effect e
  JOIN gateway_command c ON c.effect_id = e.effect_id
  JOIN gateway_principal p ON p.id = c.requested_by_id
 WHERE e.status IN ('NOT_STARTED', 'PREPARED') AND NOT e.frozen
   AND e.next_dispatch_at IS NOT NULL
   AND (e.status = 'PREPARED' OR e.next_dispatch_at <= %(now)s)
   AND c.saga_id = '' AND NOT p.frozen
   AND NOT EXISTS (SELECT 1 FROM gateway_effecttypefreeze f
                    WHERE f.tenant_id = e.tenant_id AND f.type = e.type)
   AND e.effect_id <> ALL(%(skip)s::text[])
 ORDER BY e.next_dispatch_at
 LIMIT %(limit)s
""")


def due_effect_ids(*, limit: int, skip: list[str] | tuple[str, ...] = ()) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(_DUE, {"now": timezone.now(), "limit": limit, "skip": list(skip)})
        return [effect_id for (effect_id,) in cursor.fetchall()]


# --- record -----------------------------------------------------------------------------------

# One row per outcome (``o``), written under ``fastpath._RECORD``'s conditions. The command's
# part of them (no compensation, no saga) was read by the claim (commands never change): the
# caller passes only such outcomes. The effect rows are named by ``= ANY(ids)`` as well: the
# planner knows nothing of ``o``'s rows, and without statistics (no ANALYZE yet) it chose to
# scan a whole table to join them.
_RECORD_BATCH = _compact(f"""
WITH o AS (
    SELECT * FROM unnest(
        %(ids)s::text[], %(fences)s::bigint[], %(tos)s::text[], %(next_checks)s::timestamptz[],
        %(next_dispatches)s::timestamptz[], %(op_ids)s::text[], %(mismatches)s::bool[],
        %(confirmeds)s::timestamptz[], %(reasons)s::text[], %(evidence)s::text[],
        %(outcomes)s::text[], %(http_statuses)s::int[], %(errors)s::text[],
        %(attempts)s::bigint[], %(op_statuses)s::text[], %(op_digests)s::text[],
        %(op_results)s::text[], %(result_digests)s::text[], %(seals)s::text[],
        %(providers)s::text[], %(command_digests)s::text[])
      AS o (effect_id, fence, to_status, next_check, next_dispatch, op_id, mismatch, confirmed,
            reason, evidence, outcome, http_status, error, attempt_id, op_status, op_digest,
            op_result, result_digest, seal, provider, command_digest)
), recorded AS (
    UPDATE gateway_effect e
       SET status = o.to_status, status_changed_at = %(now)s, updated_at = %(now)s,
           lease_expires_at = NULL, next_check_at = o.next_check,
           next_dispatch_at = o.next_dispatch,
           provider_operation_id = COALESCE(o.op_id, e.provider_operation_id),
           mismatch = e.mismatch OR o.mismatch,
           confirmed_at = COALESCE(o.confirmed, e.confirmed_at)
      FROM o
     WHERE e.effect_id = ANY(%(ids)s::text[]) AND e.effect_id = o.effect_id
       AND e.status = 'DISPATCHING' AND e.fence = o.fence
       AND NOT EXISTS (SELECT 1 FROM {WebhookEndpoint._meta.db_table} w
                        WHERE w.tenant_id = e.tenant_id AND w.enabled)
    RETURNING e.effect_id, e.tenant_id
), ev AS (
    INSERT INTO gateway_effectevent (
        tenant_id, effect_id, subject, kind, from_status, to_status, actor, principal_id,
        reason, data, created_at)
    SELECT r.tenant_id, r.effect_id, '', 'dispatched', 'DISPATCHING', o.to_status, %(actor)s,
           NULL, o.reason, o.evidence::jsonb, %(now)s
      FROM recorded r JOIN o ON o.effect_id = r.effect_id
), attempt AS (
    UPDATE gateway_attempt a SET state = 'finished', outcome = o.outcome,
           http_status = o.http_status, provider_operation_id = COALESCE(o.op_id, ''),
           error = o.error, finished_at = %(now)s
      FROM o JOIN recorded r ON r.effect_id = o.effect_id
     WHERE a.id = o.attempt_id
), receipt AS (
    INSERT INTO gateway_receipt (
        effect_id, attempt_id, source, provider, provider_operation_id, provider_status,
        payload_digest, digest_matches, result, result_digest, received_at, seal)
    SELECT r.effect_id, o.attempt_id, 'dispatch', o.provider, o.op_id, o.op_status,
           o.op_digest, o.op_digest = o.command_digest, o.op_result::jsonb, o.result_digest,
           %(now)s, o.seal
      FROM recorded r JOIN o ON o.effect_id = r.effect_id
     WHERE o.op_id IS NOT NULL
)
SELECT effect_id FROM recorded
""")


@dataclass(frozen=True)
class Answer:
    """A provider's answer to one claimed effect, with the bookkeeping it leads to
    (``services.outcome_fields``)."""

    claim: BatchClaim
    result: CallResult
    fields: dict[str, Any]


# The statement's arrays, in the order of a row of ``_row``.
_RECORD_COLUMNS = (
    "ids",
    "fences",
    "tos",
    "next_checks",
    "next_dispatches",
    "op_ids",
    "mismatches",
    "confirmeds",
    "reasons",
    "evidence",
    "outcomes",
    "http_statuses",
    "errors",
    "attempts",
    "op_statuses",
    "op_digests",
    "op_results",
    "result_digests",
    "seals",
    "providers",
    "command_digests",
)


def record_batch(*, answers: list[Answer], worker: str, now: datetime) -> set[str]:
    """Write each outcome at its claim's fence, in one statement. Returns the effects written;
    the others need the general record (stale, or a tenant's webhook endpoint). Pass no
    compensation (``claim.compensates``): its record settles the original, the general way."""
    assert not any(answer.claim.compensates for answer in answers)
    columns = zip(*(_row(answer, now) for answer in answers), strict=True)
    params: dict[str, Any] = dict(zip(_RECORD_COLUMNS, map(list, columns), strict=True))
    params.update(now=now, actor=f"worker:{worker}")
    return {effect_id for (effect_id,) in _execute(_RECORD_BATCH, params)}


def _row(answer: Answer, now: datetime) -> tuple[Any, ...]:
    """One outcome's values, as ``fastpath.record`` binds them."""
    claim, result, fields = answer.claim, answer.result, answer.fields
    operation = result.operation
    error = result.error or ""
    evidence = {
        "attempt": claim.attempt_number,
        "fence": claim.fence,
        "outcome": str(result.outcome),
        "http_status": result.http_status,
        "provider_operation_id": operation.id if operation else None,
        "provider_status": operation.status if operation else None,
        "mismatch": result.mismatch,
        "error": error[:500],
    }
    seal, result_digest = "", None
    if operation is not None:
        result_digest = sha256_digest(operation.result)
        seal = _seal(claim, operation, result_digest=result_digest, now=now)
    return (
        claim.effect_id,
        claim.fence,
        str(OUTCOME_STATUS[result.outcome]),
        fields.get("next_check_at"),
        fields.get("next_dispatch_at"),
        operation.id if operation else None,
        bool(fields.get("mismatch")),
        fields.get("confirmed_at"),
        result.reason,
        _json(evidence),
        str(result.outcome),
        result.http_status,
        error[:2000],
        claim.attempt_id,
        operation.status if operation else None,
        operation.payload_digest if operation else None,
        _json(operation.result if operation else {}),
        result_digest,
        seal,
        claim.provider,
        claim.payload_digest,
    )


def _seal(
    claim: BatchClaim, operation: ProviderOperation, *, result_digest: str, now: datetime
) -> str:
    """The seal the general path gives a receipt (gateway.checkpoints), over the fields the
    statement above writes."""
    receipt = Receipt(
        effect_id=claim.effect_id,
        attempt_id=claim.attempt_id,
        source=Receipt.Source.DISPATCH,
        provider=claim.provider,
        provider_operation_id=operation.id,
        provider_status=operation.status,
        payload_digest=operation.payload_digest,
        digest_matches=operation.payload_digest == claim.payload_digest,
        result_digest=result_digest,
        received_at=now,
    )
    return receipt_seal(receipt)
