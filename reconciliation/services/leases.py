"""Lease recovery: DISPATCHING claims whose lease ran out become UNKNOWN, to be looked up."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from gateway import ledger
from gateway.models import Attempt, Effect
from gateway.recovery import close_attempts_of_lost_claim
from reconciliation.services.core import LEASE_RECOVERY, S


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
            recovered += ledger.transition(
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
