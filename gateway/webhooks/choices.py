"""Event types a webhook endpoint can subscribe to, and the states of an outbox message."""

from django.db import models

from gateway.choices import EffectStatus

S = EffectStatus


class EventType(models.TextChoices):
    CONFIRMED = "effect.confirmed"
    UNKNOWN = "effect.unknown"
    REJECTED = "effect.rejected"
    APPROVAL_DECIDED = "effect.approval_decided"
    COMPENSATION_FAILED = "effect.compensation_failed"


# The event a status change announces. AWAITING_APPROVAL → PREPARED (approved) and
# AWAITING_APPROVAL → REJECTED (refused) also announce effect.approval_decided.
EVENT_FOR_STATUS: dict[str, str] = {
    S.CONFIRMED: EventType.CONFIRMED,
    S.UNKNOWN: EventType.UNKNOWN,
    S.REJECTED: EventType.REJECTED,
    S.COMPENSATION_FAILED: EventType.COMPENSATION_FAILED,
}


class MessageState(models.TextChoices):
    PENDING = "pending"  # waiting for its first or next attempt
    DELIVERED = "delivered"  # the receiver answered 2xx
    FAILED = "failed"  # out of attempts; visible, never retried by itself
    GONE = "gone"  # the receiver answered 410: the endpoint was disabled
