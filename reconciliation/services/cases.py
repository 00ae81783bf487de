"""The human queue: cases opened for what needs a person, taken, and settled."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from gateway import ledger
from gateway.choices import OPERATOR_ROLES
from gateway.errors import InvalidTransition, NotFound
from gateway.models import Effect, EffectEvent, Principal
from reconciliation.choices import UNRESOLVED, CaseReason, CaseState
from reconciliation.models import Case
from reconciliation.services.core import _FLAGGABLE, RECONCILER, S, _writing, on_mismatch


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
    ledger.append_event(
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
    ledger.require_role(principal, OPERATOR_ROLES, "acknowledge cases")
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
        ledger.append_event(
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


# What the claim refused to send (gateway.integrity), by the event kind it recorded.
REFUSED_AT_DISPATCH = {
    "payload_tampered": "the stored payload is not the one approved (tampered); it was never sent",
    "approval_unverified": "the approval is not signed by the approver's registered key "
    "(forged or edited approval); it was never sent",
    "submitted_after_revocation": "submitted with an API token after its revocation; it was "
    "never sent",
}


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
    refused = dict(
        EffectEvent.objects.filter(
            effect_id__in=[effect.pk for effect in flagged], kind__in=sorted(REFUSED_AT_DISPATCH)
        ).values_list("effect_id", "kind")
    )
    for effect in flagged:
        # Refused at dispatch: PREPARED by the general claim, NOT_STARTED by the one-statement
        # claim (it claims before it opens the payload). Either way nothing was sent.
        if effect.pk in refused:
            reason = CaseReason.MISMATCH if effect.mismatch else CaseReason.ESCALATED
            text = REFUSED_AT_DISPATCH[refused[effect.pk]]
        elif effect.mismatch:
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
