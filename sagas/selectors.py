"""Reads of the sagas app (STYLE 4): runs, their steps as the API and the console show them,
the owners' tasks, and the one question the dispatcher asks. Scoped by tenant."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import QuerySet

from gateway.choices import OPERATOR_ROLES
from gateway.errors import NotFound
from gateway.lib.vault import open_json
from gateway.models import Effect, Principal, Receipt
from sagas.choices import STEP_HAPPENED, STEP_IN_FLIGHT, TaskState
from sagas.definitions import CompensationSpec, SagaDefinition, Step, get_definition
from sagas.models import SagaEvent, SagaRun, SagaStep, SagaTask


def saga_blocks_dispatch(saga_id: str) -> bool:
    """True when nothing of this saga may be sent: the run is frozen (by an operator, a
    mismatch, or a failed compensation). Asked by the dispatcher's claim for every effect
    that belongs to a saga; a plain read, no lock: the freeze commits before it is seen, and
    a claim that read "not frozen" just before is no different from one that ran earlier."""
    return SagaRun.objects.filter(pk=saga_id, frozen=True).exists()


def sagas_for_principal(principal: Principal) -> QuerySet[SagaRun]:
    """Runs the principal may see: its tenant's, and no other's."""
    return SagaRun.objects.filter(tenant_id=principal.tenant_id).select_related(
        "tenant", "requested_by"
    )


def saga_get(*, principal: Principal, saga_id: str) -> SagaRun:
    run = sagas_for_principal(principal).filter(pk=saga_id).first()
    if run is None:
        # Another tenant's run does not exist for this caller.
        raise NotFound(f"No saga {saga_id}.")
    return run


def sagas_filtered(
    *,
    principal: Principal,
    states: Iterable[str] | None = None,
    definition: str | None = None,
    frozen: bool | None = None,
) -> QuerySet[SagaRun]:
    """Newest first (ids sort by time): served by saga_tenant_state / saga_tenant_definition."""
    query = sagas_for_principal(principal)
    if states:
        query = query.filter(state__in=sorted(states))
    if definition:
        query = query.filter(definition=definition)
    if frozen is not None:
        query = query.filter(frozen=frozen)
    return query.order_by("-id")


def saga_events(run: SagaRun) -> QuerySet[SagaEvent]:
    return run.events.select_related("principal").order_by("id")


def saga_tasks(
    *,
    principal: Principal,
    states: Iterable[str] | None = (TaskState.OPEN,),
    owner: str | None = None,
    kind: str | None = None,
    saga_id: str | None = None,
) -> QuerySet[SagaTask]:
    """The owners' queue: manual compensations and pages, oldest first (saga_task_open)."""
    query = SagaTask.objects.filter(tenant_id=principal.tenant_id).select_related(
        "run", "step", "done_by"
    )
    if states:
        query = query.filter(state__in=sorted(states))
    if owner:
        query = query.filter(owner=owner)
    if kind:
        query = query.filter(kind=kind)
    if saga_id:
        query = query.filter(run_id=saga_id)
    return query.order_by("created_at", "id")


def saga_task_get(*, principal: Principal, task_id: str) -> SagaTask:
    task = saga_tasks(principal=principal, states=None).filter(pk=task_id).first()
    if task is None:
        raise NotFound(f"No saga task {task_id}.")
    return task


def may_see_inputs(principal: Principal, run: SagaRun) -> bool:
    return principal.role in OPERATOR_ROLES or run.requested_by_id == principal.pk


def saga_inputs(run: SagaRun) -> dict[str, Any]:
    """The clear inputs (for the orchestrator and for callers allowed to see them)."""
    return open_json(run.inputs_sealed)


# --- the steps of a run -------------------------------------------------------------------------


def step_records(run: SagaRun) -> list[SagaStep]:
    """Every step record of a run, in step order then revision order, with its effects."""
    return list(
        SagaStep.objects.filter(run_id=run.pk)
        .select_related("effect__command", "compensation_effect")
        .order_by("index", "revision")
    )


def latest_receipts(effect_ids: Iterable[str]) -> dict[str, Receipt]:
    """The newest receipt of each effect."""
    latest: dict[str, Receipt] = {}
    for receipt in Receipt.objects.filter(effect_id__in=list(effect_ids)).order_by(
        "received_at", "id"
    ):
        latest[receipt.effect_id] = receipt
    return latest


@dataclass(frozen=True)
class StepView:
    """One step of a run as people see it: its latest issue, effect, receipt, compensation."""

    index: int
    step: Step
    record: SagaStep | None
    earlier: list[SagaStep]
    receipt: Receipt | None
    compensation_effect: Effect | None

    @property
    def effect(self) -> Effect | None:
        return self.record.effect if self.record else None

    @property
    def spec(self) -> CompensationSpec:
        return self.step.compensation

    @property
    def window_ends_at(self) -> datetime | None:
        effect = self.effect
        if effect is None or effect.confirmed_at is None or self.spec.window is None:
            return None
        return effect.confirmed_at + self.spec.window


def saga_step_views(run: SagaRun, definition: SagaDefinition | None = None) -> list[StepView]:
    definition = definition or get_definition(run.definition)
    if definition is None:
        return []
    records = step_records(run)
    by_name: dict[str, list[SagaStep]] = {}
    for record in records:
        by_name.setdefault(record.name, []).append(record)
    effect_ids = [r.effect_id for r in records if r.effect_id]
    receipts = latest_receipts(effect_ids)
    compensation_ids = [
        r.effect.compensated_by_id for r in records if r.effect and r.effect.compensated_by_id
    ]
    compensations = {
        e.pk: e for e in Effect.objects.filter(pk__in=compensation_ids).select_related("command")
    }
    views = []
    for index, step in enumerate(definition.steps):
        issued = by_name.get(step.name, [])
        last: SagaStep | None = issued[-1] if issued else None
        effect = last.effect if last else None
        views.append(
            StepView(
                index=index,
                step=step,
                record=last,
                earlier=issued[:-1],
                receipt=receipts.get(effect.pk) if effect else None,
                compensation_effect=(
                    compensations.get(effect.compensated_by_id)
                    if effect and effect.compensated_by_id
                    else None
                ),
            )
        )
    return views


def saga_inventory(records: Iterable[SagaStep]) -> dict[str, list[dict[str, str]]]:
    """Where the step effects of a run stand, for a cancel's answer: what happened, what is
    still on its way, what nobody knows yet, and what will never be sent."""
    inventory: dict[str, list[dict[str, str]]] = {
        "confirmed": [],
        "in_flight": [],
        "unknown": [],
        "cancelled": [],
    }
    for record in records:
        effect = record.effect
        if effect is None:
            continue
        item = {
            "step": record.name,
            "revision": record.revision,
            "effect_id": effect.pk,
            "status": effect.status,
        }
        if effect.status in STEP_HAPPENED:
            inventory["confirmed"].append(item)
        elif effect.status in STEP_IN_FLIGHT:
            inventory["in_flight"].append(item)
        elif effect.status == "UNKNOWN":
            inventory["unknown"].append(item)
        elif effect.status == "CANCELLED":
            inventory["cancelled"].append(item)
    return inventory
