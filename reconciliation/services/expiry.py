"""Approval expiry at its deadline: a command that waits for an approver (AWAITING_APPROVAL)
becomes EXPIRED when its ``expires_at`` passes, acted on by the waker (reconciliation.waker)
at that time rather than at the dispatch sweep's next pass.

A saga's step waits the same way (its command's ``expires_in`` is the step's deadline,
sagas.definitions.Step): once its effect is EXPIRED the run is advanced after commit
(sagas.listeners), which fails the step and compensates or pauses as its policy says. The
dispatch sweep (gateway.sweep) still expires whatever this misses: it is the safety net.

The due time is the earliest ``expires_at`` of the commands whose effect is AWAITING_APPROVAL
(reconciliation.selectors.effects_next_due, through the partial index effect_before_dispatch:
the effects waiting for an approver, a set people work down, joined to their command). A
writer that makes an effect wait for an approver announces the expiry to the waker
(``announce_approval_deadline``) when it falls before the waker's next look.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from gateway import deadlines
from gateway.hooks import fast_path_idle
from gateway.models import Effect
from reconciliation.services.core import S

WAKER = "waker"


def effects_expire_awaiting_approval(*, limit: int = 100, now: datetime | None = None) -> int:
    """AWAITING_APPROVAL effects whose command expired by ``now`` (default: the clock's)
    become EXPIRED. Returns how many."""
    from gateway.services import effect_expire

    now = now or timezone.now()
    with transaction.atomic():
        # SKIP LOCKED against a second waker expiring the same rows. An approver deciding one
        # of them right now (effect_approve) and the dispatch sweep expiring it both write
        # with a compare-and-set on the status read: whichever commits first wins, the other
        # matches no row and writes nothing.
        due = list(
            Effect.objects.select_related("command")
            .filter(status=S.AWAITING_APPROVAL, command__expires_at__lte=now)
            .order_by("command__expires_at")
            .select_for_update(skip_locked=True, of=("self",))[:limit]
        )
        return sum(effect_expire(effect=effect, actor=WAKER) for effect in due)


def announce_approval_deadline(effect: Effect) -> None:
    """Tell the waker (after commit) when an effect that now waits for an approver expires,
    if that is before its next look (``gateway.deadlines.soon``)."""
    if effect.status == S.AWAITING_APPROVAL:
        deadlines.soon(effect.command.expires_at)


def announce_on_creation(effect: Effect) -> None:
    """``hooks.effect_created`` listener: a new effect that waits for an approver."""
    announce_approval_deadline(effect)


@fast_path_idle("the fast path's statements never write AWAITING_APPROVAL")
def announce_on_transition(effect: Effect, *, from_status: str, to: str) -> None:
    """``hooks.after_transition`` listener: an effect asked for approval again (its approval
    grew too old before dispatch)."""
    if to == S.AWAITING_APPROVAL:
        announce_approval_deadline(effect)
