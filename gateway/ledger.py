"""The ledger's kernel: the few writes every app builds on, and the only code besides
``gateway.services`` that writes ``Effect`` rows.

- ``transition()``: the one compare-and-set of an effect's status, with its event in the same
  transaction; then ``hooks.after_transition`` and the settlement of a compensation's original;
- ``annotate()``: flags and schedule without a status change (mismatch, escalation, a manual
  resolution of an escalated NOT_STARTED effect), with the event that says why;
- ``append_event()``: an event of the tenant's hash chain;
- ``record_receipt()``: a provider's operation, as received (dispatch, reconciler, webhook);
- ``schedule_checks()``: the reconciler's next look at effects (a schedule, not a state);
- ``enqueue_dispatch()``: hand an effect to a worker, after commit; ``enqueue_due()``: say
  after commit that it is due, for whichever worker drains due work next;
- ``require_role()``, ``backoff()``, ``validate_idempotency_key()``, ``redact()``.

reconciliation, sagas and the webhook outbox sit above: the kernel never imports them; it
tells them what happened through ``gateway.hooks``. The services of the ledger
(``gateway.services``) and of the other apps call these functions inside their own
transactions: the kernel opens none.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.db import transaction
from django.utils import timezone

from gateway import audit, deadlines, hooks
from gateway.checkpoints import receipt_seal
from gateway.choices import ALLOWED_TRANSITIONS, EffectStatus
from gateway.contracts import EffectContract
from gateway.errors import InvalidTransition, NotPermitted, ValidationProblem
from gateway.lib.digest import sha256_digest
from gateway.models import Effect, EffectEvent, Principal, Receipt
from gateway.providers.base import CallResult

logger = logging.getLogger("gateway.services")

S = EffectStatus
MAX_KEY_LENGTH = 255
REDACTED = "[redacted]"


# --- events and the one compare-and-set ---------------------------------------------------


def append_event(
    effect: Effect,
    *,
    kind: str,
    actor: str,
    reason: str = "",
    from_status: str = "",
    to_status: str = "",
    principal: Principal | None = None,
    data: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> EffectEvent:
    return audit.append(
        EffectEvent(
            tenant_id=effect.tenant_id,
            effect=effect,
            kind=kind,
            from_status=from_status,
            to_status=to_status,
            actor=actor,
            principal=principal,
            reason=reason,
            data=data or {},
            created_at=now or timezone.now(),
        )
    )


def transition(
    effect: Effect,
    *,
    to: str,
    actor: str,
    reason: str,
    principal: Principal | None = None,
    kind: str = "status",
    expect_fence: int | None = None,
    data: dict[str, Any] | None = None,
    **fields: Any,
) -> bool:
    """Move ``effect`` from the status it was read with to ``to``, or do nothing.

    Compare-and-set on the status read (and the fence, for workers): if another actor — a
    second worker, the reconciler, an operator — changed the effect since it was read, the
    update matches no row and the caller must re-read and decide again. Must run inside the
    caller's transaction so that the event commits with the change.
    """
    if to not in ALLOWED_TRANSITIONS[effect.status]:
        raise InvalidTransition(f"{effect.pk} cannot go from {effect.status} to {to}")
    # No tenant-wide lock: the row's compare-and-set is the only lock a transition takes; the
    # event is sealed into the audit chain after commit (gateway.audit).
    now = timezone.now()
    query = Effect.objects.filter(pk=effect.pk, status=effect.status)
    if expect_fence is not None:
        query = query.filter(fence=expect_fence)
    changed = query.update(status=to, status_changed_at=now, updated_at=now, **fields)
    if changed != 1:
        return False
    append_event(
        effect,
        kind=kind,
        actor=actor,
        reason=reason,
        from_status=effect.status,
        to_status=to,
        principal=principal,
        data=data,
        now=now,
    )
    from_status = effect.status
    effect.status = to
    for name, value in fields.items():
        if not hasattr(value, "resolve_expression"):
            setattr(effect, name, value)
    log_transition(effect.pk, from_status=from_status, to=to, actor=actor)
    _after_transition(effect, from_status=from_status, to=to)
    _deadlines_set(fields)
    return True


def _deadlines_set(fields: dict[str, Any]) -> None:
    """A due time a write sets (the next lookup, a lease) wakes the reconciler's waker when
    it is earlier than the waker's next look (gateway.deadlines), after commit."""
    if "next_check_at" in fields or "lease_expires_at" in fields:
        deadlines.soonest((fields.get("next_check_at"), fields.get("lease_expires_at")))


