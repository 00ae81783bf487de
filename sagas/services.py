"""Every write of the sagas app: start, advance (the orchestrator), resume, cancel, freeze,
and the owners' tasks. One function per transition, each appending its saga event in the same
transaction (STYLE 4–8).

The orchestrator (``saga_advance``) is a function of what the ledger says: it reads the run's
step records and their effects' statuses and does the one next thing — issue the next step,
pause, start compensating, compensate the next step, or finish. It is told to look after every
status change of any of the run's effects (``gateway.services._after_transition`` enqueues
``advance_saga`` on commit), and the sweeper re-advances runs that went quiet, so a lost
message delays a run but never strands it.

Concurrency: every write here takes the tenant's audit-chain head first, then the run's row
(``_lock``): the ledger's lock order (gateway.audit: chain head, then rows), so a saga write
and a ledger transition never wait for each other in opposite orders. Two orchestrators (a
redelivered message, the sweeper's copy, two workers) therefore run one after the other; the
second sees what the first issued. The unique index on (run, step, revision) is the backstop:
a step is never issued twice even if that lock were lost.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from gateway import audit
from gateway.choices import BEFORE_DISPATCH, DISPATCHABLE, EffectStatus
from gateway.errors import (
    GatewayError,
    IdempotencyKeyMismatch,
    InvalidTransition,
    NotFound,
    NotPermitted,
    ValidationProblem,
)
from gateway.lib.digest import sha256_digest
from gateway.lib.vault import seal_json
from gateway.models import Effect, Principal, Receipt
from gateway.services import (
    MAX_KEY_LENGTH,
    OPERATOR_ROLES,
    REDACTED,
    SUBMITTER_ROLES,
    command_submit,
    effect_cancel,
    effect_compensate,
)
from gateway.webhooks.services import saga_outbox_record
from sagas.choices import (
    ABANDONABLE,
    ACTIVE,
    ALLOWED_TRANSITIONS,
    CANCELLABLE,
    FORWARD,
    RESUMABLE,
    STEP_FAILED,
    STEP_IN_FLIGHT,
    STEP_WAITING,
    FailureAction,
    SagaState,
    StepCompensation,
    TaskKind,
    TaskState,
    Trigger,
)
from sagas.definitions import (
    SagaDefinition,
    Step,
    StepContext,
    StepReceipt,
    get_definition,
)
from sagas.models import SagaEvent, SagaRun, SagaStep, SagaTask
from sagas.selectors import latest_receipts, saga_inputs, saga_inventory, step_records

logger = logging.getLogger(__name__)

S = EffectStatus
R = SagaState
ORCHESTRATOR = "saga-orchestrator"
SWEEPER = "saga-sweeper"
# How long an active run may go without news before the sweeper advances it again.
DEFAULT_QUIET_AFTER = 60.0


def step_key(saga_id: str, step: str, revision: int) -> str:
    """The idempotency key of one issue of one step: a retry of the orchestrator replays the
    same command; a resume re-issues a failed step under a new key (a new revision)."""
    return f"saga:{saga_id}:{step}:r{revision}"


def _quiet_after() -> timedelta:
    return timedelta(seconds=getattr(settings, "GATEWAY_SAGA_QUIET_AFTER", DEFAULT_QUIET_AFTER))


def _next_check(state: str, now: datetime) -> datetime | None:
    return now + _quiet_after() if state in ACTIVE else None


# --- events and the one state change ----------------------------------------------------------


def _event(
    run: SagaRun,
    *,
    kind: str,
    actor: str,
    reason: str = "",
    from_state: str | None = None,
    to_state: str | None = None,
    step: str = "",
    principal: Principal | None = None,
    data: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> SagaEvent:
    """Append one line to the run's history (states default to the run's current one)."""
    return SagaEvent.objects.create(
        tenant_id=run.tenant_id,
        run=run,
        kind=kind,
        from_state=run.state if from_state is None else from_state,
        to_state=run.state if to_state is None else to_state,
        step=step,
        actor=actor,
        principal=principal,
        reason=reason[:4000],
        data=data or {},
        created_at=now or timezone.now(),
    )


def _set_state(
    run: SagaRun,
    *,
    to: str,
    actor: str,
    reason: str,
    principal: Principal | None = None,
    kind: str = "state",
    step: str = "",
    data: dict[str, Any] | None = None,
    **fields: Any,
) -> None:
    """Move ``run`` from the state it was read with to ``to``, with its event.

    Compare-and-set on the state read, although the caller holds the run's lock: if anything
    changed the run behind that lock, the update matches no row and the whole transaction is
    refused rather than written over it.
    """
    if to not in ALLOWED_TRANSITIONS[run.state]:
        raise InvalidTransition(f"Saga {run.pk} cannot go from {run.state} to {to}.")
    now = timezone.now()
    changed = SagaRun.objects.filter(pk=run.pk, state=run.state).update(
        state=to, state_changed_at=now, updated_at=now, next_check_at=_next_check(to, now), **fields
    )
    if changed != 1:
        raise InvalidTransition(f"Saga {run.pk} changed meanwhile; try again.")
    from_state = run.state
    _event(
        run,
        kind=kind,
        actor=actor,
        reason=reason,
        from_state=from_state,
        to_state=to,
        step=step,
        principal=principal,
        data=data,
        now=now,
    )
    # Announced to the tenant's webhook endpoints, in this transaction (gateway.webhooks).
    saga_outbox_record(run, from_state=from_state, to_state=to, actor=actor, reason=reason)
    run.state, run.state_changed_at, run.updated_at = to, now, now
    run.next_check_at = _next_check(to, now)
    for name, value in fields.items():
        setattr(run, name, value)
    logger.info(
        "saga transition",
        extra={"saga_id": run.pk, "from": from_state, "to": to, "actor": actor, "step": step},
    )


def _touch(run: SagaRun, **fields: Any) -> None:
    """Nothing to do yet: note where the run waits and when the sweeper should look again."""
    now = timezone.now()
    SagaRun.objects.filter(pk=run.pk).update(
        updated_at=now, next_check_at=_next_check(run.state, now), **fields
    )
    for name, value in fields.items():
        setattr(run, name, value)


def _lock(saga_id: str) -> SagaRun | None:
    """The run, locked until the caller's transaction ends, after its tenant's chain head.

    Against: a second orchestrator (redelivery, sweeper, another worker), an operator's
    resume / cancel / freeze, and the reconciler's mismatch hook — all take the same two locks
    in the same order, so they queue instead of interleaving or deadlocking.
    """
    tenant_id = SagaRun.objects.filter(pk=saga_id).values_list("tenant_id", flat=True).first()
    if tenant_id is None:
        return None
    audit.lock_chain(tenant_id)
    return (
        SagaRun.objects.select_for_update(of=("self",))
        .select_related("requested_by__tenant")
        .get(pk=saga_id)
    )


def _require_operator(principal: Principal, action: str) -> None:
    if principal.role not in OPERATOR_ROLES:
        raise NotPermitted(f"A principal with role {principal.role} cannot {action}.")
    if principal.frozen:
        raise NotPermitted(f"Principal {principal.name} is frozen.")


# --- what the orchestrator reads --------------------------------------------------------------


@dataclass
class _Progress:
    """A run's definition and step records, read under the run's lock."""

    run: SagaRun
    definition: SagaDefinition
    records: list[SagaStep]
    _inputs: dict[str, Any] | None = field(default=None, repr=False)

    @classmethod
    def load(cls, run: SagaRun) -> _Progress:
        definition = get_definition(run.definition)
        if definition is None:
            raise LookupError(f"saga {run.pk}: no definition {run.definition!r}")
        return cls(run=run, definition=definition, records=step_records(run))

    @property
    def inputs(self) -> dict[str, Any]:
        if self._inputs is None:
            self._inputs = saga_inputs(self.run)
        return self._inputs

    def latest(self, name: str) -> SagaStep | None:
        found = None
        for record in self.records:
            if record.name == name:
                found = record
        return found

    def context(self) -> StepContext:
        """What the next step's build and precondition may read."""
        confirmed = {
            record.name: record.effect
            for record in self.records
            if record.effect is not None and record.effect.status == S.CONFIRMED
        }
        receipts = latest_receipts(effect.pk for effect in confirmed.values())
        views = {}
        for name, effect in confirmed.items():
            receipt = receipts.get(effect.pk)
            views[name] = StepReceipt(
                provider_operation_id=effect.provider_operation_id,
                provider_status=receipt.provider_status if receipt else "",
                result=receipt.result if receipt else {},
            )
        return StepContext(saga_id=self.run.pk, inputs=self.inputs, receipts=views)


