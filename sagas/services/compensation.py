"""Compensation: each confirmed step undone, newest first, by a new command (or a task for
its owner); a failed compensation freezes the run for a human."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from gateway.choices import BEFORE_DISPATCH
from gateway.errors import GatewayError
from gateway.models import Effect, Receipt
from gateway.services import effect_compensate
from sagas.choices import (
    STEP_FAILED,
    STEP_IN_FLIGHT,
    StepCompensation,
    TaskKind,
    TaskState,
    Trigger,
)
from sagas.definitions import Step
from sagas.models import SagaRun, SagaStep, SagaTask
from sagas.selectors import latest_receipts
from sagas.services.core import R, S, _cancel_unsent, _event, _Progress, _set_state, _touch, logger


@dataclass(frozen=True)
class CompensationDecision:
    action: str  # a StepCompensation value: NOT_NEEDED, ISSUED (automatic) or MANUAL
    reason: str


def compensation_decision(
    step: Step, effect: Effect, receipt: Receipt | None, *, now: datetime
) -> CompensationDecision:
    """How a confirmed step is undone, from its contract and its receipt: automatically, by
    its owner (a manual task), or not at all (nothing to undo)."""
    spec = step.compensation
    contract = step.contract
    if not spec.needed:
        return CompensationDecision(
            StepCompensation.NOT_NEEDED, f"{effect.type} leaves nothing to undo"
        )
    if spec.irreversible:
        return CompensationDecision(
            StepCompensation.MANUAL,
            f"{effect.type} is irreversible: {spec.owner} decides whether to follow it up "
            f"({spec.compensator or 'no compensator'}); it is never compensated automatically",
        )
    if not spec.automatic or not spec.compensator or contract.compensation is None:
        return CompensationDecision(
            StepCompensation.MANUAL, f"{effect.type} is compensated only by a human decision"
        )
    if spec.window and effect.confirmed_at and now > effect.confirmed_at + spec.window:
        ended = (effect.confirmed_at + spec.window).isoformat()
        return CompensationDecision(
            StepCompensation.MANUAL, f"its compensation window ended at {ended}"
        )
    if spec.irreversible_boundary and receipt is not None:
        reached = {receipt.provider_status, str(receipt.result.get("state", ""))}
        if spec.irreversible_boundary in reached:
            return CompensationDecision(
                StepCompensation.MANUAL,
                f"the provider reports {spec.irreversible_boundary}, its irreversible boundary",
            )
    return CompensationDecision(StepCompensation.ISSUED, f"{spec.compensator}, automatically")


def _compensate(run: SagaRun, progress: _Progress, *, actor: str) -> bool:
    """Undo the confirmed steps newest first, one at a time: issue the next compensation and
    wait for it to settle (its status change advances the run again)."""
    now = timezone.now()
    steps = progress.definition.steps
    for index in reversed(range(len(steps))):
        step = steps[index]
        record = progress.latest(step.name)
        if record is None or record.effect is None:
            continue
        effect = record.effect
        if effect.status in BEFORE_DISPATCH:
            # Never sent: make sure it never is, so that it needs no undoing.
            _cancel_unsent(run, record, principal=run.requested_by, reason="the saga compensates")
        if effect.status in STEP_IN_FLIGHT or effect.status == S.UNKNOWN:
            # Sent, outcome not known: it may yet need undoing. Its settling advances us.
            _touch(run, current_step=step.name)
            return False
        if effect.status in STEP_FAILED or effect.status == S.COMPENSATED:
            continue
        if effect.status == S.COMPENSATING:
            _touch(run, current_step=step.name)
            return False
        if effect.status == S.COMPENSATION_FAILED:
            return _compensation_failed(run, progress, step, record, actor=actor)
        # CONFIRMED
        if record.compensation in (StepCompensation.NOT_NEEDED, StepCompensation.MANUAL):
            continue
        receipt = latest_receipts([effect.pk]).get(effect.pk)
        decision = compensation_decision(step, effect, receipt, now=now)
        if decision.action == StepCompensation.NOT_NEEDED:
            _record_compensation(run, step, record, decision.action, decision.reason, actor)
            continue
        if decision.action == StepCompensation.MANUAL:
            _manual_task(run, step, record, decision.reason, actor=actor)
            continue
        if run.frozen:
            _touch(run, current_step=step.name)
            return False
        try:
            submission = effect_compensate(
                effect=effect,
                principal=run.requested_by,
                reason=f"saga {run.pk} ({run.definition}): {run.failure_reason}"[:2000],
                automatic=True,
            )
        except GatewayError as exc:
            _manual_task(
                run,
                step,
                record,
                f"the automatic compensation was refused: {exc.detail}",
                actor=actor,
            )
            continue
        record.compensation_effect = submission.effect
        _record_compensation(
            run,
            step,
            record,
            StepCompensation.ISSUED,
            f"{submission.effect.type} issued as {submission.effect.pk} "
            f"({submission.effect.status})",
            actor,
            data={"compensation_effect_id": submission.effect.pk},
        )
        _touch(run, current_step=step.name)
        return True
    return _finish_compensation(run, progress, actor=actor)


def _record_compensation(
    run: SagaRun,
    step: Step,
    record: SagaStep,
    action: str,
    note: str,
    actor: str,
    data: dict[str, Any] | None = None,
) -> None:
    record.compensation, record.compensation_note = action, note[:4000]
    record.updated_at = timezone.now()
    record.save(
        update_fields=["compensation", "compensation_note", "compensation_effect", "updated_at"]
    )
    _event(
        run,
        kind=f"compensation_{action}",
        actor=actor,
        step=step.name,
        reason=f"{step.name}: {note}",
        data={"effect_id": record.effect_id, **(data or {})},
    )


def _manual_task(run: SagaRun, step: Step, record: SagaStep, reason: str, *, actor: str) -> None:
    """Hand the undoing of one confirmed step to its owner."""
    task = _task(
        run,
        record,
        kind=TaskKind.MANUAL_COMPENSATION,
        owner=step.compensation.owner,
        reason=f"Undo {step.name} ({record.effect_id}) by hand: {reason}",
    )
    _record_compensation(
        run,
        step,
        record,
        StepCompensation.MANUAL,
        f"manual task {task.pk} for {task.owner}: {reason}",
        actor,
        data={"task_id": task.pk, "owner": task.owner},
    )
    logger.warning(
        "saga manual compensation",
        extra={
            "saga_id": run.pk,
            "step": step.name,
            "effect_id": record.effect_id,
            "owner": task.owner,
            "task_id": task.pk,
        },
    )


def _task(run: SagaRun, record: SagaStep, *, kind: str, owner: str, reason: str) -> SagaTask:
    existing = SagaTask.objects.filter(step=record, kind=kind).first()
    if existing is not None:
        return existing
    try:
        # A savepoint: the unique (step, kind) index is the backstop against a second task.
        with transaction.atomic():
            return SagaTask.objects.create(
                tenant_id=run.tenant_id,
                run=run,
                step=record,
                effect_id=record.effect_id,
                kind=kind,
                owner=owner,
                reason=reason[:4000],
                created_at=timezone.now(),
            )
    except IntegrityError:
        return SagaTask.objects.get(step=record, kind=kind)


def _compensation_failed(
    run: SagaRun, progress: _Progress, step: Step, record: SagaStep, *, actor: str
) -> bool:
    """Terminal and visible: freeze the run, page the owner, undo nothing more."""
    effect = record.effect
    assert effect is not None
    left = [
        f"{r.name} ({r.effect_id})"
        for r in progress.records
        if r.effect is not None and r.effect.status == S.CONFIRMED
    ]
    reason = (
        f"the compensation of {step.name} ({effect.pk}, by {effect.compensated_by_id}) failed; "
        "nothing more is undone automatically"
        + (f"; still confirmed: {', '.join(left)}" if left else "")
    )
    owner = step.compensation.owner
    task = _task(run, record, kind=TaskKind.PAGE, owner=owner, reason=reason)
    _set_state(
        run,
        to=R.COMPENSATION_FAILED,
        actor=actor,
        step=step.name,
        reason=reason,
        data={"effect_id": effect.pk, "task_id": task.pk, "owner": owner},
        frozen=True,
        frozen_reason=reason[:4000],
    )
    _event(run, kind="frozen", actor=actor, step=step.name, reason=reason)
    _event(
        run,
        kind="owner_paged",
        actor=actor,
        step=step.name,
        reason=f"{owner} paged: {reason}",
        data={"task_id": task.pk, "owner": owner},
    )
    logger.error(
        "saga compensation failed",
        extra={
            "saga_id": run.pk,
            "definition": run.definition,
            "step": step.name,
            "effect_id": effect.pk,
            "compensation_effect_id": effect.compensated_by_id,
            "owner": owner,
            "task_id": task.pk,
            "page": True,
        },
    )
    return True


def _finish_compensation(run: SagaRun, progress: _Progress, *, actor: str) -> bool:
    handled = [
        r
        for r in progress.records
        if r.compensation in (StepCompensation.ISSUED, StepCompensation.MANUAL)
    ]
    open_tasks = SagaTask.objects.filter(
        run=run, kind=TaskKind.MANUAL_COMPENSATION, state=TaskState.OPEN
    ).count()
    if open_tasks:
        to, reason = R.MANUAL_COMPENSATION, f"{open_tasks} step(s) left to their owners"
    elif handled:
        to, reason = R.COMPENSATED, "every confirmed step that needed undoing is compensated"
    elif run.failure_trigger == Trigger.ABANDONED:
        to, reason = R.CANCELLED, "nothing was done that needed undoing"
    else:
        to, reason = R.FAILED, "nothing was done that needed undoing"
    _set_state(run, to=to, actor=actor, reason=reason, current_step="")
    return True
