"""People's actions on a run: resume, cancel (with or without compensation), freeze,
unfreeze, and closing an owner's task."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from django.db import transaction
from django.utils import timezone

from gateway import ledger
from gateway.choices import BEFORE_DISPATCH, DISPATCHABLE
from gateway.errors import InvalidTransition, NotFound
from gateway.models import Effect, Principal
from sagas.choices import (
    ABANDONABLE,
    CANCELLABLE,
    RESUMABLE,
    STEP_FAILED,
    TaskKind,
    TaskState,
    Trigger,
)
from sagas.models import SagaRun, SagaTask
from sagas.selectors import saga_inventory
from sagas.services.compensation import _compensate
from sagas.services.core import (
    R,
    S,
    _cancel_unsent,
    _event,
    _freeze,
    _lock,
    _Progress,
    _require_operator,
    _set_state,
)
from sagas.services.orchestrator import _advance, _issue


def saga_resume(*, run: SagaRun, principal: Principal, reason: str = "") -> SagaRun:
    """Continue from the first step that is not confirmed, never re-sending a confirmed one:
    a failed step is re-issued as a new revision, under a new key (and a new approval)."""
    _require_operator(principal, "resume sagas")
    with transaction.atomic():
        locked = _lock(run.pk)
        assert locked is not None
        run = locked
        if run.frozen:
            raise InvalidTransition(
                f"Saga {run.pk} is frozen ({run.frozen_reason or 'by an operator'}): "
                "unfreeze it first."
            )
        if run.state not in RESUMABLE:
            raise InvalidTransition(f"Saga {run.pk} is {run.state}: it cannot be resumed.")
        progress = _Progress.load(run)
        # The first step that is not confirmed (None: all are; the advance completes the run).
        index, step, record = len(progress.definition.steps), None, None
        for position, candidate in enumerate(progress.definition.steps):
            latest = progress.latest(candidate.name)
            if latest is None or latest.effect is None or latest.effect.status != S.CONFIRMED:
                index, step, record = position, candidate, latest
                break
        name = step.name if step else ""
        _event(
            run,
            kind="resumed",
            actor=principal.label,
            principal=principal,
            step=name,
            reason=reason or f"resumed from {name or 'the end'}",
        )
        if run.state in (R.PAUSED_FAILED, R.FAILED):
            _set_state(
                run,
                to=R.RUNNING,
                actor=principal.label,
                principal=principal,
                step=name,
                reason=f"resumed from {name}" + (f": {reason}" if reason else ""),
                failure_step="",
                failure_trigger="",
                failure_reason="",
            )
        failed = record is not None and (
            record.effect is None or record.effect.status in STEP_FAILED
        )
        if step is not None and record is not None and failed:
            revision = record.revision + 1
            _issue(run, progress, step, index=index, revision=revision, actor=principal.label)
        else:
            _advance(run, actor=principal.label)
    return run


@dataclass(frozen=True)
class CancelResult:
    run: SagaRun
    outcome: str
    inventory: dict[str, list[dict[str, Any]]]
    compensating: bool


def saga_cancel(
    *, run: SagaRun, principal: Principal, compensate: bool = False, reason: str = ""
) -> CancelResult:
    """Stop future steps, cancel the step effects not yet sent, and say what is left:
    ``cancelled_with_effects`` (steps happened), ``cancelled_pending_reconciliation`` (some
    effect is in flight or unknown), or ``cancelled``. With ``compensate`` the business goal
    is abandoned: the confirmed steps are compensated too (also after completion)."""
    if run.requested_by_id != principal.pk:
        _require_operator(principal, "cancel another principal's saga")
    with transaction.atomic():
        locked = _lock(run.pk)
        assert locked is not None
        run = locked
        replay = (run.state == R.CANCELLED and not compensate) or (
            run.state == R.COMPENSATING and run.failure_trigger == Trigger.ABANDONED and compensate
        )
        allowed = ABANDONABLE if compensate else CANCELLABLE
        if not replay and run.state not in allowed:
            hint = " (cancel with compensate to undo it)" if run.state == R.COMPLETED else ""
            raise InvalidTransition(f"Saga {run.pk} is {run.state}: nothing to cancel{hint}.")
        progress = _Progress.load(run)
        why = reason or ("the business goal was abandoned" if compensate else "cancelled")
        if not replay:
            for record in progress.records:
                if record.effect is not None and record.effect.status in BEFORE_DISPATCH:
                    _cancel_unsent(run, record, principal=principal, reason=f"cancelled: {why}")
            if compensate:
                _set_state(
                    run,
                    to=R.COMPENSATING,
                    actor=principal.label,
                    principal=principal,
                    kind="cancelled",
                    reason=f"cancelled with compensation: {why}",
                    failure_step=run.current_step,
                    failure_trigger=Trigger.ABANDONED,
                    failure_reason=why[:4000],
                )
                _compensate(run, progress, actor=principal.label)
            else:
                _set_state(
                    run,
                    to=R.CANCELLED,
                    actor=principal.label,
                    principal=principal,
                    kind="cancelled",
                    reason=why,
                )
        inventory = saga_inventory(progress.records)
    if inventory["in_flight"] or inventory["unknown"]:
        outcome = "cancelled_pending_reconciliation"
    elif inventory["confirmed"]:
        outcome = "cancelled_with_effects"
    else:
        outcome = "cancelled"
    return CancelResult(run, outcome, inventory, compensating=compensate)


def saga_freeze(
    *,
    saga_id: str,
    actor: str,
    reason: str,
    principal: Principal | None = None,
    mismatch_effect_id: str = "",
) -> bool:
    """Freeze a run: the orchestrator issues nothing and the dispatcher sends none of its
    effects (``saga_blocks_dispatch``). True when this call froze it.

    Called by an operator (``principal``), by the orchestrator, and by the reconciler's
    mismatch hook (``mismatch_effect_id``): a mismatch freezes a run once per effect, so the
    hook may call this on every lookup without undoing an operator's unfreeze. Safe inside the
    caller's transaction (the reconciler's), which it joins.
    """
    if principal is not None:
        _require_operator(principal, "freeze sagas")
    with transaction.atomic():
        run = _lock(saga_id)
        if run is None or (principal is not None and run.tenant_id != principal.tenant_id):
            if principal is not None:
                raise NotFound(f"No saga {saga_id}.")
            return False
        if mismatch_effect_id and mismatch_effect_id in run.mismatches:
            return False
        was_frozen = run.frozen
        _freeze(
            run,
            actor=actor,
            reason=reason,
            principal=principal,
            mismatch_effect_id=mismatch_effect_id,
        )
        return not was_frozen


def saga_unfreeze(*, run: SagaRun, principal: Principal, reason: str = "") -> SagaRun:
    """Let a frozen run go on: it is advanced, and its step effects waiting to be sent are
    handed to the dispatcher again, after commit."""
    _require_operator(principal, "unfreeze sagas")
    from sagas.tasks import advance_saga

    with transaction.atomic():
        locked = _lock(run.pk)
        assert locked is not None
        run = locked
        if not run.frozen:
            return run
        if run.state == R.COMPENSATION_FAILED:
            raise InvalidTransition(
                f"Saga {run.pk} stays frozen: a compensation failed, and its owner settles "
                "what is left by hand (see its tasks)."
            )
        SagaRun.objects.filter(pk=run.pk).update(
            frozen=False, frozen_reason="", updated_at=timezone.now()
        )
        run.frozen, run.frozen_reason = False, ""
        _event(run, kind="unfrozen", actor=principal.label, principal=principal, reason=reason)
        waiting = Effect.objects.filter(
            command__saga_id=run.pk, status__in=DISPATCHABLE, frozen=False
        ).values_list("pk", flat=True)
        # After commit: a worker must see the run unfrozen before it claims.
        for effect_id in waiting:
            ledger.enqueue_dispatch(effect_id)
        transaction.on_commit(partial(advance_saga.delay, run.pk))
    return run


def saga_task_close(*, task: SagaTask, principal: Principal, note: str = "") -> SagaTask:
    """An owner's task is done. When the last manual compensation of a run is, the run is
    COMPENSATED."""
    _require_operator(principal, "close saga tasks")
    with transaction.atomic():
        run = _lock(task.run_id)
        assert run is not None
        now = timezone.now()
        # Compare-and-set on the task's state: two operators closing it at once.
        changed = SagaTask.objects.filter(pk=task.pk, state=TaskState.OPEN).update(
            state=TaskState.DONE, done_by=principal, done_at=now, note=note[:4000]
        )
        task.refresh_from_db()
        if not changed:
            raise InvalidTransition(f"Task {task.pk} is already {task.state}.")
        _event(
            run,
            kind="task_done",
            actor=principal.label,
            principal=principal,
            step=task.step.name,
            reason=note or f"{task.kind} done",
            data={"task_id": task.pk},
            now=now,
        )
        if (
            run.state == R.MANUAL_COMPENSATION
            and not SagaTask.objects.filter(
                run=run, kind=TaskKind.MANUAL_COMPENSATION, state=TaskState.OPEN
            ).exists()
        ):
            _set_state(
                run,
                to=R.COMPENSATED,
                actor=principal.label,
                principal=principal,
                reason="the owners closed the last manual compensation",
            )
    return task
