"""An operator's resolution of an uncertain effect, with evidence."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from gateway import ledger
from gateway.choices import OPERATOR_ROLES, TO_RECONCILE
from gateway.contracts import get_contract
from gateway.errors import InvalidTransition, NotFound, ValidationProblem
from gateway.models import Effect, Principal
from reconciliation.choices import MANUAL_OUTCOMES, RecordKind, RecordOutcome
from reconciliation.models import ReconciliationRecord
from reconciliation.services.cases import _case_settle
from reconciliation.services.core import S, _writing


def effect_resolve(*, effect: Effect, principal: Principal, outcome: str, evidence: str) -> Effect:
    """An operator settles an uncertain (or escalated NOT_STARTED) effect, with evidence.

    ``confirmed``: CONFIRMED, without a receipt — the manual record is the proof.
    ``not_started``: NOT_STARTED, and re-dispatched with the same key while unexpired and
    within the attempt budget; if the operator is wrong and the provider has the operation,
    the provider's idempotency answers with it and nothing runs twice.
    History is never edited: a manual record and an event are appended.
    """
    ledger.require_role(principal, OPERATOR_ROLES, "resolve effects")
    if effect.tenant_id != principal.tenant_id:
        raise NotFound(f"No effect {effect.pk}.")
    evidence = _valid_resolution(outcome, evidence)
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
            moved = ledger.transition(
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
            moved = _resolve_not_started(current, principal, evidence=evidence, data=data, now=now)
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


def _valid_resolution(outcome: str, evidence: Any) -> str:
    """The evidence, stripped; a 400 that says why when the outcome or evidence is missing."""
    errors: dict[str, list[str]] = {}
    if outcome not in MANUAL_OUTCOMES:
        errors["outcome"] = [f"must be one of {', '.join(sorted(MANUAL_OUTCOMES))}"]
    evidence = (evidence or "").strip() if isinstance(evidence, str) else ""
    if not evidence:
        errors["evidence"] = ["required: what you checked and what it showed"]
    if errors:
        raise ValidationProblem("The resolution is not valid.", errors=errors)
    return evidence


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
