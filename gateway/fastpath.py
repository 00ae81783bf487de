"""The ledger's hot path in as few round trips as PostgreSQL allows.

Three statements carry an ordinary effect from submission to its outcome, each one atomic on
its own (autocommit: no BEGIN, no COMMIT round trip, no transaction open across Python work):

1. **submit**: one CTE inserts the command, the effect and the ``submitted`` event, or — when
   the (tenant, key) already exists — returns the existing command and effect with its latest
   receipt, so that a replay is one query and writes nothing (a key this process has seen is
   read with the SELECT half alone: ``KnownKeys``);
2. **claim**: one CTE locks the effect, moves it PREPARED/NOT_STARTED → DISPATCHING at
   ``fence + 1`` *only if* every dispatch check holds (not frozen, command not expired,
   attempts left, principal not frozen, type not frozen, grant live, approval fresh, no saga),
   inserts the ``claimed`` event and the attempt row, and returns what the adapter needs;
3. **record**: one CTE writes the outcome at the claim's fence (status, event, attempt,
   receipt) *only if* nothing else has to happen in that transaction (no compensation to
   settle, no saga to tell, no webhook endpoint of the tenant that hears of this outcome).

Each returns None when its conditions do not hold, and the caller takes the general path in
``gateway.services`` (which decides why: expire, reject, refuse a stale write, …). The rules
are the general path's; this module only folds them into the WHERE clauses. PostgreSQL only.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from gateway import hooks, ledger, signing, trust
from gateway.checkpoints import ReceiptFields, receipt_seal
from gateway.choices import (
    CREDENTIAL_USABLE,
    DISPATCHABLE,
    OUTCOME_STATUS,
    ApprovalState,
    AttemptState,
    EffectStatus,
    EventKind,
)
from gateway.errors import ValidationProblem
from gateway.ledger import worker_actor
from gateway.lib import prepared
from gateway.lib.digest import sha256_digest
from gateway.models import Capability, Command, Effect, Principal, Receipt
from gateway.submission import NewRows
from gateway.webhooks.choices import EVENT_FOR_STATUS
from gateway.webhooks.models import WebhookEndpoint

S = EffectStatus


# The webhook event each outcome of a dispatch announces (``webhooks.choices.EVENT_FOR_STATUS``;
# from DISPATCHING no approval event can fire), as the records bind it: a record writes on
# its own only if no enabled endpoint of the tenant subscribes to its outcome's event, since
# ``webhooks.services.outbox_record`` would write nothing then either. An endpoint that hears
# of it (whatever its principal and run filters) sends the record the general way, which
# writes the outbox rows in the same transaction.
ANNOUNCED = json.dumps({str(status): str(event) for status, event in EVENT_FOR_STATUS.items()})


def enabled() -> bool:
    """Whether the statements below may run: the claim and the record call none of
    ``hooks.after_transition`` and ask none of ``hooks.dispatch_holds``, so each must say it
    may be skipped (``hooks.fast_path_idle``); the general path calls every one."""
    if not settings.GATEWAY_FAST_PATH:
        return False
    return hooks.after_transition.fast_path_may_skip() and hooks.dispatch_holds.fast_path_may_skip()


def sql_literal(value: str) -> str:
    """A Python definition (a status, a kind, a default) as an SQL literal. The statements
    render them once, at import: their text stays constant, so each is still prepared once
    per connection (``gateway.lib.prepared``), and says what the enum says."""
    return "'" + str(value).replace("'", "''") + "'"


def sql_literals(values) -> str:
    """Several, for ``IN (...)`` (sorted: the text must not depend on a set's order)."""
    return ", ".join(sql_literal(value) for value in sorted(values))


# Rendered once (see ``sql_literal``).
DISPATCHING = sql_literal(S.DISPATCHING)
PREPARED = sql_literal(S.PREPARED)
DISPATCHABLE_IN = sql_literals(DISPATCHABLE)
NO_SAGA = sql_literal(Command._meta.get_field("saga_id").get_default())
RECEIPT_DISPATCH = sql_literal(Receipt.Source.DISPATCH)
FINISHED = sql_literal(AttemptState.FINISHED)
DISPATCHED = sql_literal(EventKind.DISPATCHED)


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _columns(model, alias: str) -> tuple[str, list]:
    """The model's columns, read by position (a row may repeat a name: PostgreSQL allows it)."""
    fields = list(model._meta.concrete_fields)
    return ", ".join(f'{alias}."{f.column}"' for f in fields), fields


def _compact(sql: str) -> str:
    """The statement on one line: psycopg caches its parse of a statement (placeholders to
    ``$n``) only up to 4096 bytes; beyond that it runs its regex over every execution, which
    cost the submission statement about a tenth of the process's CPU. No literal in these
    statements holds two spaces in a row, so collapsing whitespace changes nothing else."""
    return " ".join(sql.split())  # tests/gateway/test_fastpath_statements.py: the limit


def _load(model, fields, values, alias: str | None = None):
    """A model instance from raw values (the converters the ORM would apply, JSON mostly)."""
    names, converters = _loaders.get(id(fields)) or _loader(fields)
    if converters:
        values = list(values)
        for index, from_db in converters:
            if values[index] is not None:
                values[index] = from_db(values[index], None, connection)
    return model.from_db(alias or connection.alias, names, values)


# id(fields) -> (attnames, [(position, from_db_value)]): a replay loads four models, and
# looking the converters up field by field was a tenth of its CPU in the web process.
_loaders: dict[int, tuple[list[str], list[tuple[int, Any]]]] = {}


def _loader(fields) -> tuple[list[str], list[tuple[int, Any]]]:
    converters = [
        (index, field.from_db_value)
        for index, field in enumerate(fields)
        if getattr(field, "from_db_value", None) is not None
    ]
    loader = ([f.attname for f in fields], converters)
    _loaders[id(fields)] = loader
    return loader


def _built(model, fields, alias: str, **values):
    """A saved row's instance from the values just written: what ``model(**values)`` with
    ``_state`` marked saved gives (defaults for the fields not named), built the way the ORM
    builds a fetched row (by position: the keyword constructor cost a twentieth of the web
    process's CPU per submission)."""
    row = [values.pop(f.attname) if f.attname in values else f.get_default() for f in fields]
    assert not values, values  # a name that is not a column's
    return model.from_db(alias, None, row)


def _cache(instance, name: str, value) -> None:
    instance._meta.get_field(name).set_cached_value(instance, value)


# --- the grants an agent submits under: read once per TTL per process ------------------------


def _live_grants(principal: Principal, now) -> list[Capability]:
    """The principal's live grants, from this process's short trust (gateway.trust: the same
    window as the token; dispatch re-checks the grant) or the database."""
    grants = trust.grants.get(principal.pk)
    if grants is not None:
        return grants
    from gateway.capabilities import _live

    grants = list(Capability.objects.filter(_live(now), principal=principal).order_by("created_at"))
    trust.grants.put(principal.pk, grants)
    return grants


class Grant(NamedTuple):
    """The grant a fast submission runs under, and what its statement reserves on it."""

    capability: Capability
    budgeted: bool  # the statement reserves one use (and ``amount``) on the grant's row
    amount: int  # minor units counted against an amount budget (0 without one)


def submission_grant(
    principal: Principal, contract, resource: dict, payload: dict, now
) -> Grant | None:
    """The grant ``capabilities.capability_reserve`` would try first: the first live grant
    that matches the type and resource (and, for one with an amount budget, the payload's
    currency). None when the general path must decide: no grant (a 403 with its reason), or
    an amount it refuses (a 400). A budgeted grant is reserved by the submission statement
    itself; if its budget is spent, the statement writes nothing and the general path tries
    the next grant or refuses, as it always did."""
    from gateway.capabilities import _matches, _money

    for cap in _live_grants(principal, now):
        if cap.expires_at is not None and cap.expires_at <= now:
            continue
        if cap.revoked_at is not None or not _matches(cap, contract.type, resource):
            continue
        if cap.budget_count is None and cap.budget_amount is None:
            return Grant(cap, budgeted=False, amount=0)
        try:
            amount, currency = _money(payload)
        except ValidationProblem:
            return None  # the general path says why, with its field errors
        moves_money = "amount" in payload or "currency" in payload
        if moves_money and cap.budget_amount is not None:
            if cap.budget_currency not in ("", currency):
                continue  # a grant in one currency covers no other
            return Grant(cap, budgeted=True, amount=amount)
        return Grant(cap, budgeted=True, amount=0)
    return None


# --- 1. submit ---------------------------------------------------------------------------------

_C_COLS, _C_FIELDS = _columns(Command, "c")
_E_COLS, _E_FIELDS = _columns(Effect, "e")
_R_COLS, _R_FIELDS = _columns(Receipt, "r")
_P_COLS, _P_FIELDS = _columns(Principal, "p")

# Insert, or read what the key already names: one statement, one snapshot. The read half
# returns a row only when the insert did nothing (the key exists); then nothing is written.
_NULLS = ", ".join(["NULL"] * (len(_C_FIELDS) + len(_E_FIELDS) + len(_P_FIELDS) + len(_R_FIELDS)))
# The command and effect rows are bound as one JSON object each, the rows ``submission.new_rows``
# gives with every other column at its model default (``_row_json``), and expanded by
# PostgreSQL into the tables' own columns: the statement names no column of either, so a
# column added to a model is written here as soon as ``new_rows`` gives it a value.
_NEW_COMMAND = f"jsonb_populate_record(NULL::{Command._meta.db_table}, %(command)s::jsonb)"
_NEW_EFFECT = f"jsonb_populate_record(NULL::{Effect._meta.db_table}, %(effect)s::jsonb)"
_EFFECT_AND_EVENT = f"""eff AS (
    INSERT INTO {Effect._meta.db_table}
    SELECT new.* FROM cmd, {_NEW_EFFECT} AS new
    RETURNING effect_id
), ev AS (
    INSERT INTO gateway_effectevent (
        tenant_id, effect_id, subject, kind, from_status, to_status, actor, principal_id,
        reason, data, created_at)
    SELECT %(tenant)s, effect_id, '', %(kind)s, '', %(status)s, %(actor)s, %(principal)s,
        %(reason)s, %(event_data)s::jsonb, %(now)s
    FROM eff
    RETURNING effect_id
)"""
# An effect as a replay and a read answer with it (``_existing_from_row``): its command,
# the effect, the requester and the newest receipt; the caller adds the WHERE.
_EFFECT_ROW = f"""
    SELECT {_C_COLS}, {_E_COLS}, {_P_COLS}, {_R_COLS}
    FROM gateway_command c
    JOIN gateway_effect e ON e.effect_id = c.effect_id
    JOIN gateway_principal p ON p.id = c.requested_by_id
    LEFT JOIN LATERAL (
        SELECT * FROM gateway_receipt r0 WHERE r0.effect_id = c.effect_id
        ORDER BY r0.received_at DESC, r0.id DESC LIMIT 1
    ) r ON true"""
_EXISTING = f"""existing AS ({_EFFECT_ROW}
    WHERE c.tenant_id = %(tenant)s AND c.idempotency_key = %(key)s"""
_ANSWER = f"""
SELECT true, {_NULLS} FROM ev
UNION ALL
SELECT false, existing.* FROM existing"""

# A grant without a budget: the command is inserted unless the key exists.
_SUBMIT_OR_EXISTING = _compact(f"""
WITH cmd AS (
    INSERT INTO {Command._meta.db_table} SELECT new.* FROM {_NEW_COMMAND} AS new
    ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
    RETURNING effect_id
), {_EFFECT_AND_EVENT}, {_EXISTING}
      AND NOT EXISTS (SELECT 1 FROM cmd)
){_ANSWER}
""")

# A grant with a budget (capabilities.capability_reserve, folded in): one use and the amount
# are reserved on the grant's row by compare-and-set, and the command is inserted only if
# that reservation took. A key that already exists reserves nothing (a replay spends no
# budget). A first submission of the same key that commits after this statement's snapshot
# (a racer) makes the plain INSERT fail with a unique violation, which undoes this
# statement's reservation with it; the caller then reads the racer's effect the general way.
# A spent budget, or a grant revoked or expired since this process cached it, reserves and
# writes nothing: the general path decides (the next grant, or a 403 that says why).
_SUBMIT_RESERVING_OR_EXISTING = _compact(f"""
WITH {_EXISTING}
), reserve AS (
    UPDATE gateway_capability k
       SET spent_count = k.spent_count + 1, spent_amount = k.spent_amount + %(reserved)s
     WHERE k.id = %(capability)s AND k.revoked_at IS NULL
       AND (k.expires_at IS NULL OR k.expires_at > %(now)s)
       AND (k.budget_count IS NULL OR k.spent_count < k.budget_count)
       AND (k.budget_amount IS NULL OR k.spent_amount <= k.budget_amount - %(reserved)s)
       AND NOT EXISTS (SELECT FROM existing)
    RETURNING k.id
), cmd AS (
    INSERT INTO {Command._meta.db_table} SELECT new.* FROM reserve, {_NEW_COMMAND} AS new
    RETURNING effect_id
), {_EFFECT_AND_EVENT}{_ANSWER}
""")


# A replay of a key this process has seen: the existing effect alone, without the insert's
# half (the statement above plans and initialises every CTE of the insert, and the caller
# seals and redacts a payload it will not write).
_REPLAY = _compact(f"""
WITH {_EXISTING}
) SELECT false, existing.* FROM existing
""")


# An effect by id in the caller's tenant, as a replay reads it (command, requester, newest
# receipt): the agents' GET /effects/{id}, the lane's read, prepared. The ORM's query for the
# same (selectors.effect_get) cost more to compile than PostgreSQL spends running it: in an
# agent's loop of submit-and-wait, a third of a web process's samples.
_EFFECT_BY_ID = _compact(f"""{_EFFECT_ROW}
    WHERE c.tenant_id = %(tenant)s AND c.effect_id = %(effect)s""")


_STATUS_BY_ID = _compact("""
    SELECT e.status FROM gateway_effect e
    WHERE e.tenant_id = %(tenant)s AND e.effect_id = %(effect)s""")


def effect_status(*, principal: Principal, effect_id: str) -> str | None:
    """The status of the effect ``effect_id`` of the principal's tenant, None if the tenant has
    no such effect: all that a long poll needs before it waits (``effect_read`` is for the
    answer)."""
    row = prepared.fetchone(_STATUS_BY_ID, {"tenant": principal.tenant_id, "effect": effect_id})
    return None if row is None else row[0]


def effect_read(*, principal: Principal, effect_id: str) -> Effect | None:
    """The effect ``effect_id`` of the principal's tenant with its command, requester and
    newest receipt, in one prepared query (its approver, if any, is read when asked for);
    None if the tenant has no such effect."""
    row = prepared.fetchone(_EFFECT_BY_ID, {"tenant": principal.tenant_id, "effect": effect_id})
    return None if row is None else _existing_from_row(row, principal)


class KnownKeys:
    """The (tenant, idempotency key) pairs this process has written or replayed, newest last,
    at most ``size`` (``GATEWAY_REPLAY_MEMO``; 0 keeps none).

    A key, once committed, names the same command for ever (commands are never deleted and
    their key never changes), so "this key exists" stays true; the memo only decides which
    statement a submission tries first. A known key is read with the one SELECT of
    ``_REPLAY``; if that finds nothing (a row this process saw in a transaction that was rolled
    back), the submission statement runs as if the key were unknown. Either way the answer is
    the database's: the memo can cost one SELECT, never a wrong answer."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._keys: OrderedDict[tuple[int, str], None] = OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, item: tuple[int, str]) -> bool:
        return item in self._keys  # a dict read: atomic under the GIL

    def add(self, item: tuple[int, str]) -> None:
        if self.size <= 0:
            return
        with self._lock:
            self._keys[item] = None
            self._keys.move_to_end(item)
            while len(self._keys) > self.size:
                self._keys.popitem(last=False)

    def discard(self, item: tuple[int, str]) -> None:
        with self._lock:
            self._keys.pop(item, None)

    def clear(self) -> None:
        with self._lock:
            self._keys.clear()


known_keys = KnownKeys(settings.GATEWAY_REPLAY_MEMO)


def replay(*, principal: Principal, idempotency_key: str) -> Effect | None:
    """The effect ``idempotency_key`` names in the principal's tenant, read as the submission
    statement reads it for a replay (one query, nothing written); None if there is none."""
    item = (principal.tenant_id, idempotency_key)
    row = prepared.fetchone(_REPLAY, {"tenant": principal.tenant_id, "key": idempotency_key})
    if row is None:
        known_keys.discard(item)
        return None
    known_keys.add(item)
    return _existing_from_row(row[1:], principal)


@dataclass(frozen=True)
class Written:
    """The effect as the submission statement wrote or found it, ready to answer with."""

    effect: Effect
    created: bool


def _existing_from_row(row, principal: Principal) -> Effect:
    n_c, n_e, n_p = len(_C_FIELDS), len(_E_FIELDS), len(_P_FIELDS)
    alias = connection.alias
    command = _load(Command, _C_FIELDS, row[:n_c], alias)
    effect = _load(Effect, _E_FIELDS, row[n_c : n_c + n_e], alias)
    requester = _load(Principal, _P_FIELDS, row[n_c + n_e : n_c + n_e + n_p], alias)
    receipt_values = row[n_c + n_e + n_p :]
    requester.tenant = principal.tenant  # one tenant: the query is scoped by it
    command.requested_by = requester
    command.tenant = principal.tenant
    effect.command = command
    effect.tenant = principal.tenant
    receipt = None
    if receipt_values[0] is not None:
        receipt = _load(Receipt, _R_FIELDS, receipt_values, alias)
    # Read with the effect: the serializer answers with it instead of a second query.
    effect._latest_receipt = receipt
    return effect


def submit(
    *, principal: Principal, rows: NewRows, payload: dict, grant: Grant | None
) -> Written | None:
    """Insert command + effect + event (reserving on a budgeted ``grant``), or find the key's
    existing effect: one statement. ``rows`` are the rows the general path would write
    (``submission.new_rows``), under ``grant``'s capability and amount.

    None when the existing row was committed after this statement's snapshot (a concurrent
    submission of the same key), or the grant's budget did not take: the caller decides the
    general way.
    """
    alias = connection.alias
    command = _built(Command, _C_FIELDS, alias, **rows.command)
    effect = _built(Effect, _E_FIELDS, alias, **rows.effect)
    params = _submit_params(principal, command, effect, rows.event)
    if grant is not None and grant.budgeted:
        row = _reserving(params)
    else:
        row = prepared.fetchone(_SUBMIT_OR_EXISTING, params)
    if row is None:
        return None
    known_keys.add((principal.tenant_id, command.idempotency_key))
    if not row[0]:
        return Written(_existing_from_row(row[1:], principal), created=False)
    # The related objects the keyword constructors would have cached (the answer reads them).
    _cache(command, "tenant", principal.tenant)
    _cache(command, "requested_by", principal)
    _cache(command, "capability", grant.capability if grant else None)
    _cache(effect, "tenant", principal.tenant)
    _cache(effect, "command", command)
    Effect._meta.get_field("command").remote_field.set_cached_value(command, effect)
    effect._latest_receipt = None
    # The submitter's own payload, as sent: the answer needs no decryption.
    effect._clear_payload = payload
    return Written(effect, created=True)


def _submit_params(principal: Principal, command, effect, event: dict[str, Any]) -> dict:
    return {
        "tenant": principal.tenant_id,
        "key": command.idempotency_key,
        "command": _row_json(command, _C_FIELDS),
        "effect": _row_json(effect, _E_FIELDS),
        "capability": command.capability_id,
        "reserved": command.budget_amount,
        "now": command.created_at,
        "principal": principal.pk,
        "status": event["to_status"],
        "kind": event["kind"],
        "actor": event["actor"],
        "reason": event["reason"],
        "event_data": _json(event["data"]),
    }


def _row_json(instance, fields) -> str:
    """The instance's row as ``jsonb_populate_record`` reads it: every column by name; times
    as ISO 8601 with their offset (PostgreSQL reads them back to the microsecond)."""
    return json.dumps(
        {field.column: getattr(instance, field.attname) for field in fields},
        separators=(",", ":"),
        default=_iso,
    )


def _iso(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not a column value this statement binds")


def _reserving(params: dict[str, Any]):
    """The reserving statement's row; None when a racer committed the key first (the unique
    violation undid the whole statement, its reservation too). Inside a transaction (a
    caller's, or a test's) it runs in a savepoint, so that the violation leaves the
    transaction usable; in autocommit, as the API runs, it costs nothing more."""
    try:
        if connection.in_atomic_block:
            with transaction.atomic():
                return prepared.fetchone(_SUBMIT_RESERVING_OR_EXISTING, params)
        return prepared.fetchone(_SUBMIT_RESERVING_OR_EXISTING, params)
    except IntegrityError:
        return None


# --- 2. claim ----------------------------------------------------------------------------------

# The claim, written once for both callers: this module's single claim (the effect named,
# locked by ``old``) and the drainer's batch (``gateway.fastpath_batch``: the due effects
# ``due`` picked and locked). ``claimed`` moves to DISPATCHING at ``fence + 1`` exactly those
# rows of ``{locked}`` (effect_id, status) for which every dispatch check holds; each gets its
# ``claimed`` event and its ``sending`` attempt. An approval must name this command's digest;
# an approved command of a type whose approvals are signed (``signed_types``), or one that
# came with an API token revoked before it was submitted, is the general path's: it verifies
# the approval's signature and refuses the token (gateway.signing). No SQL comment in here:
# ``_compact`` puts the statement on one line. Parameters: now, lease, budgets
# (``attempt_budgets``), approved_after, signed_types, actor, worker.
CLAIM_CHECKS = f"""
c.effect_id = e.effect_id AND p.id = c.requested_by_id
AND c.expires_at > %(now)s
AND budget.type = e.type AND e.attempt_count < budget.attempts
AND NOT p.frozen
AND c.saga_id = {NO_SAGA}
AND (NOT c.approval_required OR e.approved_at > %(approved_after)s)
AND (NOT c.approval_required OR (e.approval_state = {sql_literal(ApprovalState.APPROVED)}
                                 AND e.approved_digest = c.payload_digest
                                 AND NOT %(signed_types)s::jsonb ? e.type))