def log_transition(effect_id: str, *, from_status: str, to: str, actor: str) -> None:
    """The log line of a status change, written by ``transition`` and by the fast path's
    callers for the changes its statements make (the same fields either way)."""
    logger.info(
        "effect transition",
        extra={"effect_id": effect_id, "from": from_status, "to": to, "actor": actor},
    )


def worker_actor(worker: str) -> str:
    """How a worker is named in events and logs (``worker_name``: host and pid)."""
    return f"worker:{worker}"


# What a compensation's end means for the effect it compensates.
_COMPENSATION_SETTLES: dict[str, str] = {
    S.CONFIRMED: S.COMPENSATED,
    S.REJECTED: S.COMPENSATION_FAILED,
    S.EXPIRED: S.COMPENSATION_FAILED,
    S.CANCELLED: S.COMPENSATION_FAILED,
}


def _after_transition(effect: Effect, *, from_status: str, to: str) -> None:
    """Consequences of a status change that belong to the same transaction: the listeners of
    ``hooks.after_transition`` (the webhook outbox row commits or rolls back with the change it
    announces; a never-sent command returns its capability budget; a saga is told, after
    commit), and the original of a compensation settles."""
    for listener in hooks.after_transition:
        listener(effect, from_status=from_status, to=to)
    command = effect.command
    if command.compensates_id and to in _COMPENSATION_SETTLES:
        original = Effect.objects.select_related("command").get(pk=command.compensates_id)
        if original.status == S.COMPENSATING:
            outcome = _COMPENSATION_SETTLES[to]
            transition(
                original,
                to=outcome,
                actor="gateway",
                kind="compensation_settled",
                reason=f"compensation {effect.pk} ended {to}",
                data={"compensation": effect.pk},
            )


