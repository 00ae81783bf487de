"""Closing what a human settled outside the gateway (STYLE 4–6): a case on an effect that is
no longer uncertain (a confirmed charge whose later receipt disagreed), and a compensation
that failed and was fixed by hand at the provider. Uncertain effects are closed by
``effect_resolve`` instead, which records what happened at the provider.
"""

from __future__ import annotations

from django.utils import timezone

from gateway import ledger
from gateway.choices import OPERATOR_ROLES, TO_RECONCILE, EffectStatus
from gateway.errors import InvalidTransition, NotFound, ValidationProblem
from gateway.models import Effect, Principal
from reconciliation.choices import UNRESOLVED, CaseReason, CaseState
from reconciliation.models import Case
from reconciliation.services.cases import case_open
from reconciliation.services.core import _writing

S = EffectStatus


def _note(note: str) -> str:
    note = (note or "").strip()
    if not note:
        raise ValidationProblem(
            "Say what you found or did.", errors={"note": ["required: what you checked or did"]}
        )
    return note[:4000]


def case_close(*, case: Case, principal: Principal, note: str) -> Case:
    """Close an unresolved case whose effect is settled (not UNKNOWN or IN_PROGRESS), with
    what the operator found: e.g. the later receipt was the provider's mistake."""
    ledger.require_role(principal, OPERATOR_ROLES, "close cases")
    if case.tenant_id != principal.tenant_id:
        raise NotFound(f"No case {case.pk}.")
    note = _note(note)
    now = timezone.now()
    with _writing(case.tenant_id):
        effect = Effect.objects.select_for_update().get(pk=case.effect_id)
        if effect.status in TO_RECONCILE:
            raise InvalidTransition(
                f"{effect.pk} is {effect.status}: resolve it with evidence of what happened at "
                "the provider; that closes its case."
            )
        # Compare-and-set on the state: a second operator closing it, or the reconciler
        # settling it, leave one outcome.
        changed = Case.objects.filter(pk=case.pk, state__in=sorted(UNRESOLVED)).update(
            state=CaseState.RESOLVED,
            resolved_by=principal,
            resolved_actor=principal.label,
            resolved_at=now,
            resolution=f"closed: {note}",
        )
        if not changed:
            case.refresh_from_db()
            raise InvalidTransition(f"Case {case.pk} is {case.state} already.")
        ledger.append_event(
            effect,
            kind="case_closed",
            actor=principal.label,
            principal=principal,
            from_status=effect.status,
            to_status=effect.status,
            reason=note,
            data={"case_id": case.pk},
            now=now,
        )
    case.refresh_from_db()
    return case


def effect_record_fix(*, effect: Effect, principal: Principal, note: str) -> Case:
    """A COMPENSATION_FAILED effect was undone by hand at the provider: record how, as a case
    of the owner closed with the note (the effect's status stays: the ledger never pretends
    the compensation succeeded). The triage queue then no longer lists it."""
    ledger.require_role(principal, OPERATOR_ROLES, "record fixes")
    if effect.tenant_id != principal.tenant_id:
        raise NotFound(f"No effect {effect.pk}.")
    note = _note(note)
    with _writing(effect.tenant_id):
        current = Effect.objects.select_for_update().select_related("command").get(pk=effect.pk)
        if current.status != S.COMPENSATION_FAILED:
            raise InvalidTransition(
                f"{current.pk} is {current.status}: only a failed compensation is fixed by hand."
            )
        case = case_open(
            effect=current,
            reason=CaseReason.ESCALATED,
            text="the compensation failed",
            actor=principal.label,
        )
        # In the same transaction: the case is never seen open without its fix.
        return case_close(case=case, principal=principal, note=f"fixed by hand: {note}")