AND (c.submitted_with_id IS NULL OR NOT EXISTS (
     SELECT 1 FROM gateway_apitoken t WHERE t.id = c.submitted_with_id
        AND t.revoked_at <= c.created_at))
AND NOT EXISTS (SELECT 1 FROM gateway_effecttypefreeze f
                 WHERE f.tenant_id = e.tenant_id AND f.type = e.type)
AND (c.capability_id IS NULL OR EXISTS (
     SELECT 1 FROM gateway_capability k WHERE k.id = c.capability_id
        AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > %(now)s)))
"""


def claim_ctes(locked: str) -> str:
    """The ``claimed``, ``ev`` and ``attempt`` CTEs over the locked rows of CTE ``locked``."""
    return f"""
claimed AS (
    UPDATE gateway_effect e
       SET status = {DISPATCHING}, fence = e.fence + 1, attempt_count = e.attempt_count + 1,
           next_dispatch_at = NULL, lease_expires_at = %(lease)s, status_changed_at = %(now)s,
           updated_at = %(now)s
      FROM {locked}, gateway_command c, gateway_principal p,
           jsonb_to_recordset(%(budgets)s::jsonb) AS budget (type text, attempts int)
     WHERE e.effect_id = {locked}.effect_id AND e.status = {locked}.status AND NOT e.frozen
       AND {CLAIM_CHECKS}
    RETURNING e.effect_id, e.tenant_id, e.fence, e.attempt_count, e.check_count,
              {locked}.status AS from_status, c.type, c.provider_key, c.resource,
              c.payload_sealed, c.payload_digest, c.provider,
              c.compensates_id IS NOT NULL AS compensates
), ev AS (
    INSERT INTO gateway_effectevent (
        tenant_id, effect_id, subject, kind, from_status, to_status, actor, principal_id,
        reason, data, created_at)
    SELECT tenant_id, effect_id, '', {sql_literal(EventKind.CLAIMED)}, from_status, {DISPATCHING},
           %(actor)s, NULL,
           'attempt ' || attempt_count, jsonb_build_object('fence', fence), %(now)s
      FROM claimed
), attempt AS (
    INSERT INTO gateway_attempt (
        effect_id, number, fence, worker, state, outcome, http_status, provider_operation_id,
        error, started_at, finished_at)
    SELECT effect_id, attempt_count, fence, %(worker)s, {sql_literal(AttemptState.SENDING)}, '',
           NULL, '', '', %(now)s, NULL
      FROM claimed
    RETURNING id, effect_id
)"""


# What a claim returns per claimed effect (the batch adds the command's provider and whether
# it compensates).
# Whether the effect's tenant holds a credential of its own (gateway.provider_credentials):
# only then does choosing what to send with cost a statement of its own.
OWN_CREDENTIALS = f"""EXISTS (
    SELECT 1 FROM gateway_providercredential pc
    WHERE pc.tenant_id = claimed.tenant_id
      AND pc.state IN ({", ".join(f"'{state}'" for state in sorted(CREDENTIAL_USABLE))}))"""

CLAIM_RETURNING = f"""
claimed.effect_id, claimed.tenant_id, claimed.fence, claimed.attempt_count,
claimed.check_count, claimed.type, claimed.provider_key, claimed.resource,
claimed.payload_sealed, claimed.payload_digest, attempt.id, claimed.from_status,
{OWN_CREDENTIALS}"""


def attempt_budgets() -> str:
    """Each type's attempt budget (its contract's recovery policy; unknown types: none), as
    the claim binds it: one JSON array of rows. As two arrays (types, budgets) they were most
    of the claim's parameter dumping: psycopg inspects and dumps each element of a list."""
    from gateway.contracts import CONTRACTS

    return _json(
        [
            {"type": type_, "attempts": contract.recovery.max_dispatch_attempts}
            for type_, contract in CONTRACTS.items()
        ]
    )