def annotate(
    effect: Effect,
    *,
    fields: dict[str, Any],
    kind: str = "",
    actor: str = "",
    reason: str = "",
    principal: Principal | None = None,
    data: dict[str, Any] | None = None,
    expect_status: str | None = None,
    where: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> bool:
    """Set flags or schedule fields of ``effect`` without changing its status, and (with a
    ``kind``) append the event that says why, in the caller's transaction.

    The caller holds the tenant's chain head or the effect's row lock (the lock order of
    gateway.audit). With ``expect_status`` (and ``where``, other fields as read) it is a
    compare-and-set: False (and no event) when another actor moved the effect meanwhile. The
    instance gets the fields.
    """
    now = now or timezone.now()
    query = Effect.objects.filter(pk=effect.pk)
    if expect_status is not None:
        query = query.filter(status=expect_status)
    if where:  # more of the compare-and-set: the flags the caller read
        query = query.filter(**where)
    if not query.update(updated_at=now, **fields):
        return False
    _deadlines_set(fields)
    for name, value in fields.items():
        setattr(effect, name, value)
    if kind:
        append_event(
            effect,
            kind=kind,
            actor=actor,
            principal=principal,
            from_status=effect.status,
            to_status=effect.status,
            reason=reason,
            data=data,
            now=now,
        )
    return True


# --- receipts, schedules, the hand-over to a worker ------------------------------------------


def record_receipt(
    effect: Effect,
    result: CallResult,
    *,
    source: str,
    attempt_id: int | None,
    now: datetime,
    recorded_by: str = "",
    evidence: str = "",
) -> Receipt | None:
    """The provider's operation as received (None when the answer named none); or, with
    ``recorded_by`` and ``evidence``, the operation as a person confirmed it by hand."""
    operation = result.operation
    if operation is None:
        return None
    receipt = Receipt(
        effect=effect,
        attempt_id=attempt_id,
        source=source,
        provider=effect.command.provider,
        provider_operation_id=operation.id,
        provider_status=operation.status,
        payload_digest=operation.payload_digest,
        digest_matches=operation.payload_digest == effect.command.payload_digest,
        result=operation.result,
        result_digest=sha256_digest(operation.result),
        received_at=now,
        recorded_by=recorded_by,
        evidence=evidence,
    )
    receipt.seal = receipt_seal(receipt)  # verify_audit reports an edited receipt
    receipt.save(force_insert=True)
    return receipt


def schedule_checks(effect_ids: Iterable[str], at: datetime, **only: Any) -> int:
    """When the reconciler looks at these effects next (a claim, a hand-back, a poison row
    pushed away): a schedule, not a state, so no event. ``only`` narrows the update to rows
    still as they were read (a compare-and-set). Returns how many rows moved."""
    moved = Effect.objects.filter(pk__in=list(effect_ids), **only).update(next_check_at=at)
    if moved:
        deadlines.soon(at)
    return moved


def enqueue_dispatch(effect_id: str) -> None:
    # After commit: a worker must never pick up an effect whose row it cannot see yet.
    transaction.on_commit(partial(publish, hooks.dispatch_sender.send, effect_id))


def enqueue_due(effect_id: str) -> None:
    """After commit, tell the workers that dispatch work is due (``hooks.due_sender``): a
    drainer claims it with whatever else is due. For effects a batch claim may pick up
    (gateway.fastpath_batch: not a saga's step); the others are handed over one by one."""
    transaction.on_commit(partial(publish, hooks.due_sender.send, effect_id))


def publish(send: Callable[[str], Any], object_id: str) -> None:
    """Hand a committed effect (or saga) to the broker. A broker that is down must not turn a
    committed command into an error answer (the caller would resubmit under a new key): the
    ledger is the record, and the sweepers send what is due when the broker is back (an
    effect's ``next_dispatch_at`` is set before it commits)."""
    try:
        send(object_id)
    except Exception as exc:
        # With the broker down every submission fails here: one traceback a minute, and a
        # line per submission naming the error, not a chained traceback each.
        global _publish_traceback_at
        now = time.monotonic()
        with_traceback = now - _publish_traceback_at >= PUBLISH_TRACEBACK_EVERY
        if with_traceback:
            _publish_traceback_at = now
        logger.warning(
            "publish failed; the sweeper will send it",
            extra={"object_id": object_id, "error": f"{type(exc).__name__}: {exc}"},
            exc_info=with_traceback,
        )


PUBLISH_TRACEBACK_EVERY = 60.0
_publish_traceback_at = -PUBLISH_TRACEBACK_EVERY


def backoff(base: float, attempt: int, *, cap: float = 300.0) -> timedelta:
    """Exponential backoff with full jitter on the upper half: base·2^(attempt-1), capped."""
    ceiling = min(cap, base * (2 ** max(attempt - 1, 0)))
    return timedelta(seconds=random.uniform(ceiling / 2, ceiling))


# --- checks shared by every service -------------------------------------------------------


def require_role(principal: Principal, roles: frozenset[str], action: str) -> None:
    if principal.role not in roles:
        raise NotPermitted(f"A principal with role {principal.role} cannot {action}.")
    if principal.frozen:
        raise NotPermitted(f"Principal {principal.name} is frozen.")


def validate_idempotency_key(idempotency_key: Any, *, what: str = "command") -> str:
    """The Idempotency-Key of a submission (a command, a saga), or a 400 that says why not."""
    if not isinstance(idempotency_key, str) or not idempotency_key.strip():
        raise ValidationProblem(
            f"The Idempotency-Key header is required: a stable business key for this {what}.",
            errors={"Idempotency-Key": ["required"]},
        )
    # Printable ASCII, as the IETF Idempotency-Key header's value (a structured-field string)
    # is: the key goes on to the provider in a header of that name, and a header cannot carry
    # anything else; a key it accepted that no dispatch could send would be a command stuck.
    if (
        len(idempotency_key) > MAX_KEY_LENGTH
        or not idempotency_key.isascii()
        or not idempotency_key.isprintable()
    ):
        raise ValidationProblem(
            "The Idempotency-Key is not valid.",
            errors={"Idempotency-Key": [f"at most {MAX_KEY_LENGTH} printable ASCII characters"]},
        )
    return idempotency_key


def redact(payload: dict[str, Any], contract: EffectContract) -> dict[str, Any]:
    """The payload with the contract's personal fields replaced by ``[redacted]``."""
    return {
        name: REDACTED if name in contract.personal_fields else value
        for name, value in payload.items()
    }
