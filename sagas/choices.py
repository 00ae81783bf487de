"""Saga states, failure triggers and the one transition table everything reads (SPEC §4, §5).

A run goes forward (RUNNING, with two pauses) until every step is CONFIRMED, or, once a
failure or an abandonment triggers it, backward (COMPENSATING) until every confirmed step is
compensated, handed to its owner, or a compensation fails. ``frozen`` is not a state: it is a
flag on the run, orthogonal to the state, that stops the orchestrator and every dispatch.
"""

from django.db import models

from gateway.choices import EffectStatus


class SagaState(models.TextChoices):
    RUNNING = "RUNNING"
    # A step's effect is UNKNOWN: nothing goes on until the reconciler has settled it.
    PAUSED_UNKNOWN = "PAUSED_UNKNOWN"
    # A step failed and its failure policy says "wait for an operator" (resume or cancel).
    PAUSED_FAILED = "PAUSED_FAILED"
    COMPENSATING = "COMPENSATING"
    COMPLETED = "COMPLETED"
    # A step failed and nothing confirmed before it needed undoing.
    FAILED = "FAILED"
    # Every confirmed step that needed undoing was compensated.
    COMPENSATED = "COMPENSATED"
    # The automatic compensations are done; the owners hold manual tasks for the rest.
    MANUAL_COMPENSATION = "MANUAL_COMPENSATION"
    # A compensation failed: terminal, the run is frozen and the owner paged.
    COMPENSATION_FAILED = "COMPENSATION_FAILED"
    CANCELLED = "CANCELLED"


R = SagaState

# Who may move a run from one state to another: the service guard, the console's colours and
# the tests all read this one table.
ALLOWED_TRANSITIONS: dict[str, frozenset[str]] = {
    R.RUNNING: frozenset(
        {R.PAUSED_UNKNOWN, R.PAUSED_FAILED, R.COMPENSATING, R.COMPLETED, R.CANCELLED}
    ),
    R.PAUSED_UNKNOWN: frozenset(
        {R.RUNNING, R.PAUSED_FAILED, R.COMPENSATING, R.COMPLETED, R.CANCELLED}
    ),
    R.PAUSED_FAILED: frozenset({R.RUNNING, R.COMPENSATING, R.CANCELLED}),
    R.COMPENSATING: frozenset(
        {R.COMPENSATED, R.MANUAL_COMPENSATION, R.FAILED, R.CANCELLED, R.COMPENSATION_FAILED}
    ),
    # The business goal abandoned after the fact: undo what was done.
    R.COMPLETED: frozenset({R.COMPENSATING}),
    R.CANCELLED: frozenset({R.COMPENSATING}),
    # An operator resumes a failed run from its first step that is not confirmed.
    R.FAILED: frozenset({R.RUNNING}),
    # The owners closed the last manual task.
    R.MANUAL_COMPENSATION: frozenset({R.COMPENSATED}),
    R.COMPENSATED: frozenset(),
    R.COMPENSATION_FAILED: frozenset(),
}

# The orchestrator has work to do (or to wait for) in these; the sweeper re-advances them.
ACTIVE = frozenset({R.RUNNING, R.PAUSED_UNKNOWN, R.COMPENSATING})
# Going forward: the next step may be issued.
FORWARD = frozenset({R.RUNNING, R.PAUSED_UNKNOWN})
# An operator may resume these: re-issue a failed step as a new revision, or nudge.
RESUMABLE = frozenset({R.RUNNING, R.PAUSED_UNKNOWN, R.PAUSED_FAILED, R.FAILED})
# Cancel stops future steps of these.
CANCELLABLE = frozenset({R.RUNNING, R.PAUSED_UNKNOWN, R.PAUSED_FAILED})
# Cancel with compensation may also undo these after the fact.
ABANDONABLE = CANCELLABLE | {R.COMPLETED, R.CANCELLED}

STATE_TONE: dict[str, str] = {
    R.RUNNING: "info",
    R.PAUSED_UNKNOWN: "danger",
    R.PAUSED_FAILED: "attention",
    R.COMPENSATING: "attention",
    R.COMPLETED: "success",
    R.FAILED: "muted",
    R.COMPENSATED: "success",
    R.MANUAL_COMPENSATION: "attention",
    R.COMPENSATION_FAILED: "danger",
    R.CANCELLED: "muted",
}


class Trigger(models.TextChoices):
    """Why a step did not go on: the condition a failure policy names."""

    REJECTED = "rejected"  # the provider or an approver refused it
    # The saga's own precondition did not hold, or the provider found the expected resource
    # version stale (HTTP 409).
    PRECONDITION_FAILED = "precondition_failed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"  # its effect was cancelled outside the saga
    REFUSED = "refused"  # the gateway refused the command (permission, validation)
    ABANDONED = "abandoned"  # cancel with compensation, or a step undone outside the saga


class FailureAction(models.TextChoices):
    COMPENSATE = "compensate"
    PAUSE = "pause"


class StepCompensation(models.TextChoices):
    """What the orchestrator decided for one confirmed step while compensating."""

    NONE = ""
    NOT_NEEDED = "not_needed"  # the contract leaves nothing to undo
    ISSUED = "issued"  # a compensating command was issued automatically
    MANUAL = "manual"  # handed to the owner as a manual task


class TaskKind(models.TextChoices):
    MANUAL_COMPENSATION = "manual_compensation"
    PAGE = "page"


class TaskState(models.TextChoices):
    OPEN = "open"
    DONE = "done"


S = EffectStatus
# What a step effect's status means to the saga.
STEP_WAITING = frozenset(
    {S.PREPARED, S.AWAITING_APPROVAL, S.DISPATCHING, S.IN_PROGRESS, S.NOT_STARTED}
)
STEP_FAILED = frozenset({S.REJECTED, S.EXPIRED, S.CANCELLED})
# It happened at the provider (whatever was done about it since).
STEP_HAPPENED = frozenset({S.CONFIRMED, S.COMPENSATING, S.COMPENSATED, S.COMPENSATION_FAILED})
# Sent, outcome not known yet: a cancel must wait for the reconciler.
STEP_IN_FLIGHT = frozenset({S.DISPATCHING, S.IN_PROGRESS})
