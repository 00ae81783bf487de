"""The dispatch half of the hot path for many effects at once: claim a batch in one statement,
record a batch of outcomes in one statement.

``gateway.fastpath`` claims and records one effect per statement; a worker that drains due
work (``gateway.dispatcher``) uses these instead. The rules are the same, over a set of rows
(the claim's checks are the single claim's own SQL, ``fastpath.claim_ctes``):

- **claim_batch**: picks up to *n* due effects (``FOR UPDATE SKIP LOCKED``: a second drainer,
  the sweeper or a single dispatch holding one of them makes this statement pass it by) and
  moves to DISPATCHING, at ``fence + 1``, exactly those for which every check of
  the single claim holds; each gets its ``claimed`` event and its ``sending`` attempt. The
  picked rows whose checks do not all hold come back too, without a claim: the caller hands
  them to the general path, which decides what each needs (expire, reject, re-ask approval,
  escalate). Committed before any provider is called.
- **record_batch**: writes each outcome at its claim's fence (status, event, attempt end,
  receipt) with the single record's own CTEs (``fastpath.RECORD_CTES``); it returns the
  effects it wrote, and the caller records the others the general way (a stale claim, a
  compensation, a tenant with a webhook endpoint).

"Due" is what the dispatch sweep would send (``effect_dispatch_due``): PREPARED with a
dispatch time (a new or approved command), or NOT_STARTED once its retry backoff has passed.
An effect that is held — frozen, its principal or type frozen, a step of a saga (sagas send
theirs one by one, ``hooks.dispatch_holds``) — is not picked at all, so a drainer never
locks what it may not send and never picks it again and again. PostgreSQL only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from django.db import connection
from django.utils import timezone

from gateway.fastpath import (
    ANNOUNCED,
    CLAIM_RETURNING,
    DISPATCHABLE_IN,
    NO_SAGA,
    OUTCOME_COLUMNS,
    PREPARED,
    RECORD_CTES,
    FastClaim,
    _compact,
    _iso,
    attempt_budgets,
    claim_ctes,
    claim_from_row,
    claim_params,
    outcome_row,
)
from gateway.ledger import worker_actor
from gateway.lib import prepared
from gateway.provider_credentials import OWN_CREDENTIAL_TENANTS_SQL, SENT_WITH_SQL, rate_of_sql
from gateway.providers.base import CallResult


def _execute(sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Run one of these statements prepared, with server-side binding (``gateway.lib.prepared``:
    a drainer runs them over and over on one connection, and planning them cost PostgreSQL
    more than running them)."""
    return prepared.fetchall(sql, params)


# --- claim ------------------------------------------------------------------------------------

# What the dispatch sweep would send, and not held (frozen effect, principal or type; saga
# steps): the drainer's claim locks these (``due``), and the drain without the fast path reads
# them (``_DUE``). ``fastpath.claim_ctes`` then claims the locked rows under every check of
# the single claim (tests/gateway/test_dispatch_batch.py runs each refusal through both).
_DUE_FROM = f"""
    FROM gateway_effect e
    JOIN gateway_command c ON c.effect_id = e.effect_id
    JOIN gateway_principal p ON p.id = c.requested_by_id
   WHERE e.status IN ({DISPATCHABLE_IN}) AND NOT e.frozen
     AND e.next_dispatch_at IS NOT NULL
     AND (e.status = {PREPARED} OR e.next_dispatch_at <= %(now)s)
     AND c.saga_id = {NO_SAGA} AND NOT p.frozen
     AND NOT EXISTS (SELECT 1 FROM gateway_effecttypefreeze f
                      WHERE f.tenant_id = e.tenant_id AND f.type = e.type)
     AND e.effect_id <> ALL(%(skip)s::text[])"""
_DUE_WHERE = f"""{_DUE_FROM}
     AND c.provider <> ALL(%(exclude)s::text[])
     AND (%(only)s::text = '' OR c.provider = %(only)s::text)
   ORDER BY e.next_dispatch_at
   LIMIT %(limit)s
"""

