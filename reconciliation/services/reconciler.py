"""The query-first reconciler: ask the provider, judge its answer (``_judge``), write it with a
compare-and-set against what was read (``_apply``); batches and the sweep."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from gateway import ledger
from gateway.choices import OPERATOR_ROLES, TO_RECONCILE, Outcome
from gateway.contracts import EffectContract, get_contract
from gateway.errors import InvalidTransition, NotFound
from gateway.models import Effect, Principal, Receipt
from gateway.provider_credentials import lookup_credential, lookup_fingerprints
from gateway.providers import protection
from gateway.providers.base import CallResult, LookupResult, not_found_proves_not_started
from gateway.providers.base import LookupStatus as ProviderLookupStatus
from gateway.providers.http import classify_operation
from gateway.providers.registry import adapter_for
from reconciliation.choices import CaseReason, LookupBy, RecordKind, RecordOutcome
from reconciliation.metrics import LOOKUPS
from reconciliation.models import ReconciliationRecord
from reconciliation.services.cases import _case_settle, case_open, cases_open_for_flagged
from reconciliation.services.core import POISON_DELAY, RECONCILER, S, _writing, logger, on_mismatch
from reconciliation.services.leases import effects_recover_expired_leases


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
    else the idempotency key the gateway sent (``provider_key``); with the credential that
    sent the effect (an id or a key belongs to the account that received it), never another
    in its place: when that credential is retired, the lookup proves nothing."""
    credential, problem = lookup_credential(effect, contract)
    if problem:
        unreachable = LookupResult(ProviderLookupStatus.UNREACHABLE, error=problem)
        return LookupBy.IDEMPOTENCY_KEY, unreachable
    adapter = adapter_for(contract, credential)
    timeout = settings.GATEWAY_PROVIDER_TIMEOUT
    if effect.provider_operation_id and "provider_operation_id" in contract.lookup:
        return LookupBy.PROVIDER_OPERATION_ID, adapter.lookup(
            idempotency_key=effect.command.provider_key,
            provider_operation_id=effect.provider_operation_id,
            timeout=timeout,
            payload_digest=effect.command.payload_digest,
        )
    return LookupBy.IDEMPOTENCY_KEY, adapter.lookup(
        idempotency_key=effect.command.provider_key,
        timeout=timeout,
        payload_digest=effect.command.payload_digest,
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
    count = effect.check_count + 1
    exhausted = effect.escalated or count >= contract.recovery.reconcile_budget
    later = now + ledger.backoff(settings.GATEWAY_RECONCILE_BACKOFF, count)

    if lookup.status == ProviderLookupStatus.FOUND and lookup.operation is not None:
        judged = _judge_found(
            effect, contract, lookup_by, lookup, now, count=count, exhausted=exhausted, later=later
        )
        if isinstance(judged, Verdict):
            return judged
        inconclusive = judged
    elif lookup.status == ProviderLookupStatus.NOT_FOUND:
        return _judge_not_found(effect, contract, lookup_by, now, count=count)
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


def _judge_found(
    effect: Effect,
    contract: EffectContract,
    lookup_by: str,
    lookup: LookupResult,
    now: datetime,
    *,
    count: int,
    exhausted: bool,
    later: datetime,
) -> Verdict | str:
    """The provider has an operation for the effect: the verdict it proves, or (a status
    that proves nothing) why it is inconclusive."""
    assert lookup.operation is not None
    found = classify_operation(
        lookup.operation,
        expected_digest=effect.command.payload_digest,
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
    return f"lookup by {lookup_by}: {found.reason}, which proves nothing"


def _judge_not_found(
    effect: Effect, contract: EffectContract, lookup_by: str, now: datetime, *, count: int
) -> Verdict:
    """The provider has no operation for the effect: it never received the command (sent
    again with its key) only if asked by key, for an UNKNOWN effect, within the provider's
    key retention; anything else is a contradiction or proves nothing."""
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
    age = now - effect.command.created_at
    retention = contract.recovery.key_retention
    if not not_found_proves_not_started(age=age, key_retention=retention):
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


def effect_reconcile(
    *, effect_id: str, actor: str = RECONCILER, principal: Principal | None = None
) -> ReconciliationRecord | None:
    """Ask the provider what happened to one UNKNOWN / IN_PROGRESS effect and write it down.

    With a ``principal`` (POST /effects/{id}/reconcile) the caller must be an operator of the
    effect's tenant and an effect that is not uncertain is a 409. Without one (the reconciler)
    such an effect is skipped: someone settled it since it was claimed. Returns the record.
    """
    if principal is not None:
        ledger.require_role(principal, OPERATOR_ROLES, "reconcile effects")
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
    if lookup.status != ProviderLookupStatus.UNREACHABLE:
        # The provider answers again: what was escalated while it did not is looked up again.
        from reconciliation.bulk import effects_rearm_for_provider

        effects_rearm_for_provider(provider=contract.provider)
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
            _write_verdict(effect, verdict, reason=reason, data=data, actor=actor, who=who, now=now)
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


def _write_verdict(
    effect: Effect,
    verdict: Verdict,
    *,
    reason: str,
    data: dict[str, Any],
    actor: str,
    who: Principal | None,
    now: datetime,
) -> None:
    """Write a verdict to the effect ``_apply`` locked and found as it was read: the status
    change (or the flags and schedule), the receipt, the case, and what follows."""
    newly_flagged = (verdict.case is not None and not effect.escalated) or (
        verdict.mismatch and not effect.mismatch
    )
    if verdict.to is not None and verdict.to != effect.status:
        ledger.transition(
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
        # The status stays: the flags and schedule change, with an event when the
        # effect is newly flagged (the row is locked by the caller).
        kind = ("mismatch" if verdict.mismatch else "escalated") if newly_flagged else ""
        ledger.annotate(
            effect,
            fields=verdict.fields,
            kind=kind,
            actor=actor,
            principal=who,
            reason=reason,
            data=data,
            now=now,
        )
    if verdict.receipt and verdict.found is not None:
        ledger.record_receipt(
            effect, verdict.found, source=Receipt.Source.RECONCILER, attempt_id=None, now=now
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
        # On commit (inside enqueue_dispatch): the worker must see NOT_STARTED. The
        # claim then applies the ledger's bounds: expiry, frozen, attempt budget.
        ledger.enqueue_dispatch(effect.pk)


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
            ledger.schedule_checks(claimed, hold)
    held = _lookups_held(claimed)
    for index, effect_id in enumerate(claimed):
        if effect_id in held:
            continue
        if deadline is not None and time.monotonic() >= deadline:
            # Hand the rest back rather than leave it invisible until the hold runs out.
            ledger.schedule_checks(claimed[index:], timezone.now(), next_check_at=hold)
            break
        try:
            effect_reconcile(effect_id=effect_id, actor=actor)
        except Exception:
            # A poison row (no contract, a bug, a provider answer we cannot parse) must not
            # stop the batch or make the worker crash-loop on it: push it well forward.
            logger.exception("reconcile failed", extra={"effect_id": effect_id})
            ledger.schedule_checks(
                [effect_id],
                timezone.now() + POISON_DELAY,
                status__in=sorted(TO_RECONCILE),
            )
    return len(claimed)


def _lookups_held(claimed: list[str]) -> set[str]:
    """The claimed effects whose provider's circuit is open, or whose lookup would carry a
    credential the provider paused (``Retry-After``, gateway.providers.protection): not
    asked now, their next lookup moved to when the gate reopens, without spending a check of
    their budget on a provider known to be down. A lookup never sends anything; only its
    schedule moves. A gate that cannot be read holds nothing back."""
    if not claimed:
        return set()
    try:
        view = protection.outlook()
    except Exception:
        logger.warning("provider gates unreadable; looking up anyway", exc_info=True)
        return set()
    if not view.held and not view.paused:
        return set()  # no provider held, no credential paused: no database round trip
    providers = dict(Effect.objects.filter(pk__in=claimed).values_list("pk", "command__provider"))
    until: dict[str, float] = {}
    for provider, gate in view.held.items():
        until.update((e, gate.until) for e, name in providers.items() if name == provider)
    paused = [e for e, name in providers.items() if name in view.paused and e not in until]
    for effect_id, credential in (lookup_fingerprints(paused) if paused else {}).items():
        provider = providers[effect_id]
        key = protection.lookup_key(provider, credential)
        if key in view.paused[provider]:
            until[effect_id] = view.paused[provider][key]
    for at in set(until.values()):
        ids = [effect_id for effect_id, when in until.items() if when == at]
        moment = datetime.fromtimestamp(at, tz=UTC)
        ledger.schedule_checks(ids, moment, status__in=sorted(TO_RECONCILE))
    return set(until)


def reconcile_due(*, time_budget: float | None = None, batch_size: int = 50) -> int:
    """One reconciler sweep (beat, every GATEWAY_RECONCILE_INTERVAL): recover expired leases,
    queue flagged effects for a human, then look up due effects until none are due or the
    time budget is spent. Returns how much work it found. Leases and lookups are the wakers'
    at their due times (reconciliation.waker); here they are the safety net."""
    budget = time_budget if time_budget is not None else settings.GATEWAY_RECONCILE_INTERVAL * 0.8
    deadline = time.monotonic() + budget
    work = effects_recover_expired_leases()
    work += cases_open_for_flagged()
    from reconciliation.bulk import effects_probe_escalated

    work += effects_probe_escalated()
    from reconciliation.services.manual import manual_receipts_verify

    work += manual_receipts_verify(deadline=deadline)
    while time.monotonic() < deadline:
        claimed = reconcile_next_batch(limit=batch_size, deadline=deadline)
        work += claimed
        if not claimed:
            break
    return work