def claim_params(*, now, worker: str, budgets: str) -> dict[str, Any]:
    return {
        "now": now,
        "lease": now + timedelta(seconds=settings.GATEWAY_DISPATCH_LEASE),
        "budgets": budgets,
        "approved_after": now - timedelta(seconds=settings.GATEWAY_APPROVAL_TTL),
        "signed_types": _json(signing.signed_types()),
        "actor": worker_actor(worker),
        "worker": worker,
    }


_CLAIM = _compact(f"""
WITH old AS (
    SELECT effect_id, status FROM gateway_effect
    WHERE effect_id = %(id)s AND status IN ({DISPATCHABLE_IN}) AND NOT frozen
    FOR UPDATE
), {claim_ctes("old")}
SELECT {CLAIM_RETURNING}
  FROM claimed JOIN attempt ON attempt.effect_id = claimed.effect_id
""")


@dataclass(frozen=True)
class FastClaim:
    effect_id: str
    tenant_id: int
    fence: int
    attempt_id: int
    attempt_number: int
    check_count: int
    type: str
    provider_key: str
    resource: dict
    payload_sealed: str
    payload_digest: str
    from_status: str  # what the claim moved it from (PREPARED, NOT_STARTED)
    # The tenant holds a credential of its own for some provider: what the attempt is sent
    # with is chosen by gateway.provider_credentials (else the deployment's, with no query).
    own_credentials: bool = field(default=True, kw_only=True)


