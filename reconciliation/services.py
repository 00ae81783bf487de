"""Every write of reconciliation: lease recovery, the query-first reconciler, the human queue,
operators' resolutions and asynchronous receipts (STYLE 4–11).

The rule everything here follows: an uncertain effect is never sent again on a guess. The
provider is asked first, by the contract's lookup, outside any transaction; its answer is
written with a compare-and-set against what was read, in one short transaction that also
appends the event, the receipt and an immutable :class:`ReconciliationRecord`. Only a
provider's "no such operation" for a key it still remembers re-opens dispatch — with the
original key, so that even a wrong "not found" cannot make a second operation.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from gateway import audit
from gateway import services as ledger
from gateway.choices import TO_RECONCILE, EffectStatus, Outcome
from gateway.contracts import EffectContract, get_contract
from gateway.errors import InvalidTransition, NotFound, ValidationProblem
from gateway.models import Attempt, Command, Effect, Principal, Receipt, Tenant
from gateway.providers.base import CallResult, LookupResult, ProviderOperation
from gateway.providers.base import LookupStatus as ProviderLookupStatus
from gateway.providers.http import classify_operation
from gateway.providers.registry import adapter_for
from gateway.recovery import close_attempts_of_lost_claim
from reconciliation.choices import (
    MANUAL_OUTCOMES,
    UNRESOLVED,
    CaseReason,
    CaseState,
    LookupBy,
    RecordKind,
    RecordOutcome,
    WebhookOutcome,
)
from reconciliation.metrics import LOOKUPS, WEBHOOKS
from reconciliation.models import Case, OrphanReceipt, ReconciliationRecord, WebhookDelivery

logger = logging.getLogger(__name__)

S = EffectStatus
RECONCILER = "reconciler"
LEASE_RECOVERY = "lease-recovery"
# Statuses whose effect may still carry a flag (escalated, mismatch) that needs a case.
_FLAGGABLE = (S.UNKNOWN, S.IN_PROGRESS, S.NOT_STARTED)
# A receipt never moves these back: the effect happened, whatever arrives late.
_CONFIRMED_OR_LATER = frozenset({S.CONFIRMED, S.COMPENSATING, S.COMPENSATED, S.COMPENSATION_FAILED})
# After an unexpected error on one effect, wait at least this long before trying it again.
POISON_DELAY = timedelta(minutes=5)


@contextmanager
def _writing(tenant_id: int | None) -> Iterator[None]:
    """A transaction that writes effects, cases or events of one tenant.

    It takes the tenant's audit-chain head first: the ledger's lock order (gateway.audit) is
    chain head, then rows. A transition of the same effect by another actor (which locks the
    head, then the row) then queues behind this one instead of deadlocking with it.
    """
    with transaction.atomic():
        if tenant_id is not None:
            audit.lock_chain(tenant_id)
        yield


# --- hooks ------------------------------------------------------------------------------------


def on_mismatch(effect: Effect) -> None:
    """Called whenever an effect is found to disagree with its command (inside the transaction
    that records it, or the sweep's for mismatches found at dispatch).

    The sagas app freezes the effect's saga here. Until then the mismatch flag, the event and
    the case for the owner are the whole response: the effect is never re-executed and never
    CONFIRMED by the automatic paths.
    """
    logger.warning("effect mismatch", extra={"effect_id": effect.pk, "owner": effect.owner})
    if effect.command.saga_id:
        from sagas.services import saga_freeze

        saga_freeze(
            saga_id=effect.command.saga_id,
            actor=RECONCILER,
            reason=f"effect {effect.pk} disagrees with its command (mismatch)",
            mismatch_effect_id=effect.pk,
        )


# --- the human queue --------------------------------------------------------------------------


def case_open(
    *,
    effect: Effect,
    reason: str,
    text: str,
    actor: str,
    evidence: dict[str, Any] | None = None,
) -> Case:
    """Hand ``effect`` to its owning team, or return the case already open for it.

    Runs inside the caller's transaction, so the case commits with the escalation it explains.
    """
    existing = Case.objects.filter(effect=effect, state__in=sorted(UNRESOLVED)).first()
    if existing is not None:
        return existing
    now = timezone.now()
    try:
        # A savepoint: a concurrent escalation of the same effect (the reconciler and a
        # webhook, the sweep and an operator's reconcile) collides on the partial unique
        # index case_one_unresolved_per_effect; the loser adopts the winner's case.
        with transaction.atomic():
            case = Case.objects.create(
                tenant_id=effect.tenant_id,
                effect=effect,
                owner=effect.owner,
                reason=reason,
                reason_text=text,
                evidence=evidence or {},
                opened_by=actor,
                opened_at=now,
            )
    except IntegrityError:
        return Case.objects.get(effect=effect, state__in=sorted(UNRESOLVED))
    ledger._event(
        effect,
        kind="case_opened",
        actor=actor,
        from_status=effect.status,
        to_status=effect.status,
        reason=f"{reason}: {text}",
        data={"case_id": case.pk, "owner": effect.owner},
        now=now,
    )
    return case


def _case_settle(
    effect: Effect, *, actor: str, resolution: str, principal: Principal | None = None
) -> int:
    """Resolve the effect's unresolved case, if any: the effect no longer needs a human."""
    return Case.objects.filter(effect=effect, state__in=sorted(UNRESOLVED)).update(
        state=CaseState.RESOLVED,
        resolved_by=principal,
        resolved_actor=actor,
        resolved_at=timezone.now(),
        resolution=resolution[:4000],
    )


def case_acknowledge(*, case: Case, principal: Principal, note: str = "") -> Case:
    """An operator of the owning tenant takes the case: open → acknowledged."""
    ledger._require_role(principal, ledger.OPERATOR_ROLES, "acknowledge cases")
    if case.tenant_id != principal.tenant_id:
        raise NotFound(f"No case {case.pk}.")
    now = timezone.now()
    with _writing(case.tenant_id):
        # Compare-and-set on the state: two operators clicking at once, or the reconciler
        # settling the effect meanwhile, leave exactly one outcome.
        changed = Case.objects.filter(pk=case.pk, state=CaseState.OPEN).update(
            state=CaseState.ACKNOWLEDGED, acknowledged_by=principal, acknowledged_at=now
        )
        case.refresh_from_db()
        if not changed:
            raise InvalidTransition(f"Case {case.pk} is {case.state}, not open.")
        ledger._event(
            case.effect,
            kind="case_acknowledged",
            actor=principal.label,
            principal=principal,
            from_status=case.effect.status,
            to_status=case.effect.status,
            reason=note or "acknowledged",
            data={"case_id": case.pk},
            now=now,
        )
    return case


def cases_open_for_flagged(*, limit: int = 200) -> int:
    """Open a case for every flagged effect (escalated or mismatched) that has none.

    The flags live on the effect and are set by paths that know nothing of cases (a mismatch
    found at dispatch, a retry budget exhausted in the claim); the queue follows the flags,
    so nothing flagged can be missing from it for longer than one sweep.
    """
    flagged = list(
        Effect.objects.filter(Q(mismatch=True) | Q(escalated=True), status__in=_FLAGGABLE)
        .exclude(cases__state__in=sorted(UNRESOLVED))
        .order_by("status_changed_at")[:limit]
    )
    for effect in flagged:
        if effect.mismatch:
            reason, text = CaseReason.MISMATCH, "the provider recorded something else"
        elif effect.status == S.NOT_STARTED:
            reason = CaseReason.RETRY_BUDGET_EXHAUSTED
            text = f"{effect.attempt_count} dispatch attempts, none reached the provider"
        else:
            reason, text = CaseReason.ESCALATED, "escalated for a human decision"
        with _writing(effect.tenant_id):
            case_open(
                effect=effect,
                reason=reason,
                text=text,
                actor=RECONCILER,
                evidence={"status": effect.status, "check_count": effect.check_count},
            )
            if effect.mismatch:
                on_mismatch(effect)
    return len(flagged)


# --- lease recovery ---------------------------------------------------------------------------


def effects_recover_expired_leases(*, limit: int = 500) -> int:
    """DISPATCHING claims whose lease ran out become UNKNOWN, to be looked up at once.

    Nothing is sent on this path: the worker may have reached the provider before it died
    or stalled, so only a lookup can say what happened.
    """
    now = timezone.now()
    # Served by the partial index effect_lease_due (status = DISPATCHING, lease_expires_at).
    expired = list(
        Effect.objects.filter(status=S.DISPATCHING, lease_expires_at__lte=now).order_by(
            "lease_expires_at"
        )[:limit]
    )
    recovered = 0
    for effect in expired:
        attempt = (
            Attempt.objects.filter(effect=effect, fence=effect.fence).order_by("-number").first()
        )
        worker = attempt.worker if attempt else "?"
        number = attempt.number if attempt else effect.attempt_count
        with transaction.atomic():
            # Compare-and-set on status and fence against the worker holding the claim,
            # which may write its answer at this very moment with the same fence: exactly
            # one of us wins. If it does, its answer stands; if we do, its late answer is
            # refused as stale by effect_record_outcome.
            recovered += ledger._transition(
                effect,
                to=S.UNKNOWN,
                actor=LEASE_RECOVERY,
                kind="lease_expired",
                reason=(
                    f"worker {worker} held attempt {number} (fence {effect.fence}) past its "
                    f"lease ({effect.lease_expires_at:%Y-%m-%dT%H:%M:%S}Z) without an answer; "
                    "it may have reached the provider, so nothing is re-sent before a lookup"
                ),
                expect_fence=effect.fence,
                data={"worker": worker, "attempt": number, "fence": effect.fence},
                lease_expires_at=None,
                next_check_at=now,
            )
            # Its worker is gone or stalled: close the attempt it left "sending".
            close_attempts_of_lost_claim(effect_id=effect.pk, fence=effect.fence, now=now)
    return recovered


# --- the reconciler ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """What one lookup proves and what the ledger does about it."""

    outcome: str
    reason: str
    to: str | None = None  # the status to move to; None: the status stays
    fields: dict[str, Any] = field(default_factory=dict)
    found: CallResult | None = None  # the classified operation, stored as a receipt if set
    receipt: bool = False
    case: str | None = None  # a CaseReason to open a case with
    settles: bool = False  # the effect no longer needs a human: resolve its case
    redispatch: bool = False
    mismatch: bool = False


def _lookup(effect: Effect, contract: EffectContract) -> tuple[str, LookupResult]:
    """Ask the provider by the contract's lookup: the operation id when the effect has one,
    else the idempotency key the gateway sent (``provider_key``)."""
    adapter = adapter_for(contract)
    timeout = settings.GATEWAY_PROVIDER_TIMEOUT
    if effect.provider_operation_id and "provider_operation_id" in contract.lookup:
        return LookupBy.PROVIDER_OPERATION_ID, adapter.lookup(
            idempotency_key=effect.command.provider_key,
            provider_operation_id=effect.provider_operation_id,
            timeout=timeout,
        )
    return LookupBy.IDEMPOTENCY_KEY, adapter.lookup(
        idempotency_key=effect.command.provider_key, timeout=timeout
    )


def _escalate(effect: Effect, count: int, case: str, reason: str) -> Verdict:
    return Verdict(
        RecordOutcome.ESCALATED,
        reason,
        fields={"check_count": count, "escalated": True, "next_check_at": None},
        case=case,
    )


def _judge(
    effect: Effect, contract: EffectContract, lookup_by: str, lookup: LookupResult, now: datetime
) -> Verdict:
    command = effect.command
    count = effect.check_count + 1
    exhausted = effect.escalated or count >= contract.recovery.reconcile_budget
    later = now + ledger._backoff(settings.GATEWAY_RECONCILE_BACKOFF, count)

    if lookup.status == ProviderLookupStatus.FOUND and lookup.operation is not None:
        found = classify_operation(
            lookup.operation,
            expected_digest=command.payload_digest,
            completion_statuses=contract.completion_statuses,
            http_status=lookup.http_status,
        )
        op_fields = {"check_count": count, "provider_operation_id": lookup.operation.id}
        if found.mismatch:
            return Verdict(
                RecordOutcome.MISMATCH,
                f"{found.reason}: never re-executed, never confirmed; the owner decides",
                to=S.UNKNOWN,
                fields={**op_fields, "mismatch": True, "next_check_at": None},
                found=found,
                receipt=True,
                case=CaseReason.MISMATCH,
                mismatch=True,
            )
        if found.outcome == Outcome.CONFIRMED:
            return Verdict(
                RecordOutcome.CONFIRMED,
                f"lookup by {lookup_by}: {found.reason}, the digest matches",
                to=S.CONFIRMED,
                fields={
                    **op_fields,
                    "confirmed_at": now,
                    "next_check_at": None,
                    "lease_expires_at": None,
                    "escalated": False,
                },
                found=found,
                receipt=True,
                settles=True,
            )
        if found.outcome == Outcome.REJECTED:
            return Verdict(
                RecordOutcome.REJECTED,
                f"lookup by {lookup_by}: {found.reason}",
                to=S.REJECTED,
                fields={**op_fields, "next_check_at": None, "escalated": False},
                found=found,
                receipt=True,
                settles=True,
            )
        if found.outcome == Outcome.IN_PROGRESS:
            fields: dict[str, Any] = {**op_fields, "next_check_at": later}
            case = None
            reason = f"lookup by {lookup_by}: {found.reason}; asked again later"
            if exhausted:
                fields.update(escalated=True, next_check_at=None)
                case = CaseReason.STILL_PROCESSING
                reason = f"{found.reason} after {count} lookups: handed to the owner"
            return Verdict(
                RecordOutcome.ESCALATED if case else RecordOutcome.IN_PROGRESS,
                reason,
                to=S.IN_PROGRESS,
                fields=fields,
                found=found,
                receipt=effect.status != S.IN_PROGRESS,
                case=case,
            )
        inconclusive = f"lookup by {lookup_by}: {found.reason}, which proves nothing"
    elif lookup.status == ProviderLookupStatus.NOT_FOUND:
        if lookup_by == LookupBy.PROVIDER_OPERATION_ID:
            return _escalate(
                effect,
                count,
                CaseReason.CONTRADICTION,
                f"the provider has no operation {effect.provider_operation_id}, which it "
                "reported before",
            )
        if effect.status != S.UNKNOWN or effect.mismatch:
            return _escalate(
                effect,
                count,
                CaseReason.CONTRADICTION,
                f"the provider finds no operation for the key of a {effect.status} effect",
            )
        age = now - command.created_at
        retention = contract.recovery.key_retention
        if age >= retention:
            return _escalate(
                effect,
                count,
                CaseReason.NOT_FOUND_PAST_RETENTION,
                f"not found by key, but the command is {age} old and the provider keeps keys "
                f"for {retention}: not found proves nothing",
            )
        return Verdict(
            RecordOutcome.NOT_STARTED,
            "not found by key within the provider's key retention: it never received the "
            "command; re-dispatched with the original key",
            to=S.NOT_STARTED,
            fields={
                "check_count": 0,
                "next_check_at": None,
                "lease_expires_at": None,
                "next_dispatch_at": now,
                "escalated": False,
            },
            settles=True,
            redispatch=True,
        )
    else:
        detail = lookup.error or (f"HTTP {lookup.http_status}" if lookup.http_status else "")
        inconclusive = f"lookup by {lookup_by} failed ({detail or 'no answer'})"

    if exhausted:
        return _escalate(
            effect,
            count,
            CaseReason.LOOKUP_BUDGET_EXHAUSTED,
            f"{inconclusive}; {count} inconclusive lookups: handed to the owner",
        )
    return Verdict(
        RecordOutcome.INCONCLUSIVE,
        f"{inconclusive}; asked again after backoff",
        fields={"check_count": count, "next_check_at": later},
    )


def effect_reconcile(
    *, effect_id: str, actor: str = RECONCILER, principal: Principal | None = None
) -> ReconciliationRecord | None:
    """Ask the provider what happened to one UNKNOWN / IN_PROGRESS effect and write it down.

    With a ``principal`` (POST /effects/{id}/reconcile) the caller must be an operator of the
    effect's tenant and an effect that is not uncertain is a 409. Without one (the reconciler)
    such an effect is skipped: someone settled it since it was claimed. Returns the record.
    """
    if principal is not None:
        ledger._require_role(principal, ledger.OPERATOR_ROLES, "reconcile effects")
    read = Effect.objects.select_related("command").filter(pk=effect_id).first()
    if read is None or (principal is not None and read.tenant_id != principal.tenant_id):
        raise NotFound(f"No effect {effect_id}.")
    if read.status not in TO_RECONCILE:
        if principal is not None:
            raise InvalidTransition(
                f"Effect {read.pk} is {read.status}: only UNKNOWN or IN_PROGRESS effects are "
                "looked up."
            )
        return None
    contract = get_contract(read.type)
    if contract is None:
        raise LookupError(f"no contract for effect type {read.type!r}")
    # Outside any transaction: a lookup can take the provider's whole timeout, and no row
    # lock may be held across a network call.
    lookup_by, lookup = _lookup(read, contract)
    verdict = _judge(read, contract, lookup_by, lookup, timezone.now())
    record = _apply(read, verdict, lookup_by=lookup_by, lookup=lookup, actor=actor, who=principal)
    LOOKUPS.labels(outcome=record.outcome).inc()
    return record


def _apply(
    read: Effect,
    verdict: Verdict,
    *,
    lookup_by: str,
    lookup: LookupResult,
    actor: str,
    who: Principal | None,
) -> ReconciliationRecord:
    operation = lookup.operation
    now = timezone.now()
    with _writing(read.tenant_id):
        # Lock the row, then compare with what was read before the lookup: a webhook, an
        # operator, a second reconciler or a new dispatch (a new fence) may have changed the
        # effect while the provider was being asked; then this answer is evidence only.
        effect = Effect.objects.select_for_update().select_related("command").get(pk=read.pk)
        seen = (read.status, read.fence, read.check_count)
        current = (effect.status, effect.fence, effect.check_count)
        outcome, reason = verdict.outcome, verdict.reason
        if current != seen:
            outcome = RecordOutcome.SUPERSEDED
            reason = (
                f"{reason} — not applied: the effect changed meanwhile to {effect.status} "
                f"(fence {effect.fence}, {effect.check_count} checks)"
            )
        else:
            data = {
                "lookup_by": lookup_by,
                "lookup_status": lookup.status,
                "http_status": lookup.http_status,
                "provider_operation_id": operation.id if operation else None,
                "provider_status": operation.status if operation else None,
                "provider_digest": operation.payload_digest if operation else None,
                "outcome": outcome,
            }
            status_before = effect.status
            newly_flagged = (verdict.case is not None and not effect.escalated) or (
                verdict.mismatch and not effect.mismatch
            )
            if verdict.to is not None and verdict.to != effect.status:
                ledger._transition(
                    effect,
                    to=verdict.to,
                    actor=actor,
                    principal=who,
                    kind="reconciled",
                    reason=reason,
                    expect_fence=effect.fence,
                    data=data,
                    **verdict.fields,
                )
            else:
                Effect.objects.filter(pk=effect.pk).update(updated_at=now, **verdict.fields)
                for name, value in verdict.fields.items():
                    setattr(effect, name, value)
                if newly_flagged:
                    ledger._event(
                        effect,
                        kind="mismatch" if verdict.mismatch else "escalated",
                        actor=actor,
                        principal=who,
                        from_status=status_before,
                        to_status=effect.status,
                        reason=reason,
                        data=data,
                        now=now,
                    )
            if verdict.receipt and verdict.found is not None:
                ledger._receipt(
                    effect,
                    verdict.found,
                    source=Receipt.Source.RECONCILER,
                    attempt_id=None,
                    now=now,
                )
            if verdict.case is not None:
                case_open(
                    effect=effect,
                    reason=verdict.case,
                    text=reason,
                    actor=actor,
                    evidence={**data, "check_count": effect.check_count},
                )
            if verdict.settles:
                _case_settle(effect, actor=actor, principal=who, resolution=reason)
            if verdict.mismatch:
                on_mismatch(effect)
            if verdict.redispatch:
                # On commit (inside _enqueue_dispatch): the worker must see NOT_STARTED. The
                # claim then applies the ledger's bounds: expiry, frozen, attempt budget.
                ledger._enqueue_dispatch(effect.pk)
        return ReconciliationRecord.objects.create(
            tenant_id=effect.tenant_id,
            effect=effect,
            kind=RecordKind.LOOKUP,
            lookup_by=lookup_by,
            lookup_status=lookup.status,
            http_status=lookup.http_status,
            provider_operation_id=operation.id if operation else "",
            provider_status=operation.status if operation else "",
            provider_digest=operation.payload_digest if operation else "",
            effect_status=effect.status,
            outcome=outcome,
            check_number=read.check_count + 1,
            actor=actor,
            principal=who,
            evidence=reason if not lookup.error else f"{reason}\n{lookup.error[:2000]}",
            created_at=now,
        )


def _claim_hold(limit: int, deadline: float | None) -> timedelta:
    """How long a claimed batch stays invisible to other reconcilers: long enough to look all
    of it up (or until the sweep's deadline plus one lookup), short enough that a crashed
    reconciler's claim comes back by itself."""
    timeout = settings.GATEWAY_PROVIDER_TIMEOUT
    if deadline is not None:
        seconds = max(deadline - time.monotonic(), 0) + timeout + 30
    else:
        seconds = timeout * limit + 30
    return timedelta(seconds=seconds)


def reconcile_next_batch(
    *, limit: int = 50, deadline: float | None = None, actor: str = RECONCILER
) -> int:
    """Claim up to ``limit`` due UNKNOWN / IN_PROGRESS effects and look each one up.

    Returns how many were claimed (0: nothing was due). ``deadline`` (a ``time.monotonic``
    value) stops starting new lookups; the rest of the batch is handed back.
    """
    now = timezone.now()
    hold = now + _claim_hold(limit, deadline)
    with transaction.atomic():
        # Served by the partial index effect_reconcile_due. SKIP LOCKED against a second
        # reconciler (overlapping beat ticks, several workers): it takes the next rows instead
        # of waiting for ours, and once we commit the pushed next_check_at keeps ours from
        # being due, so no effect is looked up by two reconcilers at once.
        claimed = list(
            Effect.objects.select_for_update(skip_locked=True)
            .filter(status__in=sorted(TO_RECONCILE), next_check_at__lte=now)
            .order_by("next_check_at")
            .values_list("pk", flat=True)[:limit]
        )
        if claimed:
            Effect.objects.filter(pk__in=claimed).update(next_check_at=hold)
    for index, effect_id in enumerate(claimed):
        if deadline is not None and time.monotonic() >= deadline:
            # Hand the rest back rather than leave it invisible until the hold runs out.
            Effect.objects.filter(pk__in=claimed[index:], next_check_at=hold).update(
                next_check_at=timezone.now()
            )
            break
        try:
            effect_reconcile(effect_id=effect_id, actor=actor)
        except Exception:
            # A poison row (no contract, a bug, a provider answer we cannot parse) must not
            # stop the batch or make the worker crash-loop on it: push it well forward.
            logger.exception("reconcile failed", extra={"effect_id": effect_id})
            Effect.objects.filter(pk=effect_id, status__in=sorted(TO_RECONCILE)).update(
                next_check_at=timezone.now() + POISON_DELAY
            )
    return len(claimed)


def reconcile_due(*, time_budget: float | None = None, batch_size: int = 50) -> int:
    """One reconciler sweep (beat, every GATEWAY_RECONCILE_INTERVAL): recover expired leases,
    queue flagged effects for a human, then look up due effects until none are due or the
    time budget is spent. Returns how much work it found."""
    budget = time_budget if time_budget is not None else settings.GATEWAY_RECONCILE_INTERVAL * 0.8
    deadline = time.monotonic() + budget
    work = effects_recover_expired_leases()
    work += cases_open_for_flagged()
    while time.monotonic() < deadline:
        claimed = reconcile_next_batch(limit=batch_size, deadline=deadline)
        work += claimed
        if not claimed:
            break
    return work


# --- an operator's resolution -----------------------------------------------------------------


def effect_resolve(*, effect: Effect, principal: Principal, outcome: str, evidence: str) -> Effect:
    """An operator settles an uncertain (or escalated NOT_STARTED) effect, with evidence.

    ``confirmed``: CONFIRMED, without a receipt — the manual record is the proof.
    ``not_started``: NOT_STARTED, and re-dispatched with the same key while unexpired and
    within the attempt budget; if the operator is wrong and the provider has the operation,
    the provider's idempotency answers with it and nothing runs twice.
    History is never edited: a manual record and an event are appended.
    """
    ledger._require_role(principal, ledger.OPERATOR_ROLES, "resolve effects")
    if effect.tenant_id != principal.tenant_id:
        raise NotFound(f"No effect {effect.pk}.")
    errors: dict[str, list[str]] = {}
    if outcome not in MANUAL_OUTCOMES:
        errors["outcome"] = [f"must be one of {', '.join(sorted(MANUAL_OUTCOMES))}"]
    evidence = (evidence or "").strip() if isinstance(evidence, str) else ""
    if not evidence:
        errors["evidence"] = ["required: what you checked and what it showed"]
    if errors:
        raise ValidationProblem("The resolution is not valid.", errors=errors)

    now = timezone.now()
    label = principal.label
    with _writing(effect.tenant_id):
        # Lock the row against the reconciler and webhooks writing the same effect.
        current = Effect.objects.select_for_update().select_related("command").get(pk=effect.pk)
        before = current.status
        if not (before in TO_RECONCILE or (before == S.NOT_STARTED and current.escalated)):
            raise InvalidTransition(
                f"Effect {current.pk} is {before}"
                f"{' (escalated)' if current.escalated else ''}: only an UNKNOWN or "
                "IN_PROGRESS effect, or an escalated NOT_STARTED one, can be resolved."
            )
        data = {"outcome": outcome, "manual": True}
        if outcome == RecordOutcome.CONFIRMED:
            moved = ledger._transition(
                current,
                to=S.CONFIRMED,
                actor=label,
                principal=principal,
                kind="resolved",
                reason=evidence,
                data=data,
                confirmed_at=now,
                next_check_at=None,
                lease_expires_at=None,
                escalated=False,
                mismatch=False,
            )
        else:
            contract = get_contract(current.type)
            budget = contract.recovery.max_dispatch_attempts if contract else 1
            redispatch = current.attempt_count < budget and current.command.expires_at > now
            data["redispatch"] = redispatch
            fields: dict[str, Any] = {
                "next_check_at": None,
                "check_count": 0,
                "lease_expires_at": None,
                "escalated": False,
                "mismatch": False,
                "next_dispatch_at": now if redispatch else None,
            }
            reason = evidence
            if not redispatch:
                reason = (
                    f"{evidence} — not sent again: the command expired or used its "
                    f"{budget} attempts; submit a new command"
                )
            if before == S.NOT_STARTED:
                moved = bool(
                    Effect.objects.filter(pk=current.pk, status=S.NOT_STARTED).update(
                        updated_at=now, **fields
                    )
                )
                if moved:
                    ledger._event(
                        current,
                        kind="resolved",
                        actor=label,
                        principal=principal,
                        from_status=before,
                        to_status=before,
                        reason=reason,
                        data=data,
                        now=now,
                    )
            else:
                moved = ledger._transition(
                    current,
                    to=S.NOT_STARTED,
                    actor=label,
                    principal=principal,
                    kind="resolved",
                    reason=reason,
                    data=data,
                    **fields,
                )
            if moved and redispatch:
                ledger._enqueue_dispatch(current.pk)
        if not moved:
            raise InvalidTransition(f"Effect {current.pk} changed while it was being resolved.")
        ReconciliationRecord.objects.create(
            tenant_id=current.tenant_id,
            effect=current,
            kind=RecordKind.MANUAL,
            effect_status=before,
            outcome=outcome,
            check_number=current.check_count,
            actor=label,
            principal=principal,
            evidence=evidence,
            created_at=now,
        )
        _case_settle(current, actor=label, principal=principal, resolution=f"{outcome}: {evidence}")
    current.refresh_from_db()
    return current


# --- asynchronous receipts --------------------------------------------------------------------


@dataclass(frozen=True)
class WebhookReceipt:
    """One provider event, as parsed from a verified webhook body."""

    provider: str
    event_id: str
    idempotency_key: str
    operation: ProviderOperation
    signed_at: datetime


def webhook_receive(*, receipt: WebhookReceipt) -> tuple[WebhookDelivery, bool]:
    """Apply one asynchronous receipt, once. Returns (delivery, created); a redelivered event
    returns the first delivery and changes nothing."""
    duplicate = WebhookDelivery.objects.filter(
        provider=receipt.provider, event_id=receipt.event_id
    ).first()
    if duplicate is not None:
        return duplicate, False
    operation = receipt.operation
    command = None
    if receipt.idempotency_key:
        # The key the gateway sent is the tenant-scoped provider_key.
        command = Command.objects.filter(
            provider=receipt.provider, provider_key=receipt.idempotency_key
        ).first()
    effect_id = command.effect_id if command is not None else None
    if effect_id is None and operation.id:
        effect_id = (
            Effect.objects.filter(
                command__provider=receipt.provider, provider_operation_id=operation.id
            )
            .values_list("pk", flat=True)
            .first()
        )
    tenant_id = (
        Effect.objects.filter(pk=effect_id).values_list("tenant_id", flat=True).first()
        if effect_id is not None
        else None
    )
    now = timezone.now()
    try:
        with _writing(tenant_id):
            # A concurrent copy of the same event queues on the chain head (or, for an
            # orphan, on the unique (provider, event_id) index) and then fails against that
            # index: it changes nothing.
            delivery = WebhookDelivery.objects.create(
                provider=receipt.provider,
                event_id=receipt.event_id,
                idempotency_key=receipt.idempotency_key,
                provider_operation_id=operation.id,
                provider_status=operation.status,
                payload_digest=operation.payload_digest,
                outcome=WebhookOutcome.NOTED,
                signed_at=receipt.signed_at,
                received_at=now,
            )
            effect: Effect | None = None
            status = ""
            if effect_id is None:
                _orphan(delivery, receipt, now)
                outcome = WebhookOutcome.ORPHAN
                detail = "no command of ours has this key or operation id; kept for a human"
            else:
                # Locked against the reconciler and an operator writing the same effect.
                effect = (
                    Effect.objects.select_for_update().select_related("command").get(pk=effect_id)
                )
                status = effect.status
                outcome, detail = _apply_receipt(effect, receipt, now)
            WebhookDelivery.objects.filter(pk=delivery.pk).update(
                effect=effect, effect_status=status, outcome=outcome, detail=detail[:4000]
            )
    except IntegrityError:
        duplicate = WebhookDelivery.objects.filter(
            provider=receipt.provider, event_id=receipt.event_id
        ).first()
        if duplicate is None:
            raise
        return duplicate, False
    delivery.refresh_from_db()
    WEBHOOKS.labels(provider=receipt.provider, outcome=delivery.outcome).inc()
    return delivery, True


def _orphan(delivery: WebhookDelivery, receipt: WebhookReceipt, now: datetime) -> OrphanReceipt:
    slug, separator, _ = receipt.idempotency_key.partition(":")
    tenant = Tenant.objects.filter(slug=slug).first() if separator else None
    logger.warning(
        "orphan receipt",
        extra={"provider": receipt.provider, "operation_id": receipt.operation.id},
    )
    return OrphanReceipt.objects.create(
        delivery=delivery,
        tenant=tenant,
        provider=receipt.provider,
        idempotency_key=receipt.idempotency_key,
        provider_operation_id=receipt.operation.id,
        provider_status=receipt.operation.status,
        payload_digest=receipt.operation.payload_digest,
        result=receipt.operation.result,
        received_at=now,
    )


def _apply_receipt(effect: Effect, receipt: WebhookReceipt, now: datetime) -> tuple[str, str]:
    """What one receipt does to a locked effect. Order-safe: a receipt never moves an effect
    backwards (a late ``processing`` after CONFIRMED is only noted), and it confirms only on a
    matching digest."""
    contract = get_contract(effect.type)
    operation = receipt.operation
    actor = f"webhook:{receipt.provider}"
    found = classify_operation(
        operation,
        expected_digest=effect.command.payload_digest,
        completion_statuses=contract.completion_statuses if contract else frozenset(),
    )
    data = {
        "event_id": receipt.event_id,
        "provider_operation_id": operation.id,
        "provider_status": operation.status,
        "provider_digest": operation.payload_digest,
    }

    def store() -> None:
        ledger._receipt(effect, found, source=Receipt.Source.WEBHOOK, attempt_id=None, now=now)

    status = effect.status
    if status in TO_RECONCILE:
        if effect.mismatch:
            store()
            return WebhookOutcome.NOTED, (
                f"{found.reason}; the effect is held for a mismatch, so an owner decides"
            )
        if found.mismatch:
            fields = {
                "mismatch": True,
                "next_check_at": None,
                "provider_operation_id": operation.id,
            }
            if status == S.UNKNOWN:
                Effect.objects.filter(pk=effect.pk).update(updated_at=now, **fields)
                ledger._event(
                    effect,
                    kind="mismatch",
                    actor=actor,
                    from_status=status,
                    to_status=status,
                    reason=found.reason,
                    data=data,
                    now=now,
                )
                for name, value in fields.items():
                    setattr(effect, name, value)
            else:
                ledger._transition(
                    effect,
                    to=S.UNKNOWN,
                    actor=actor,
                    kind="webhook",
                    reason=found.reason,
                    data=data,
                    **fields,
                )
            store()
            case_open(
                effect=effect,
                reason=CaseReason.MISMATCH,
                text=found.reason,
                actor=actor,
                evidence=data,
            )
            on_mismatch(effect)
            return WebhookOutcome.MISMATCH, found.reason
        if found.outcome in (Outcome.CONFIRMED, Outcome.REJECTED):
            to = S.CONFIRMED if found.outcome == Outcome.CONFIRMED else S.REJECTED
            extra: dict[str, Any] = {"confirmed_at": now} if to == S.CONFIRMED else {}
            ledger._transition(
                effect,
                to=to,
                actor=actor,
                kind="webhook",
                reason=f"asynchronous receipt: {found.reason}",
                data=data,
                next_check_at=None,
                lease_expires_at=None,
                escalated=False,
                provider_operation_id=operation.id,
                **extra,
            )
            store()
            _case_settle(effect, actor=actor, resolution=f"settled by webhook: {found.reason}")
            return (
                WebhookOutcome.CONFIRMED if to == S.CONFIRMED else WebhookOutcome.REJECTED,
                found.reason,
            )
        if found.outcome == Outcome.IN_PROGRESS and status == S.UNKNOWN:
            ledger._transition(
                effect,
                to=S.IN_PROGRESS,
                actor=actor,
                kind="webhook",
                reason=f"asynchronous receipt: {found.reason}",
                data=data,
                provider_operation_id=operation.id,
            )
            store()
            return WebhookOutcome.IN_PROGRESS, found.reason
        return WebhookOutcome.NOTED, f"{found.reason}; nothing to change for a {status} effect"
    if status in _CONFIRMED_OR_LATER:
        # CONFIRMED, or later (compensating): never downgraded. A failure or another digest
        # after the fact is a contradiction for a human, not a state change.
        if found.mismatch or found.outcome == Outcome.REJECTED:
            text = f"a receipt for a {status} effect says: {found.reason}"
            ledger._event(
                effect,
                kind="receipt_contradiction",
                actor=actor,
                from_status=status,
                to_status=status,
                reason=text,
                data=data,
                now=now,
            )
            store()
            case_open(
                effect=effect,
                reason=CaseReason.CONTRADICTION,
                text=text,
                actor=actor,
                evidence=data,
            )
            return WebhookOutcome.CONTRADICTION, text
        return WebhookOutcome.NOTED, f"late or repeated receipt ({found.reason}), {status} stays"
    # In flight (DISPATCHING: the worker's own answer or lease recovery settles it), not yet
    # sent, or already terminal: kept as evidence, nothing changes.
    return WebhookOutcome.NOTED, f"{found.reason}; the effect is {status}, left as it is"
