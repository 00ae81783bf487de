"""Statuses, roles and outcomes, with the one transition table everything reads (SPEC §4)."""

from django.db import models


class EffectStatus(models.TextChoices):
    PREPARED = "PREPARED"
    AWAITING_APPROVAL = "AWAITING_APPROVAL"
    DISPATCHING = "DISPATCHING"
    IN_PROGRESS = "IN_PROGRESS"
    CONFIRMED = "CONFIRMED"
    NOT_STARTED = "NOT_STARTED"
    UNKNOWN = "UNKNOWN"
    REJECTED = "REJECTED"
    EXPIRED = "EXPIRED"
    CANCELLED = "CANCELLED"
    COMPENSATING = "COMPENSATING"
    COMPENSATED = "COMPENSATED"
    COMPENSATION_FAILED = "COMPENSATION_FAILED"


S = EffectStatus

# Who may move an effect from one status to another. The service guard, the console's
# colours and the tests all read this one table.
ALLOWED_TRANSITIONS: dict[str, frozenset[str]] = {
    S.PREPARED: frozenset({S.AWAITING_APPROVAL, S.DISPATCHING, S.EXPIRED, S.CANCELLED, S.REJECTED}),
    S.AWAITING_APPROVAL: frozenset({S.PREPARED, S.REJECTED, S.EXPIRED, S.CANCELLED}),
    S.DISPATCHING: frozenset({S.CONFIRMED, S.IN_PROGRESS, S.NOT_STARTED, S.UNKNOWN, S.REJECTED}),
    S.IN_PROGRESS: frozenset({S.CONFIRMED, S.UNKNOWN, S.REJECTED, S.NOT_STARTED}),
    S.NOT_STARTED: frozenset(
        {S.DISPATCHING, S.AWAITING_APPROVAL, S.EXPIRED, S.CANCELLED, S.REJECTED}
    ),
    S.UNKNOWN: frozenset({S.CONFIRMED, S.IN_PROGRESS, S.NOT_STARTED, S.REJECTED}),
    S.CONFIRMED: frozenset({S.COMPENSATING}),
    S.COMPENSATING: frozenset({S.COMPENSATED, S.COMPENSATION_FAILED}),
    S.REJECTED: frozenset(),
    S.EXPIRED: frozenset(),
    S.CANCELLED: frozenset(),
    S.COMPENSATED: frozenset(),
    S.COMPENSATION_FAILED: frozenset(),
}

TERMINAL = frozenset(status for status, nexts in ALLOWED_TRANSITIONS.items() if not nexts)
# Nothing more will happen by itself: confirmed (only a new command can compensate it) or
# terminal. What a caller waiting for "the outcome" waits for.
SETTLED = TERMINAL | {S.CONFIRMED}
# The outcome is not known to the ledger: nothing may be sent until a lookup settles it.
UNCERTAIN = frozenset({S.UNKNOWN, S.DISPATCHING})
# Statuses from which the dispatcher may claim an effect and send it.
DISPATCHABLE = frozenset({S.PREPARED, S.NOT_STARTED})
# Not yet sent to the provider: a cancel or an expiry is still clean.
BEFORE_DISPATCH = frozenset({S.PREPARED, S.AWAITING_APPROVAL, S.NOT_STARTED})
# The reconciler's work: ask the provider what happened.
TO_RECONCILE = frozenset({S.UNKNOWN, S.IN_PROGRESS})

# Console colours: one per status, read by templates.
STATUS_TONE: dict[str, str] = {
    S.PREPARED: "neutral",
    S.AWAITING_APPROVAL: "attention",
    S.DISPATCHING: "info",
    S.IN_PROGRESS: "info",
    S.CONFIRMED: "success",
    S.NOT_STARTED: "neutral",
    S.UNKNOWN: "danger",
    S.REJECTED: "muted",
    S.EXPIRED: "muted",
    S.CANCELLED: "muted",
    S.COMPENSATING: "attention",
    S.COMPENSATED: "success",
    S.COMPENSATION_FAILED: "danger",
}


class Role(models.TextChoices):
    AGENT = "agent"
    APPROVER = "approver"
    OPERATOR = "operator"
    ADMIN = "admin"


# Who may do what, each group named once (services, selectors, the API and the console read
# these). Operators freeze, reconcile, resolve, read clear payloads and saga inputs.
SUBMITTER_ROLES = frozenset({Role.AGENT, Role.OPERATOR, Role.ADMIN})
APPROVER_ROLES = frozenset({Role.APPROVER, Role.ADMIN})
OPERATOR_ROLES = frozenset({Role.OPERATOR, Role.ADMIN})
ADMIN_ROLES = frozenset({Role.ADMIN})


class Outcome(models.TextChoices):
    """The adapter's one vocabulary for what a provider call proved."""

    CONFIRMED = "confirmed"
    IN_PROGRESS = "in_progress"
    NOT_STARTED = "not_started"
    UNKNOWN = "unknown"
    REJECTED = "rejected"


OUTCOME_STATUS: dict[str, str] = {
    Outcome.CONFIRMED: S.CONFIRMED,
    Outcome.IN_PROGRESS: S.IN_PROGRESS,
    Outcome.NOT_STARTED: S.NOT_STARTED,
    Outcome.UNKNOWN: S.UNKNOWN,
    Outcome.REJECTED: S.REJECTED,
}


class EventKind(models.TextChoices):
    """The events of submission and dispatch, written by the ORM path (``gateway.services``)
    and by the fast path's statements (``gateway.fastpath``) alike. Other events name their
    kind where they are written."""

    SUBMITTED = "submitted"
    CLAIMED = "claimed"
    DISPATCHED = "dispatched"


class AttemptState(models.TextChoices):
    SENDING = "sending"
    FINISHED = "finished"
    STALE = "stale"  # the worker lost its claim; its result was refused
    ABANDONED = "abandoned"  # its worker died or stalled before answering (lease recovery)


class CredentialState(models.TextChoices):
    """A tenant's provider credential (gateway.models.ProviderCredential): ``active`` sends the
    tenant's new effects; ``rotated`` (replaced by a newer one) still serves the effects it
    sent, their lookups and any attempt it was chosen for; ``retired`` serves nothing."""

    ACTIVE = "active"
    ROTATED = "rotated"
    RETIRED = "retired"


# The states in which a credential may still be used (for the effects it sent).
CREDENTIAL_USABLE = frozenset({CredentialState.ACTIVE, CredentialState.ROTATED})


class ApprovalState(models.TextChoices):
    NOT_REQUIRED = "not_required"
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"  # approved too long before dispatch: asked again


class EffectClass(models.TextChoices):
    IDEMPOTENT_WRITE = "idempotent_write"
    EXTERNAL_WRITE = "external_write"
    FINANCIAL_WRITE = "financial_write"


class SavedViewPage(models.TextChoices):
    """The console pages whose filters can be saved under a name (gateway.saved_views)."""

    TRIAGE = "triage"
    SEARCH = "search"
    AUDIT = "audit"