def claim(*, effect_id: str, worker: str) -> FastClaim | None:
    """Claim ``effect_id`` if every dispatch check holds; None otherwise (or if another worker
    has it): the general path then decides what the effect needs."""
    params = claim_params(now=timezone.now(), worker=worker, budgets=attempt_budgets())
    params["id"] = effect_id
    row = prepared.fetchone(_CLAIM, params)
    if row is None:
        return None
    return claim_from_row(row)


def claim_from_row(row) -> FastClaim:
    """A claim from the columns of ``CLAIM_RETURNING``."""
    (eid, tenant_id, fence, number, checks, type_, key, resource, sealed, digest, aid, from_) = row[
        :12
    ]
    if isinstance(resource, str):
        resource = json.loads(resource)
    return FastClaim(
        eid,
        tenant_id,
        fence,
        aid,
        number,
        checks,
        type_,
        key,
        resource,
        sealed,
        digest,
        from_,
        own_credentials=bool(row[12]),
    )


# --- 3. record ---------------------------------------------------------------------------------

# One outcome's values, named and typed once for both records: the single record binds them
# as parameters (``o`` is then one row), the drainer's batch record as the rows of one JSON
# array (gateway.fastpath_batch). ``outcome_row`` gives them.
OUTCOME_COLUMNS = (
    ("effect_id", "text"),
    ("fence", "bigint"),
    ("to_status", "text"),
    ("next_check", "timestamptz"),
    ("next_dispatch", "timestamptz"),
    ("op_id", "text"),
    ("mismatch", "bool"),
    ("confirmed", "timestamptz"),
    ("reason", "text"),
    ("evidence", "jsonb"),
    ("outcome", "text"),
    ("http_status", "int"),
    ("error", "text"),
    ("attempt_id", "bigint"),
    ("op_status", "text"),
    ("op_digest", "text"),
    ("op_result", "jsonb"),
    ("result_digest", "text"),
    ("seal", "text"),
)

