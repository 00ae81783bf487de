"""What every write of sagas shares: the actors' names, the run's events and its one state
change (``_set_state``), the run's lock (``_lock``: chain head, then the run), what the
orchestrator reads of a run (``_Progress``), and the freeze and the cancel of an unsent step
that the orchestrator and people's actions both use."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from gateway import audit
from gateway.choices import OPERATOR_ROLES, EffectStatus
from gateway.errors import InvalidTransition, NotPermitted
from gateway.models import Principal
from gateway.services import effect_cancel
from gateway.webhooks.services import saga_outbox_record
from sagas.choices import ACTIVE, ALLOWED_TRANSITIONS, SagaState
from sagas.definitions import SagaDefinition, StepContext, StepReceipt, get_definition
from sagas.models import SagaEvent, SagaRun, SagaStep
from sagas.selectors import latest_receipts, saga_inputs, step_records

logger = logging.getLogger("sagas.services")
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


def _cancel_unsent(run: SagaRun, record: SagaStep, *, principal: Principal, reason: str) -> bool:
    """Cancel a step effect that has not been sent; False if a worker claimed it first."""
    effect = record.effect
    assert effect is not None
    try:
        effect_cancel(effect=effect, principal=principal, reason=f"saga {run.pk}: {reason}")
    except InvalidTransition:
        return False  # claimed meanwhile: it is in flight now, effect_cancel re-read it
    return True


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
