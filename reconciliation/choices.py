"""Vocabularies of reconciliation: what a lookup found, what the gateway did about it, and the
states of the human queue."""

from django.db import models


class RecordKind(models.TextChoices):
    """How the outcome of an uncertain effect was established."""

    LOOKUP = "lookup"  # the reconciler asked the provider
    MANUAL = "manual"  # an operator decided, with evidence


class LookupBy(models.TextChoices):
    IDEMPOTENCY_KEY = "idempotency_key"
    PROVIDER_OPERATION_ID = "provider_operation_id"


class LookupStatus(models.TextChoices):
    """What the provider's lookup answered (mirrors gateway.providers.base.LookupStatus)."""

    FOUND = "found"
    NOT_FOUND = "not_found"
    UNREACHABLE = "unreachable"


class RecordOutcome(models.TextChoices):
    """What the gateway did with one lookup (or one manual resolution)."""

    CONFIRMED = "confirmed"
    IN_PROGRESS = "in_progress"
    REJECTED = "rejected"
    MISMATCH = "mismatch"
    # Not found by key within the key retention: re-dispatched with the original key.
    NOT_STARTED = "not_started"
    # Nothing proven (unreachable, unexpected answer); looked up again later.
    INCONCLUSIVE = "inconclusive"
    ESCALATED = "escalated"
    # Another actor (a webhook, a second reconciler, an operator) changed the effect while
    # the provider was being asked: this answer was kept as evidence but not applied.
    SUPERSEDED = "superseded"


# The outcomes an operator may declare (SPEC §5 resolve).
MANUAL_OUTCOMES = frozenset({RecordOutcome.CONFIRMED, RecordOutcome.NOT_STARTED})


class CaseState(models.TextChoices):
    OPEN = "open"
    ACKNOWLEDGED = "acknowledged"
    RESOLVED = "resolved"


# At most one case per effect in these states (a partial unique index enforces it).
UNRESOLVED = frozenset({CaseState.OPEN, CaseState.ACKNOWLEDGED})


class CaseReason(models.TextChoices):
    """Why the automatic paths handed an effect to a human."""

    LOOKUP_BUDGET_EXHAUSTED = "lookup_budget_exhausted"
    STILL_PROCESSING = "still_processing"
    MISMATCH = "mismatch"
    NOT_FOUND_PAST_RETENTION = "not_found_past_retention"
    CONTRADICTION = "contradiction"
    RETRY_BUDGET_EXHAUSTED = "retry_budget_exhausted"
    ESCALATED = "escalated"


class WebhookOutcome(models.TextChoices):
    """What one asynchronous receipt did to the ledger."""

    CONFIRMED = "confirmed"
    IN_PROGRESS = "in_progress"
    REJECTED = "rejected"
    MISMATCH = "mismatch"
    # Kept as evidence, nothing changed (late, duplicate in substance, or in flight).
    NOTED = "noted"
    # The receipt contradicts a settled effect (e.g. failed after CONFIRMED): a case opened.
    CONTRADICTION = "contradiction"
    ORPHAN = "orphan"


class OrphanState(models.TextChoices):
    OPEN = "open"
    RESOLVED = "resolved"


class BulkJobState(models.TextChoices):
    """Where a bulk job is: waiting for a worker, being worked, or over."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    CANCELLED = "cancelled"
    FAILED = "failed"


BULK_JOB_ACTIVE = frozenset({BulkJobState.QUEUED, BulkJobState.RUNNING})