# The record, written once for both callers: each outcome of ``o`` at its claim's fence
# (status, ``dispatched`` event, attempt end, receipt), only for a command that compensates
# nothing and belongs to no saga (those need their own writes) and a tenant without an
# enabled endpoint subscribed to the outcome's event (ANNOUNCED). ``recorded`` names the
# effects written; the caller records the others the general way. No SQL comment in here
# (``_compact``). Parameters: ids (the effects of ``o``), now, actor, announced.
RECORD_CTES = f"""
recorded AS (
    UPDATE gateway_effect e
       SET status = o.to_status, status_changed_at = %(now)s, updated_at = %(now)s,
           lease_expires_at = NULL, next_check_at = o.next_check,
           next_dispatch_at = o.next_dispatch,
           provider_operation_id = COALESCE(o.op_id, e.provider_operation_id),
           mismatch = e.mismatch OR o.mismatch,
           confirmed_at = COALESCE(o.confirmed, e.confirmed_at)
      FROM o, gateway_command c
     WHERE e.effect_id = ANY(%(ids)s::text[]) AND e.effect_id = o.effect_id
       AND e.status = {DISPATCHING} AND e.fence = o.fence
       AND c.effect_id = e.effect_id AND c.compensates_id IS NULL AND c.saga_id = {NO_SAGA}
       AND NOT EXISTS (SELECT 1 FROM {WebhookEndpoint._meta.db_table} w
                        WHERE w.tenant_id = e.tenant_id AND w.enabled
                          AND w.event_types ? (%(announced)s::jsonb ->> o.to_status))
    RETURNING e.effect_id, e.tenant_id, c.provider, c.payload_digest AS command_digest
), ev AS (
    INSERT INTO gateway_effectevent (
        tenant_id, effect_id, subject, kind, from_status, to_status, actor, principal_id,
        reason, data, created_at)
    SELECT r.tenant_id, r.effect_id, '', {DISPATCHED}, {DISPATCHING}, o.to_status, %(actor)s,
           NULL, o.reason, o.evidence, %(now)s
      FROM recorded r JOIN o ON o.effect_id = r.effect_id
), attempt AS (
    UPDATE gateway_attempt a SET state = {FINISHED}, outcome = o.outcome,
           http_status = o.http_status, provider_operation_id = COALESCE(o.op_id, ''),
           error = o.error, finished_at = %(now)s
      FROM o JOIN recorded r ON r.effect_id = o.effect_id
     WHERE a.id = o.attempt_id
), receipt AS (
    INSERT INTO gateway_receipt (
        effect_id, attempt_id, source, provider, provider_operation_id, provider_status,
        payload_digest, digest_matches, result, result_digest, received_at, seal)
    SELECT r.effect_id, o.attempt_id, {RECEIPT_DISPATCH}, r.provider, o.op_id, o.op_status,
           o.op_digest, o.op_digest = r.command_digest, o.op_result, o.result_digest,
           %(now)s, o.seal
      FROM recorded r JOIN o ON o.effect_id = r.effect_id
     WHERE o.op_id IS NOT NULL
)"""

