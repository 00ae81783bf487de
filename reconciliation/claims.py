"""Who is on it: an operator takes an effect (and its open case) so that two engineers do not
work the same incident at once, and releases it when done or handing over (STYLE 4–6).

A claim changes nothing the gateway does with the effect; it is a note between humans, kept
with an event on the effect's timeline in the same transaction.
"""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.utils import timezone

from gateway import audit, ledger
from gateway.choices import OPERATOR_ROLES
from gateway.errors import InvalidTransition, NotFound
from gateway.models import Effect, Principal
from reconciliation.choices import CaseState
from reconciliation.models import Case, Claim


def effect_holder(effect: Effect) -> Claim | None:
    return Claim.objects.filter(effect=effect, released_at=None).select_related("principal").first()


def effect_take(*, effect: Effect, principal: Principal, note: str = "") -> Claim:
    """``principal`` takes ``effect``, and its open case if it has one (``case_acknowledge``'s
    change, in the same transaction). Taking what you hold already is a no-op."""
    ledger.require_role(principal, OPERATOR_ROLES, "take effects")
    if effect.tenant_id != principal.tenant_id:
        raise NotFound(f"No effect {effect.pk}.")
    now = timezone.now()
    with transaction.atomic():
        audit.lock_chain(effect.tenant_id)
        held = effect_holder(effect)
        if held is not None:
            if held.principal_id == principal.pk:
                return held
            raise InvalidTransition(
                f"{held.principal.name} ({held.principal.role}) took {effect.pk} at "
                f"{timezone.localtime(held.taken_at):%H:%M}; ask them, or release it first."
            )
        try:
            # A savepoint: another engineer taking it at the same moment collides on the
            # partial unique index claim_one_holder_per_effect.
            with transaction.atomic():
                claim = Claim.objects.create(
                    tenant_id=effect.tenant_id, effect=effect, principal=principal, taken_at=now
                )
        except IntegrityError:
            raise InvalidTransition(f"Someone else took {effect.pk} just now.") from None
        # The open case is taken with it: the human queue then says who is on it too.
        case_ids = list(
            Case.objects.filter(effect=effect, state=CaseState.OPEN).values_list("pk", flat=True)
        )
        Case.objects.filter(pk__in=case_ids, state=CaseState.OPEN).update(
            state=CaseState.ACKNOWLEDGED, acknowledged_by=principal, acknowledged_at=now
        )
        ledger.append_event(
            effect,
            kind="taken",
            actor=principal.label,
            principal=principal,
            from_status=effect.status,
            to_status=effect.status,
            reason=note or "taken",
            data={"case_ids": case_ids} if case_ids else {},
            now=now,
        )
    return claim


def effect_release(*, effect: Effect, principal: Principal, note: str = "") -> int:
    """Release the claim on ``effect`` (one's own, or a colleague's who left: any operator
    may). Returns 1 when a claim was released, 0 when nobody held it."""
    ledger.require_role(principal, OPERATOR_ROLES, "release effects")
    if effect.tenant_id != principal.tenant_id:
        raise NotFound(f"No effect {effect.pk}.")
    now = timezone.now()
    with transaction.atomic():
        audit.lock_chain(effect.tenant_id)
        held = effect_holder(effect)
        if held is None:
            return 0
        # Compare-and-set on the claim read: a second release of the same claim is a no-op.
        released = Claim.objects.filter(pk=held.pk, released_at=None).update(
            released_at=now, released_by=principal
        )
        if released:
            ledger.append_event(
                effect,
                kind="released",
                actor=principal.label,
                principal=principal,
                from_status=effect.status,
                to_status=effect.status,
                reason=note or f"released (held by {held.principal.label})",
                now=now,
            )
    return released


def holders(effect_ids: list[str]) -> dict[str, str]:
    """Who holds each of ``effect_ids`` (name), in one query: the triage rows show it."""
    return dict(
        Claim.objects.filter(effect_id__in=effect_ids, released_at=None).values_list(
            "effect_id", "principal__name"
        )
    )
