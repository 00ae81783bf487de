"""An operator's resolution of an uncertain effect, with evidence."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone

from gateway import ledger
from gateway.choices import OPERATOR_ROLES, TO_RECONCILE, Outcome
from gateway.contracts import get_contract
from gateway.errors import InvalidTransition, NotFound, ValidationProblem
from gateway.models import Effect, Principal, Receipt
from gateway.providers.base import CallResult, ProviderOperation
from reconciliation.choices import MANUAL_OUTCOMES, RecordKind, RecordOutcome
from reconciliation.models import ReconciliationRecord
from reconciliation.services.cases import _case_settle
from reconciliation.services.core import S, _writing

# The provider status of a receipt recorded by a person (the provider's own names its state).
MANUAL_STATUS = "manual"


def effect_resolve(
    *,
    effect: Effect,
    principal: Principal,
    outcome: str,
    evidence: str,
    operation_id: str = "",
    fields: Mapping[str, Any] | None = None,
) -> Effect:
    """An operator settles an uncertain (or escalated NOT_STARTED) effect, with evidence.

    ``confirmed``: CONFIRMED, with a receipt recorded by a person (source ``manual``: the
    provider ``operation_id`` and the contract's ``receipt_fields`` the operator read at the
    provider, who, and the evidence), so that its compensation and the saga steps after it are
    built as from a provider's receipt. A CONFIRMED effect that has no provider receipt may be
    resolved "confirmed" again to supply what its manual receipt lacked (a new receipt is
    appended). ``not_started``: NOT_STARTED, and re-dispatched with the same key while
    unexpired and within the attempt budget; if the operator is wrong and the provider has
    the operation, the provider's idempotency answers with it and nothing runs twice.
    History is never edited: a manual record, an event (and a receipt) are appended.
    """
    ledger.require_role(principal, OPERATOR_ROLES, "resolve effects")
    if effect.tenant_id != principal.tenant_id:
        raise NotFound(f"No effect {effect.pk}.")
    manual = _valid_resolution(effect, outcome, evidence, operation_id, fields)
    now = timezone.now()
    label = principal.label
    with _writing(effect.tenant_id):
        # Lock the row against the reconciler and webhooks writing the same effect.
        current = Effect.objects.select_for_update().select_related("command").get(pk=effect.pk)
        before = current.status
        amending = before == S.CONFIRMED and outcome == RecordOutcome.CONFIRMED
        if amending and not _adds_to_manual_receipt(current, manual):
            raise InvalidTransition(
                f"Effect {current.pk} is CONFIRMED: only a receipt recorded by hand (and no "
                "provider's) can be completed, with an operation id or a field it lacks."
            )
        if not amending and not resolvable(current):
            raise InvalidTransition(
                f"Effect {current.pk} is {before}"
                f"{' (escalated)' if current.escalated else ''}: only an UNKNOWN or "
                "IN_PROGRESS effect, or an escalated NOT_STARTED one, can be resolved."
            )
        data: dict[str, Any] = {"outcome": outcome, "manual": True}
        if outcome == RecordOutcome.CONFIRMED:
            moved = _resolve_confirmed(
                current, principal, manual, evidence=manual.evidence, data=data, now=now
            )
        else:
            moved = _resolve_not_started(
                current, principal, evidence=manual.evidence, data=data, now=now
            )
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
            provider_operation_id=manual.operation_id,
            evidence=manual.evidence,
            created_at=now,
        )
        _case_settle(
            current, actor=label, principal=principal, resolution=f"{outcome}: {manual.evidence}"
        )
    current.refresh_from_db()
    return current


def resolvable(effect: Effect) -> bool:
    """Whether an operator's resolution could settle this effect now."""
    return effect.status in TO_RECONCILE or (effect.status == S.NOT_STARTED and effect.escalated)


def amendable(effect: Effect) -> bool:
    """A CONFIRMED effect whose receipts are only a person's: confirming it again with the
    fields its manual receipt lacked appends a new manual receipt."""
    if effect.status != S.CONFIRMED:
        return False
    sources = set(effect.receipts.values_list("source", flat=True))
    return sources == {Receipt.Source.MANUAL}


def _adds_to_manual_receipt(effect: Effect, manual: ManualReceipt) -> bool:
    """The new resolution says something the latest manual receipt does not (so that two
    people confirming the same effect at once still meet a 409, not a silent second write)."""
    if not amendable(effect):
        return False
    latest = (
        effect.receipts.filter(source=Receipt.Source.MANUAL).order_by("-received_at", "-id").first()
    )
    assert latest is not None
    if manual.operation_id and manual.operation_id != latest.provider_operation_id:
        return True
    return any(latest.result.get(name) != value for name, value in manual.result.items())