_CLAIM_BATCH = _compact(f"""
WITH due AS (
    SELECT e.effect_id, e.status {_DUE_WHERE}
       FOR UPDATE OF e SKIP LOCKED
), {claim_ctes("due")}
SELECT {CLAIM_RETURNING}, claimed.provider, claimed.compensates
  FROM claimed JOIN attempt ON attempt.effect_id = claimed.effect_id
UNION ALL
SELECT due.effect_id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL
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


# Contracts register at import: a worker's budgets are the same for its life.
_budgets = cache(attempt_budgets)


def claim_batch(
    *,
    limit: int,
    worker: str,
    skip: list[str] | tuple[str, ...] = (),
    only: str = "",
    exclude: list[str] | tuple[str, ...] = (),
) -> Batch:
    """Claim up to ``limit`` due effects in one statement (autocommit: committed when it
    returns). ``skip``: effects this drainer already handed to the general path. ``only``:
    effects of that provider alone; ``exclude``: none of these providers' (the ones a gate
    of gateway.providers.protection holds back, or grants only so many sends)."""
    params = claim_params(now=timezone.now(), worker=worker, budgets=_budgets())
    params.update(limit=limit, skip=list(skip), only=only, exclude=list(exclude))
    return _batch_of(_execute(_CLAIM_BATCH, params))[0]


# A provider whose gates count per credential (gateway.providers.protection): which
# credential each due effect goes out with is known before it is claimed (SENT_WITH_SQL).
# One statement claims up to ``limit`` effects sent with the deployment's credential (what
# its permit granted), and picks, without locking or claiming, up to ``peek`` effects sent
# with tenants' own credentials other than ``held`` (paused, or their rate spent), each with
# its fingerprint and its own rate: the drainer asks for permits per credential, then claims
# those by id (``_CLAIM_SENT_WITH``). A tenant without credentials pays only the probe of
# SENT_WITH_SQL. The peeked rows come back with a NULL attempt id and their fingerprint.
_PEEK_OF = ", ".join(["NULL"] * 14)
_CLAIM_PROVIDER = _compact(f"""
WITH due AS (
    SELECT e.effect_id, e.status {_DUE_FROM}
       AND c.provider = %(provider)s AND ({SENT_WITH_SQL}) IS NULL
     ORDER BY e.next_dispatch_at
     LIMIT %(limit)s
       FOR UPDATE OF e SKIP LOCKED
), {claim_ctes("due")}, peek AS (
    SELECT x.effect_id, x.fp, {rate_of_sql("x")} AS rate FROM (
        SELECT e.effect_id, e.tenant_id, c.provider, e.next_dispatch_at,
               ({SENT_WITH_SQL}) AS fp {_DUE_FROM}
           AND c.provider = %(provider)s AND {OWN_CREDENTIAL_TENANTS_SQL}) x
     WHERE x.fp IS NOT NULL AND x.fp <> ALL(%(held)s::text[])
     ORDER BY x.next_dispatch_at
     LIMIT %(peek)s
)
SELECT {CLAIM_RETURNING}, claimed.provider, claimed.compensates, NULL, NULL
  FROM claimed JOIN attempt ON attempt.effect_id = claimed.effect_id
UNION ALL
SELECT due.effect_id, {_PEEK_OF}, NULL, NULL
  FROM due WHERE NOT EXISTS (SELECT 1 FROM claimed WHERE claimed.effect_id = due.effect_id)
UNION ALL
SELECT peek.effect_id, {_PEEK_OF}, peek.fp, peek.rate FROM peek
""")

# The effects a drainer peeked and got permits for, claimed by id: only while each still goes
# out with the credential it was admitted for (``keys``: effect id -> fingerprint).
_CLAIM_SENT_WITH = _compact(f"""
WITH due AS (
    SELECT e.effect_id, e.status {_DUE_FROM}
       AND e.effect_id = ANY(%(ids)s::text[])
       AND ({SENT_WITH_SQL}) = %(keys)s::jsonb ->> e.effect_id
     ORDER BY e.next_dispatch_at
     LIMIT %(limit)s
       FOR UPDATE OF e SKIP LOCKED
), {claim_ctes("due")}
SELECT {CLAIM_RETURNING}, claimed.provider, claimed.compensates
  FROM claimed JOIN attempt ON attempt.effect_id = claimed.effect_id
UNION ALL
SELECT due.effect_id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL
  FROM due WHERE NOT EXISTS (SELECT 1 FROM claimed WHERE claimed.effect_id = due.effect_id)
