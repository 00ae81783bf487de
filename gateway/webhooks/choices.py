"""Event types a webhook endpoint can subscribe to, and the states of an outbox message."""

from django.db import models

from gateway.choices import EffectStatus

S = EffectStatus


class EventType(models.TextChoices):
    # Every state an agent waits on is announced (a waiting LangGraph thread, an MCP host).
    AWAITING_APPROVAL = "effect.awaiting_approval"  # data.approval.url: where to sign it off
    APPROVED = "effect.approved"
    CONFIRMED = "effect.confirmed"
    UNKNOWN = "effect.unknown"
    REJECTED = "effect.rejected"
    CANCELLED = "effect.cancelled"
    EXPIRED = "effect.expired"
    COMPENSATED = "effect.compensated"
    COMPENSATION_FAILED = "effect.compensation_failed"
    # Kept for receivers written against it: approved or rejected, data.approval.decision.
    APPROVAL_DECIDED = "effect.approval_decided"
    # A saga run changed state (data.state, data.from_state).
    SAGA_STATE_CHANGED = "saga.state_changed"


# The event a status change announces. AWAITING_APPROVAL → PREPARED (approved) also announces
# effect.approved, and both PREPARED and REJECTED from AWAITING_APPROVAL announce
# effect.approval_decided.
EVENT_FOR_STATUS: dict[str, str] = {
    S.AWAITING_APPROVAL: EventType.AWAITING_APPROVAL,
    S.CONFIRMED: EventType.CONFIRMED,
    S.UNKNOWN: EventType.UNKNOWN,
    S.REJECTED: EventType.REJECTED,
    S.CANCELLED: EventType.CANCELLED,
    S.EXPIRED: EventType.EXPIRED,
    S.COMPENSATED: EventType.COMPENSATED,
    S.COMPENSATION_FAILED: EventType.COMPENSATION_FAILED,
}


class MessageState(models.TextChoices):
    PENDING = "pending"  # waiting for its first or next attempt
    DELIVERED = "delivered"  # the receiver answered 2xx
    FAILED = "failed"  # out of attempts; visible, never retried by itself
    GONE = "gone"  # the receiver answered 410: the endpoint was disabled
