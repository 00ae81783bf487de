"""The orchestrator: ``saga_advance`` reads the run's step records and their effects and does
the one next thing (issue the next step, pause, fail, start compensating, finish); the
sweeper re-advances runs that went quiet."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from gateway.errors import GatewayError, ValidationProblem
from gateway.models import Effect
from gateway.services import command_submit
from sagas.choices import ACTIVE, FORWARD, STEP_WAITING, FailureAction, Trigger
from sagas.definitions import Step, StepContext
from sagas.models import SagaRun, SagaStep
from sagas.services.compensation import _compensate
from sagas.services.core import (
    ORCHESTRATOR,
    R,
    S,
    _event,
    _freeze,
    _lock,
    _Progress,
    _quiet_after,
    _set_state,
    _touch,
    step_key,
)


def saga_advance(*, saga_id: str, actor: str = ORCHESTRATOR) -> bool:
    """Do the one next thing a run needs, given its effects' statuses. False when there was
    nothing to do: the run is frozen, passive, waiting, or gone.

    Safe under duplicate delivery and concurrent orchestrators: the run's lock serialises
    them, and each decides from what the one before it committed.
    """
    with transaction.atomic():
        run = _lock(saga_id)
        if run is None or run.frozen or run.state not in ACTIVE:
            return False
        return _advance(run, actor=actor)


def _advance(run: SagaRun, *, actor: str) -> bool:
    progress = _Progress.load(run)
    froze = _freeze_on_mismatch(run, progress, actor=actor)
    # A run frozen just now still records where it stands (paused, failing), but issues nothing.
    if run.state in FORWARD:
        return _forward(run, progress, actor=actor) or froze
    return _compensate(run, progress, actor=actor) or froze


def _freeze_on_mismatch(run: SagaRun, progress: _Progress, *, actor: str) -> bool:
    """A step effect (or its compensation) disagrees with its command: freeze the run, once
    per effect, so that an operator's unfreeze after looking is not undone by the same one."""
    froze = False
    for record in progress.records:
        for effect in (record.effect, record.compensation_effect):
            if effect is None or not effect.mismatch or effect.pk in run.mismatches:
                continue
            _freeze(
                run,
                actor=actor,
                reason=(
                    f"effect {effect.pk} of step {record.name} disagrees with its command "
                    "(mismatch): nothing more is sent until an operator has looked"
                ),
                mismatch_effect_id=effect.pk,
            )
            froze = True
    return froze


def _forward(run: SagaRun, progress: _Progress, *, actor: str) -> bool:
    for index, step in enumerate(progress.definition.steps):
        record = progress.latest(step.name)
        if record is None:
            return _issue(run, progress, step, index=index, revision=1, actor=actor)
        effect = record.effect
        if effect is None:
            # Refused before a command existed; the failure was acted on when it was refused.
            return _fail(run, progress, step, record, actor=actor)
        if effect.status == S.CONFIRMED:
            continue
        if effect.status in STEP_WAITING:
            if run.state == R.PAUSED_UNKNOWN:
                _set_state(
                    run,
                    to=R.RUNNING,
                    actor=actor,
                    step=step.name,
                    reason=f"{step.name}: {effect.pk} is {effect.status} now",
                    current_step=step.name,
                )
                return True
            _touch(run, current_step=step.name)
            return False
        if effect.status == S.UNKNOWN:
            if run.state == R.PAUSED_UNKNOWN:
                _touch(run)
                return False
            _set_state(
                run,
                to=R.PAUSED_UNKNOWN,
                actor=actor,
                step=step.name,
                reason=(
                    f"{step.name}: the outcome of {effect.pk} is unknown; nothing goes on "
                    "until the reconciler has asked the provider"
                ),
                data={"effect_id": effect.pk},
                current_step=step.name,
            )
            return True
        trigger, reason = _failure_of(effect)
        _record_failure(record, trigger, reason)
        return _fail(run, progress, step, record, actor=actor)
    _set_state(
        run,
        to=R.COMPLETED,
        actor=actor,
        reason="every step is confirmed",
        current_step="",
    )
    return True


def _failure_of(effect: Effect) -> tuple[str, str]:
    """The trigger a step effect's end names, and the ledger's reason for it."""
    last = effect.events.filter(to_status=effect.status).order_by("-id").first()
    why = f"{effect.pk} is {effect.status}" + (f": {last.reason}" if last and last.reason else "")
    if effect.status == S.EXPIRED:
        return Trigger.EXPIRED, why
    if effect.status == S.CANCELLED:
        return Trigger.CANCELLED, why
    if effect.status == S.REJECTED:
        attempt = effect.attempts.order_by("-number").first()
        if attempt is not None and attempt.http_status == 409:
            return Trigger.PRECONDITION_FAILED, f"{why} (the expected version is stale)"
        return Trigger.REJECTED, why
    return Trigger.ABANDONED, f"{why}: it was undone outside the saga"


def _record_failure(record: SagaStep, trigger: str, reason: str) -> None:
    record.failure_trigger, record.failure_reason = trigger, reason[:4000]
    record.updated_at = timezone.now()
    record.save(update_fields=["failure_trigger", "failure_reason", "updated_at"])


