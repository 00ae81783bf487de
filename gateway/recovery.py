"""Attempts whose worker died: closed, so that "sending" always means a call in flight.

An attempt row is written "sending" before the provider is called (STYLE 8); the worker
closes it with the answer. A worker killed in between left it "sending" forever. Lease recovery
(reconciliation) closes the attempt of the claim it takes back; this pass closes any other
"sending" attempt whose claim is gone — its effect moved on, or to another fence — once it is
older than a lease. Nothing is re-sent here: what the provider did is settled by lookup.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from gateway.choices import AttemptState, EffectStatus
from gateway.models import Attempt

ABANDONED_REASON = "its worker died or stalled before answering; settled by lookup"


def close_attempts_of_lost_claim(*, effect_id: str, fence: int, now) -> int:
    """Close the "sending" attempt of a claim that lease recovery just took back."""
    return Attempt.objects.filter(
        effect_id=effect_id, fence=fence, state=AttemptState.SENDING
    ).update(state=AttemptState.ABANDONED, finished_at=now, error=ABANDONED_REASON)


def attempts_close_abandoned(*, limit: int = 500) -> int:
    """Close "sending" attempts older than a lease whose claim no longer holds its effect."""
    now = timezone.now()
    cutoff = now - timedelta(seconds=settings.GATEWAY_DISPATCH_LEASE)
    # Served by the partial index attempt_sending; a live claim is DISPATCHING at its fence.
    live = Q(effect__status=EffectStatus.DISPATCHING, effect__fence=F("fence"))
    ids = list(
        Attempt.objects.filter(state=AttemptState.SENDING, started_at__lt=cutoff)
        .exclude(live)
        .values_list("pk", flat=True)[:limit]
    )
    if not ids:
        return 0
    # Compare-and-set on the state: the worker may still write its (stale) answer now.
    return Attempt.objects.filter(pk__in=ids, state=AttemptState.SENDING).update(
        state=AttemptState.ABANDONED, finished_at=now, error=ABANDONED_REASON
    )