_OUTCOME_PARAMS = ", ".join(f"%({name})s::{type_} AS {name}" for name, type_ in OUTCOME_COLUMNS)
_RECORD = _compact(f"""
WITH o AS (SELECT {_OUTCOME_PARAMS}), {RECORD_CTES}
SELECT count(*) FROM recorded
""")


def record_evidence(claim: FastClaim, result) -> dict[str, Any]:
    """The ``dispatched`` event's data: the attempt and what the provider answered."""
    operation = result.operation
    return {
        "attempt": claim.attempt_number,
        "fence": claim.fence,
        "outcome": str(result.outcome),
        "http_status": result.http_status,
        "provider_operation_id": operation.id if operation else None,
        "provider_status": operation.status if operation else None,
        "mismatch": result.mismatch,
        "error": (result.error or "")[:500],
    }


def outcome_row(
    claim: FastClaim, result, fields: dict[str, Any], *, provider: str, now: datetime
) -> dict[str, Any]:
    """One outcome's values (``OUTCOME_COLUMNS``): the status it leads to, the bookkeeping
    that goes with it (``services.outcome_fields``), the event's evidence, the attempt's end,
    and the receipt with the seal the general path gives one (gateway.checkpoints)."""
    operation = result.operation
    seal, result_digest = "", None
    if operation is not None:
        result_digest = sha256_digest(operation.result)
        seal = receipt_seal(
            ReceiptFields(
                effect_id=claim.effect_id,
                attempt_id=claim.attempt_id,
                source=Receipt.Source.DISPATCH,
                provider=provider,
                provider_operation_id=operation.id,
                provider_status=operation.status,
                payload_digest=operation.payload_digest,
                digest_matches=operation.payload_digest == claim.payload_digest,
                result_digest=result_digest,
                received_at=now,
            )
        )
    return {
        "effect_id": claim.effect_id,
        "fence": claim.fence,
        "to_status": str(OUTCOME_STATUS[result.outcome]),
        "next_check": fields.get("next_check_at"),
        "next_dispatch": fields.get("next_dispatch_at"),
        "op_id": operation.id if operation else None,
        "mismatch": bool(fields.get("mismatch")),
        "confirmed": fields.get("confirmed_at"),
        "reason": result.reason,
        "evidence": record_evidence(claim, result),
        "outcome": str(result.outcome),
        "http_status": result.http_status,
        "error": (result.error or "")[:2000],
        "attempt_id": claim.attempt_id,
        "op_status": operation.status if operation else None,
        "op_digest": operation.payload_digest if operation else None,
        "op_result": operation.result if operation else {},
        "result_digest": result_digest,
        "seal": seal,
    }