def _issue(
    run: SagaRun,
    progress: _Progress,
    step: Step,
    *,
    index: int,
    revision: int,
    actor: str,
) -> bool:
    """Issue one revision of a step: its record and its command, in the caller's transaction.
    Nothing is issued for a frozen run (frozen by a mismatch found in this same advance)."""
    if run.frozen:
        _touch(run, current_step=step.name)
        return False
    now = timezone.now()
    key = step_key(run.pk, step.name, revision)
    context = progress.context()
    # The unique index (run, name, revision) makes a second issue of this revision fail
    # here, whatever happened to the lock.
    record = SagaStep.objects.create(
        tenant_id=run.tenant_id,
        run=run,
        name=step.name,
        index=index,
        revision=revision,
        idempotency_key=key,
        created_at=now,
        updated_at=now,
    )
    progress.records.append(record)
    unmet = step.precondition.unmet(context) if step.precondition else None
    if unmet is not None:
        return _refused(run, progress, step, record, Trigger.PRECONDITION_FAILED, unmet, actor)
    effect = _submit_step(run, step, context, key=key, revision=revision)
    if isinstance(effect, str):  # the gateway refused it: why
        return _refused(run, progress, step, record, Trigger.REFUSED, effect, actor)
    if effect.command.saga_id != run.pk:
        return _refused(
            run,
            progress,
            step,
            record,
            Trigger.REFUSED,
            f"the key {key} names command {effect.pk}, which is not this saga's",
            actor,
        )
    record.effect = effect
    record.save(update_fields=["effect"])
    _event(
        run,
        kind="step_issued",
        actor=actor,
        step=step.name,
        reason=f"{step.name} r{revision}: {step.effect_type} as {effect.pk} ({effect.status})",
        data={"effect_id": effect.pk, "revision": revision, "idempotency_key": key},
        now=now,
    )
    if run.state != R.RUNNING:
        _set_state(
            run,
            to=R.RUNNING,
            actor=actor,
            step=step.name,
            reason=f"{step.name} issued",
            current_step=step.name,
        )
    else:
        _touch(run, current_step=step.name)
    return True


def _submit_step(
    run: SagaRun, step: Step, context: StepContext, *, key: str, revision: int
) -> Effect | str:
    """Submit the step's command under the run's requester; the effect, or why the gateway
    refused it."""
    resource, payload = step.build(context)
    try:
        submission = command_submit(
            principal=run.requested_by,
            idempotency_key=key,
            type=step.effect_type,
            resource=resource,
            payload=payload,
            intent={
                "summary": f"{run.definition} {run.pk}, step {step.name}: {step.description}",
                "task_id": run.pk,
                "plan_revision": revision,
            },
            context={"saga_id": run.pk, "saga_step": step.name, "definition": run.definition},
            expires_in=step.expires_in,
            saga_id=run.pk,
            saga_step=step.name,
        )
    except GatewayError as exc:
        detail = exc.detail
        if isinstance(exc, ValidationProblem):
            detail = f"{detail} {exc.errors}"
        return detail
    return submission.effect


def _refused(
    run: SagaRun,
    progress: _Progress,
    step: Step,
    record: SagaStep,
    trigger: str,
    reason: str,
    actor: str,
) -> bool:
    """The step was not issued (a precondition, the gateway's refusal): a failure of it."""
    _record_failure(record, trigger, reason)
    _event(
        run,
        kind="step_refused",
        actor=actor,
        step=step.name,
        reason=reason,
        data={"revision": record.revision, "trigger": trigger},
    )
    return _fail(run, progress, step, record, actor=actor)


def _fail(run: SagaRun, progress: _Progress, step: Step, record: SagaStep, *, actor: str) -> bool:
    """Apply the step's failure policy to its failure: pause, or compensate what was done."""
    trigger = record.failure_trigger or Trigger.REJECTED
    reason = record.failure_reason or f"{step.name} failed"
    failure: dict[str, Any] = {
        "failure_step": step.name,
        "failure_trigger": trigger,
        "failure_reason": reason[:4000],
    }
    data = {"trigger": trigger, "revision": record.revision}
    if step.on_failure.action(trigger) == FailureAction.PAUSE:
        _set_state(
            run,
            to=R.PAUSED_FAILED,
            actor=actor,
            step=step.name,
            reason=f"{step.name} failed ({trigger}): {reason}; waiting for an operator to "
            "resume or cancel",
            data=data,
            current_step=step.name,
            **failure,
        )
        return True
    _set_state(
        run,
        to=R.COMPENSATING,
        actor=actor,
        step=step.name,
        reason=f"{step.name} failed ({trigger}): {reason}; compensating the confirmed steps",
        data=data,
        **failure,
    )
    _compensate(run, progress, actor=actor)
    return True


def saga_sweep(*, limit: int = 200) -> int:
    """Re-advance active, unfrozen runs that went quiet (a lost message, a crashed worker).
    Returns how many were enqueued."""
    from sagas.tasks import advance_saga

    now = timezone.now()
    due = list(
        SagaRun.objects.filter(state__in=sorted(ACTIVE), frozen=False, next_check_at__lte=now)
        .order_by("next_check_at")
        .values_list("pk", "next_check_at")[:limit]
    )
    later = now + _quiet_after()
    sent = 0
    for saga_id, was_due in due:
        # Compare-and-set on the due time against a second sweeper (two beat processes): only
        # one enqueues; even two messages would advance the run once (its lock).
        if SagaRun.objects.filter(pk=saga_id, next_check_at=was_due).update(next_check_at=later):
            advance_saga.delay(saga_id)
            sent += 1
    return sent