# --- start ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SagaStart:
    run: SagaRun
    created: bool


def _redact(inputs: dict[str, Any], definition: SagaDefinition) -> dict[str, Any]:
    return {
        name: REDACTED if name in definition.personal_inputs else value
        for name, value in inputs.items()
    }


def saga_start(
    *, principal: Principal, idempotency_key: Any, definition: Any, inputs: Any
) -> SagaStart:
    """Start a run of ``definition`` and issue its first step, or return the run this key
    already names.

    Same key + same definition and inputs replays the run (``created=False``), however many
    callers race: they collide on the (tenant, key) unique index. Same key + anything else
    raises IdempotencyKeyMismatch. Nothing is written otherwise.
    """
    if not isinstance(idempotency_key, str) or not idempotency_key.strip():
        raise ValidationProblem(
            "The Idempotency-Key header is required: a stable business key for this saga.",
            errors={"Idempotency-Key": ["required"]},
        )
    if len(idempotency_key) > MAX_KEY_LENGTH or not idempotency_key.isprintable():
        raise ValidationProblem(
            "The Idempotency-Key is not valid.",
            errors={"Idempotency-Key": [f"at most {MAX_KEY_LENGTH} printable characters"]},
        )
    found = get_definition(definition) if isinstance(definition, str) else None
    errors: dict[str, list[str]] = {}
    if found is None:
        errors["definition"] = [f"unknown saga {definition!r}; see GET /api/v1/saga-definitions"]
    elif not isinstance(inputs, dict):
        errors["inputs"] = ["must be an object"]
    else:
        errors.update(found.input_errors(inputs))
    if errors:
        raise ValidationProblem("The saga is not valid.", errors=errors)
    assert found is not None
    if principal.role not in SUBMITTER_ROLES:
        raise NotPermitted(f"A principal with role {principal.role} cannot start sagas.")
    if principal.frozen:
        raise NotPermitted(f"Principal {principal.name} is frozen.")

    digest = sha256_digest({"definition": found.name, "inputs": inputs})
    existing = _existing_run(principal, idempotency_key, digest)
    if existing is not None:
        return SagaStart(existing, created=False)
    now = timezone.now()
    try:
        with transaction.atomic():
            audit.lock_chain(principal.tenant_id)  # the lock order of every saga write
            run = SagaRun.objects.create(
                tenant_id=principal.tenant_id,
                definition=found.name,
                idempotency_key=idempotency_key,
                inputs_digest=digest,
                inputs_sealed=seal_json(inputs),
                inputs_redacted=_redact(inputs, found),
                requested_by=principal,
                state=R.RUNNING,
                state_changed_at=now,
                next_check_at=_next_check(R.RUNNING, now),
                created_at=now,
                updated_at=now,
            )
            _event(
                run,
                kind="started",
                actor=principal.label,
                principal=principal,
                from_state="",
                to_state=R.RUNNING,
                data={"idempotency_key": idempotency_key, "inputs_digest": digest},
                now=now,
            )
            # The first step is issued in this transaction: the answer already shows it.
            _advance(run, actor=principal.label)
    except IntegrityError:
        # Another request with this key committed first: it is the one run for the key.
        existing = _existing_run(principal, idempotency_key, digest)
        if existing is None:
            raise
        return SagaStart(existing, created=False)
    return SagaStart(run, created=True)