def record(*, claim: FastClaim, result, worker: str, fields: dict, now) -> bool:
    """Write the outcome at the claim's fence in one statement. False: the general path must
    (a stale claim, or a compensation / saga / webhook endpoint that needs its own writes)."""
    from gateway.contracts import get_contract

    contract = get_contract(claim.type)
    provider = contract.provider if contract else ""
    row = outcome_row(claim, result, fields, provider=provider, now=now)
    params = {
        **row,
        "evidence": _json(row["evidence"]),
        "op_result": _json(row["op_result"]),
        "ids": [claim.effect_id],
        "now": now,
        "actor": worker_actor(worker),
        "announced": ANNOUNCED,
    }
    written = prepared.fetchone(_RECORD, params)
    assert written is not None  # count(*): one row
    return written[0] == 1


def log_claimed(claim: FastClaim, *, worker: str) -> None:
    """The log line ``ledger.transition`` writes for the claim, for a fast claim."""
    ledger.log_transition(
        claim.effect_id,
        from_status=claim.from_status,
        to=EffectStatus.DISPATCHING,
        actor=worker_actor(worker),
    )


def log_recorded(effect_id: str, result: Any, *, worker: str) -> None:
    """The log line ``ledger.transition`` writes for the record, for a fast record."""
    ledger.log_transition(
        effect_id,
        from_status=EffectStatus.DISPATCHING,
        to=OUTCOME_STATUS[result.outcome],
        actor=worker_actor(worker),
    )
