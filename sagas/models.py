"""Saga runs, their step records, the tasks they hand to people, and their history.

A *run* is one execution of a definition (sagas.definitions), with its inputs frozen at start.
A *step record* is one issue of one step: the command it submitted through the ledger, and
what was decided about undoing it. Re-issuing a failed step (resume) makes a new revision, so
a step's history is never rewritten. Every change of a run's state appends an *event* in the
same transaction. The effects themselves live in the ledger (gateway.models); a run only
points at them.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from gateway.lib.ids import new_id
from gateway.models import Effect, Principal, Tenant
from sagas.choices import (
    ACTIVE,
    SagaState,
    StepCompensation,
    TaskKind,
    TaskState,
    Trigger,
)


def new_saga_id() -> str:
    return new_id("sag")


def new_task_id() -> str:
    return new_id("stk")


class SagaRun(models.Model):
    """One execution of a saga definition: its frozen inputs and where it stands."""

    id = models.CharField(max_length=32, primary_key=True, default=new_saga_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="saga_runs")
    definition = models.CharField(max_length=100)
    idempotency_key = models.CharField(max_length=255)
    # sha256 of the canonical {"definition", "inputs"}: a replayed key must carry the same.
    inputs_digest = models.CharField(max_length=71)
    # Inputs may hold personal data (an address, an email): sealed at rest, redacted in clear.
    inputs_sealed = models.TextField()
    inputs_redacted = models.JSONField()
    requested_by = models.ForeignKey(Principal, on_delete=models.PROTECT, related_name="+")
    state = models.CharField(max_length=24, choices=SagaState.choices)
    state_changed_at = models.DateTimeField()
    frozen = models.BooleanField(default=False)
    frozen_reason = models.TextField(blank=True)
    # Effects found disagreeing with their command; each freezes the run once, so that an
    # operator's unfreeze is not undone by the same mismatch.
    mismatches = models.JSONField(default=list, blank=True)
    # The step the run is at (forward) or undoing (backward), for lists and the console.
    current_step = models.CharField(max_length=100, blank=True)
    # What sent the run backward (or paused it): the step, the trigger and the reason.
    failure_step = models.CharField(max_length=100, blank=True)
    failure_trigger = models.CharField(max_length=24, choices=Trigger.choices, blank=True)
    failure_reason = models.TextField(blank=True)
    # When the sweeper re-advances this run if no effect has moved it; None when passive.
    next_check_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            # Concurrent starts with one key race on this index, not on a prior SELECT.
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"], name="saga_unique_key_per_tenant"
            ),
            models.CheckConstraint(
                condition=Q(state__in=SagaState.values), name="saga_state_valid"
            ),
        ]
        indexes = [
            # GET /sagas?state=…&definition=…: newest first within a tenant (ids sort by time).
            models.Index(fields=["tenant", "-id"], name="saga_tenant_newest"),
            models.Index(fields=["tenant", "state", "-id"], name="saga_tenant_state"),
            models.Index(fields=["tenant", "definition", "-id"], name="saga_tenant_definition"),
            # The sweeper: active, unfrozen runs that went quiet.
            models.Index(
                fields=["next_check_at"],
                name="saga_sweep_due",
                condition=Q(state__in=sorted(ACTIVE), frozen=False),
            ),
            # The console's triage: frozen runs.
            models.Index(
                fields=["tenant", "updated_at"], name="saga_frozen", condition=Q(frozen=True)
            ),
        ]

    def __str__(self) -> str:
        return f"{self.pk} {self.definition} {self.state}"


class SagaStep(models.Model):
    """One issue (revision) of one step of a run, and what was decided about undoing it."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    run = models.ForeignKey(SagaRun, on_delete=models.PROTECT, related_name="steps")
    name = models.CharField(max_length=100)
    index = models.PositiveSmallIntegerField()
    revision = models.PositiveSmallIntegerField()
    idempotency_key = models.CharField(max_length=255)
    # None when the step was refused before any command existed (precondition, permission).
    effect = models.OneToOneField(
        Effect, null=True, blank=True, on_delete=models.PROTECT, related_name="saga_step"
    )
    failure_trigger = models.CharField(max_length=24, choices=Trigger.choices, blank=True)
    failure_reason = models.TextField(blank=True)
    compensation = models.CharField(
        max_length=16, choices=StepCompensation.choices, blank=True, default=StepCompensation.NONE
    )
    compensation_effect = models.ForeignKey(
        Effect, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    compensation_note = models.TextField(blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            # Two orchestrators (or a redelivered message) issuing the same step collide here;
            # the run's row lock means they should never get this far, the index means they
            # cannot.
            models.UniqueConstraint(
                fields=["run", "name", "revision"], name="saga_step_unique_revision"
            ),
            models.CheckConstraint(condition=Q(revision__gte=1), name="saga_step_revision_valid"),
        ]
        indexes = [models.Index(fields=["run", "index", "revision"], name="saga_step_order")]

    def __str__(self) -> str:
        return f"{self.run_id} {self.name} r{self.revision}"


class SagaTask(models.Model):
    """Work handed to a step's owning team: a manual compensation, or a page."""

    id = models.CharField(max_length=32, primary_key=True, default=new_task_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    run = models.ForeignKey(SagaRun, on_delete=models.PROTECT, related_name="tasks")
    step = models.ForeignKey(SagaStep, on_delete=models.PROTECT, related_name="tasks")
    effect = models.ForeignKey(
        Effect, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    kind = models.CharField(max_length=24, choices=TaskKind.choices)
    # The contract's owning team.
    owner = models.CharField(max_length=100)
    reason = models.TextField()
    state = models.CharField(max_length=8, choices=TaskState.choices, default=TaskState.OPEN)
    created_at = models.DateTimeField()
    done_by = models.ForeignKey(
        Principal, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    done_at = models.DateTimeField(null=True, blank=True)
    note = models.TextField(blank=True)

    class Meta:
        constraints = [
            # One manual task / one page per step, however many times the run is advanced.
            models.UniqueConstraint(fields=["step", "kind"], name="saga_task_one_per_step"),
            models.CheckConstraint(
                condition=Q(kind__in=TaskKind.values), name="saga_task_kind_valid"
            ),
            models.CheckConstraint(
                condition=Q(state=TaskState.OPEN) | Q(done_at__isnull=False),
                name="saga_task_done_has_time",
            ),
        ]
        indexes = [
            # The owners' queue: a tenant's open tasks, oldest first.
            models.Index(
                fields=["tenant", "created_at"],
                name="saga_task_open",
                condition=Q(state=TaskState.OPEN),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.pk} {self.kind} {self.owner} {self.state}"


class SagaEvent(models.Model):
    """An append-only line of a run's history: who or what, when, from, to, why."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    run = models.ForeignKey(SagaRun, on_delete=models.PROTECT, related_name="events")
    kind = models.CharField(max_length=40)
    from_state = models.CharField(max_length=24, blank=True)
    to_state = models.CharField(max_length=24, blank=True)
    step = models.CharField(max_length=100, blank=True)
    actor = models.CharField(max_length=200)
    principal = models.ForeignKey(
        Principal, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    reason = models.TextField(blank=True)
    # Evidence only (ids, statuses, triggers); never the inputs.
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["run", "id"], name="saga_event_run")]

    def __str__(self) -> str:
        return f"{self.run_id} {self.kind} {self.from_state}->{self.to_state}"