@dataclass(frozen=True)
class ManualReceipt:
    """What an operator read at the provider: its operation id and the declared fields."""

    evidence: str
    operation_id: str
    result: dict[str, str]


def _valid_resolution(
    effect: Effect,
    outcome: str,
    evidence: Any,
    operation_id: Any,
    fields: Mapping[str, Any] | None,
) -> ManualReceipt:
    """The resolution, stripped; a 400 that says why when a part of it is missing or is not
    one of the contract's ``receipt_fields``."""
    errors: dict[str, list[str]] = {}
    if outcome not in MANUAL_OUTCOMES:
        errors["outcome"] = [f"must be one of {', '.join(sorted(MANUAL_OUTCOMES))}"]
    evidence = (evidence or "").strip() if isinstance(evidence, str) else ""
    if not evidence:
        errors["evidence"] = ["required: what you checked and what it showed"]
    operation_id = (operation_id or "").strip() if isinstance(operation_id, str) else None
    if operation_id is None or len(operation_id) > 200:
        errors["operation_id"] = ["must be a string of at most 200 characters"]
    contract = get_contract(effect.type)
    declared = contract.receipt_fields if contract else ()
    result: dict[str, str] = {}
    for name, value in (fields or {}).items():
        if name not in declared:
            allowed = ", ".join(declared) or "none"
            errors[f"result.{name}"] = [f"not a receipt field of {effect.type} ({allowed})"]
        elif not isinstance(value, str) or len(value.strip()) > 200:
            errors[f"result.{name}"] = ["must be a string of at most 200 characters"]
        elif value.strip():
            result[name] = value.strip()
    if errors:
        raise ValidationProblem("The resolution is not valid.", errors=errors)
    return ManualReceipt(evidence, operation_id or "", result)


def _resolve_confirmed(
    current: Effect,
    principal: Principal,
    manual: ManualReceipt,
    *,
    evidence: str,
    data: dict[str, Any],
    now: datetime,
) -> bool:
    """CONFIRMED by an operator's word, with the receipt they read at the provider (or, for
    an effect already CONFIRMED by hand, a new receipt appended). False when another actor
    moved the effect meanwhile."""
    operation_id = manual.operation_id or current.provider_operation_id
    data.update(provider_operation_id=operation_id, fields=manual.result)
    if current.status == S.CONFIRMED:
        moved = ledger.annotate(
            current,
            expect_status=S.CONFIRMED,
            fields={"provider_operation_id": operation_id},
            kind="receipt_recorded",
            actor=principal.label,
            principal=principal,
            reason=evidence,
            data=data,
            now=now,
        )
    else:
        moved = ledger.transition(
            current,
            to=S.CONFIRMED,
            actor=principal.label,
            principal=principal,
            kind="resolved",
            reason=evidence,
            data=data,
            confirmed_at=now,
            next_check_at=None,
            lease_expires_at=None,
            escalated=False,
            mismatch=False,
            provider_operation_id=operation_id,
        )
    if moved:
        found = CallResult(
            outcome=Outcome.CONFIRMED,
            reason="confirmed by hand",
            operation=ProviderOperation(
                id=operation_id,
                status=MANUAL_STATUS,
                payload_digest=current.command.payload_digest,
                result=dict(manual.result),
            ),
        )
        ledger.record_receipt(
            current,
            found,
            source=Receipt.Source.MANUAL,
            attempt_id=None,
            now=now,
            recorded_by=principal.label,
            evidence=evidence,
        )
    return moved


def _resolve_not_started(
    current: Effect, principal: Principal, *, evidence: str, data: dict[str, Any], now
) -> bool:
    """NOT_STARTED by an operator's word (an escalated NOT_STARTED effect is re-armed in
    place), sent again with the same key if the command is unexpired and has attempts left.
    False when another actor moved the effect meanwhile."""
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
    if current.status == S.NOT_STARTED:
        checks = current.check_count
        moved = ledger.annotate(
            current,
            expect_status=S.NOT_STARTED,
            fields=fields,
            kind="resolved",
            actor=principal.label,
            principal=principal,
            reason=reason,
            data=data,
            now=now,
        )
        # The manual record names the check count the effect was resolved at.
        current.check_count = checks
    else:
        moved = ledger.transition(
            current,
            to=S.NOT_STARTED,
            actor=principal.label,
            principal=principal,
            kind="resolved",
            reason=reason,
            data=data,
            **fields,
        )
    if moved and redispatch:
        ledger.enqueue_dispatch(current.pk)
    return moved