""")


@dataclass(frozen=True)
class Peeked:
    """A due effect of a tenant with credentials of its own, not claimed: the credential it
    goes out with (fingerprint) and that credential's own rate ("" for the provider's)."""

    effect_id: str
    credential: str
    rate: str


def _batch_of(rows: list[tuple[Any, ...]]) -> tuple[Batch, list[Peeked]]:
    claims, refused, peeked = [], [], []
    for row in rows:
        if len(row) > 15 and row[15] is not None:
            peeked.append(Peeked(row[0], row[15], row[16] or ""))
        elif row[10] is None:  # picked, not claimed
            refused.append(row[0])
        else:
            claim = claim_from_row(row)
            provider, compensates = row[13:15]
            claims.append(BatchClaim(**vars(claim), provider=provider, compensates=compensates))
    return Batch(claims, refused), peeked


def claim_provider(
    *, provider: str, limit: int, peek: int, held: list[str], worker: str,
    skip: list[str] | tuple[str, ...] = (),
) -> tuple[Batch, list[Peeked]]:  # fmt: skip
    """Claim up to ``limit`` due effects of ``provider`` sent with the deployment's
    credential, and peek at up to ``peek`` sent with tenants' own credentials (none of
    ``held``), in one statement (``_CLAIM_PROVIDER``)."""
    params = claim_params(now=timezone.now(), worker=worker, budgets=_budgets())
    params.update(provider=provider, limit=limit, peek=peek, held=list(held), skip=list(skip))
    return _batch_of(_execute(_CLAIM_PROVIDER, params))


def claim_sent_with(
    *, keys: dict[str, str], worker: str, skip: list[str] | tuple[str, ...] = ()
) -> Batch:
    """Claim the effects of ``keys`` (effect id -> the fingerprint of the credential it was
    admitted for) that are still due and still go out with that credential."""
    params = claim_params(now=timezone.now(), worker=worker, budgets=_budgets())
    params.update(ids=list(keys), keys=json.dumps(keys), limit=len(keys), skip=list(skip))
    return _batch_of(_execute(_CLAIM_SENT_WITH, params))[0]


# The same choice of due effects, read without claiming: the drain when the fast path is off
# (every effect then goes through the general path, one by one).
_DUE = _compact(f"SELECT e.effect_id {_DUE_WHERE}")


def due_effect_ids(
    *, limit: int, skip: list[str] | tuple[str, ...] = (), exclude: list[str] | tuple[str, ...] = ()
) -> list[str]:
    params: dict[str, Any] = {"now": timezone.now(), "limit": limit, "skip": list(skip)}
    params.update(exclude=list(exclude), only="")
    with connection.cursor() as cursor:
        cursor.execute(_DUE, params)
        return [effect_id for (effect_id,) in cursor.fetchall()]


# --- record -----------------------------------------------------------------------------------

# One row per outcome (``o``), written by ``fastpath.RECORD_CTES`` (the single record's own
# statement). The outcomes arrive as one JSON array of rows (``fastpath.outcome_row``), not an
# array per column: psycopg inspects and dumps every element of every list it binds, and 21
# lists of a batch's values were most of this statement's CPU in the worker (jsonb, not
# json: with its parse, the cheaper of the two for PostgreSQL at a full batch). The effect
# rows are named by ``= ANY(ids)`` as well: the planner knows nothing of ``o``'s rows, and
# without statistics (no ANALYZE yet) it chose to scan a whole table to join them.
_OUTCOME_TYPES = ", ".join(f"{name} {type_}" for name, type_ in OUTCOME_COLUMNS)
_RECORD_BATCH = _compact(f"""
WITH o AS (
    SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb) AS o ({_OUTCOME_TYPES})
), {RECORD_CTES}
SELECT effect_id FROM recorded
""")


@dataclass(frozen=True)
class Answer:
    """A provider's answer to one claimed effect, with the bookkeeping it leads to
    (``services.outcome_fields``)."""

    claim: BatchClaim
    result: CallResult
    fields: dict[str, Any]


def record_batch(*, answers: list[Answer], worker: str, now: datetime) -> set[str]:
    """Write each outcome at its claim's fence, in one statement. Returns the effects written;
    the others need the general record (stale, or a webhook endpoint of the tenant that hears
    of the outcome). Pass no compensation (``claim.compensates``): its record settles the
    original, the general way."""
    assert not any(answer.claim.compensates for answer in answers)
    rows = [
        outcome_row(answer.claim, answer.result, answer.fields, provider=answer.claim.provider,
                    now=now)
        for answer in answers
    ]  # fmt: skip
    params = {
        # Times as ISO 8601 with their offset: PostgreSQL reads them back to the microsecond.
        "rows": json.dumps(rows, separators=(",", ":"), default=_iso),
        "ids": [answer.claim.effect_id for answer in answers],
        "now": now,
        "actor": worker_actor(worker),
        "announced": ANNOUNCED,  # an endpoint that hears of the outcome: the general record
    }
    return {effect_id for (effect_id,) in _execute(_RECORD_BATCH, params)}