def _existing_run(principal: Principal, key: str, digest: str) -> SagaRun | None:
    run = SagaRun.objects.filter(tenant_id=principal.tenant_id, idempotency_key=key).first()
    if run is None:
        return None
    if run.inputs_digest != digest:
        raise IdempotencyKeyMismatch(
            f"Idempotency key {key!r} started saga {run.pk} with digest {run.inputs_digest}; "
            f"this request has digest {digest}. Send the identical request to replay it, or "
            "use a new key for a new saga.",
            extra={"saga_id": run.pk, "inputs_digest": run.inputs_digest},
        )
    return run


# --- the orchestrator -------------------------------------------------------------------------


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
        return _refused(run, progress, step, record, Trigger.REFUSED, detail, actor)
    effect = submission.effect
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
    failure = {
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


# --- compensation -----------------------------------------------------------------------------


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


def _cancel_unsent(run: SagaRun, record: SagaStep, *, principal: Principal, reason: str) -> bool:
    """Cancel a step effect that has not been sent; False if a worker claimed it first."""
    effect = record.effect
    assert effect is not None
    try:
        effect_cancel(effect=effect, principal=principal, reason=f"saga {run.pk}: {reason}")
    except InvalidTransition:
        return False  # claimed meanwhile: it is in flight now, effect_cancel re-read it
    return True


# --- people's actions -------------------------------------------------------------------------


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


def _freeze(
    run: SagaRun,
    *,
    actor: str,
    reason: str,
    principal: Principal | None = None,
    mismatch_effect_id: str = "",
) -> None:
    fields: dict[str, Any] = {"updated_at": timezone.now()}
    if mismatch_effect_id:
        run.mismatches = [*run.mismatches, mismatch_effect_id]
        fields["mismatches"] = run.mismatches
    if not run.frozen:
        fields.update(frozen=True, frozen_reason=reason[:4000])
    SagaRun.objects.filter(pk=run.pk).update(**fields)
    if not run.frozen:
        _event(
            run,
            kind="frozen",
            actor=actor,
            principal=principal,
            reason=reason,
            data={"effect_id": mismatch_effect_id} if mismatch_effect_id else {},
        )
        logger.warning(
            "saga frozen", extra={"saga_id": run.pk, "actor": actor, "reason": reason[:500]}
        )
    run.frozen = True
    run.frozen_reason = fields.get("frozen_reason", run.frozen_reason)


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
    from gateway.tasks import dispatch_effect
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
            transaction.on_commit(partial(dispatch_effect.delay, effect_id))
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


# --- the sweeper ------------------------------------------------------------------------------


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
