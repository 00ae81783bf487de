"""The saga pages of the console: the runs of the tenant, a run step by step with its
effects, receipts, compensations and tasks, and the operators' actions (resume, cancel,
freeze, unfreeze, close a task) through the very services the API calls; and what sagas add
to the ledger's pages (the runs stopped for a human above the triage queue, the run of an
effect on its page), registered in ``SagasConfig.ready()``.

The pages use the ledger console's frame (``gateway.console.base``) and are composed under the
``console:`` namespace by ``gateway.urls``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from cryptography.fernet import InvalidToken
from django import forms
from django.db.models import Count, Max, Q
from django.http import HttpResponse
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from gateway.choices import OPERATOR_ROLES, EffectStatus
from gateway.console.base import (
    Action,
    ConsoleRequest,
    badges_oob,
    console_view,
    perform,
    poll_token,
    render_polled,
    role_may,
)
from gateway.console.extensions import Panel
from gateway.console.forms import NoteForm, ReasonForm, RequiredReasonForm
from gateway.errors import NotFound
from gateway.models import Command, Effect, Principal
from gateway.templatetags.console import duration_label, since
from sagas import choices, definitions, selectors, services
from sagas.api.serializers import receipt_summary
from sagas.models import SagaTask

S = EffectStatus


SAGAS_PAGE_SIZE = 50


SAGA_ALERTS_SHOWN = 10


def saga_alerts(principal: Principal) -> tuple[list[Any], bool]:
    """For the triage queue: the tenant's frozen runs, runs paused on a failure, runs waiting
    for manual compensations and runs whose compensation failed (which stay frozen), oldest
    change first; and whether there are more than shown."""
    runs = list(
        selectors.sagas_for_principal(principal)
        .filter(
            Q(frozen=True)
            | Q(
                state__in=[
                    choices.SagaState.COMPENSATION_FAILED,
                    choices.SagaState.PAUSED_FAILED,
                    choices.SagaState.MANUAL_COMPENSATION,
                ]
            )
        )
        .order_by("updated_at", "id")[: SAGA_ALERTS_SHOWN + 1]
    )
    return runs[:SAGA_ALERTS_SHOWN], len(runs) > SAGA_ALERTS_SHOWN


@dataclass(frozen=True)
class SagaFilters:
    """The saga list's query string, parsed; unknown values fall back to "any"."""

    state: str = ""
    definition: str = ""
    frozen: str = ""  # "yes", "no", or "": either
    after: str = ""

    @classmethod
    def parse(cls, params) -> SagaFilters:
        state = params.get("state", "")
        definition = params.get("definition", "")
        frozen = params.get("frozen", "")
        return cls(
            state=state if state in choices.SagaState.values else "",
            definition=definition if definition in definitions.DEFINITIONS else "",
            frozen=frozen if frozen in ("yes", "no") else "",
            after=params.get("after", "")[:80],
        )

    def querystring(self, **changes: str) -> str:
        return urlencode({k: v for k, v in {**self.__dict__, **changes}.items() if v})

    @property
    def active(self) -> bool:
        return bool(self.state or self.definition or self.frozen)


def _sagas_context(request: ConsoleRequest) -> dict[str, Any]:
    principal = request.principal
    filters = SagaFilters.parse(request.GET)
    query = selectors.sagas_filtered(
        principal=principal,
        states=[filters.state] if filters.state else None,
        definition=filters.definition or None,
        frozen={"yes": True, "no": False}.get(filters.frozen),
    )
    summary = query.aggregate(count=Count("pk"), latest=Max("updated_at"))
    if filters.after:
        # Keyset on the time-ordered primary key, newest first.
        query = query.filter(pk__lt=filters.after)
    page = list(query[: SAGAS_PAGE_SIZE + 1])
    has_next = len(page) > SAGAS_PAGE_SIZE
    page = page[:SAGAS_PAGE_SIZE]
    now = timezone.now()
    return {
        "filters": filters,
        "runs": page,
        "count": summary["count"],
        "next_query": filters.querystring(after=page[-1].pk) if has_next else "",
        "first_query": filters.querystring(after=""),
        "token": poll_token(
            filters.querystring(),
            summary["count"],
            summary["latest"],
            [
                (run.pk, run.updated_at, since(run.created_at), since(run.state_changed_at))
                for run in page
            ],
            has_next,
        ),
        "states": choices.SagaState.values,
        "definitions": sorted(definitions.DEFINITIONS),
        "frozen_options": [("yes", "frozen"), ("no", "not frozen")],
        "now": now,
        "view_name": "sagas",
    }


@require_GET
@console_view
def saga_list(request: ConsoleRequest) -> HttpResponse:
    """``/sagas``: the tenant's runs, newest first, filtered by state, definition, frozen."""
    return render_polled(request, "sagas/saga_list.html", "runs", _sagas_context(request))


@dataclass(frozen=True)
class SagaStepRow:
    """One step of a run as the saga page shows it."""

    view: Any  # selectors.StepView: the step, its latest record, effect and receipt
    position: str  # done, current, waiting, failed, undone, undoing, pending
    current: bool
    summary: dict[str, Any] | None  # the receipt summary the API gives
    window_left: str


def _step_position(view: Any) -> str:
    effect = view.effect
    if view.record is None:
        return "pending"
    if effect is None:
        return "failed"  # refused before a command existed
    status = effect.status
    if status == S.CONFIRMED:
        return "done"
    if status == S.COMPENSATED:
        return "undone"
    if status == S.COMPENSATING:
        return "undoing"
    if status == S.COMPENSATION_FAILED or status in choices.STEP_FAILED:
        return "failed"
    return "waiting"


def _step_rows(run: Any, now: datetime) -> list[SagaStepRow]:
    rows = []
    for view in selectors.saga_step_views(run):
        ends_at = view.window_ends_at
        window_left = ""
        if ends_at is not None:
            window_left = (
                f"{duration_label(ends_at - now)} left"
                if ends_at > now
                else f"closed {duration_label(now - ends_at)} ago"
            )
        rows.append(
            SagaStepRow(
                view=view,
                position=_step_position(view),
                current=bool(run.current_step) and view.step.name == run.current_step,
                summary=receipt_summary(view.receipt) if view.receipt else None,
                window_left=window_left,
            )
        )
    return rows


def saga_actions(principal: Principal, run: Any) -> set[str]:
    """The buttons to show. The sagas services decide again (and refuse with a reason)."""
    actions: set[str] = set()
    operator = role_may(principal, OPERATOR_ROLES)
    if operator:
        if run.frozen:
            # A failed compensation keeps its run frozen: saga_unfreeze refuses it.
            if run.state != choices.SagaState.COMPENSATION_FAILED:
                actions.add("unfreeze")
        elif choices.ALLOWED_TRANSITIONS[run.state]:
            actions.add("freeze")
        if not run.frozen and run.state in choices.RESUMABLE:
            actions.add("resume")
    requester = run.requested_by_id == principal.pk
    if run.state in choices.ABANDONABLE and (operator or (requester and not principal.frozen)):
        actions.add("cancel")
    return actions


def _saga_inputs(principal: Principal, run: Any) -> tuple[dict, bool]:
    """The inputs this principal may read, and whether they are the redacted copy."""
    if not selectors.may_see_inputs(principal, run):
        return run.inputs_redacted, True
    try:
        return selectors.saga_inputs(run), False
    except InvalidToken:
        return run.inputs_redacted, True


def _saga_context(request: ConsoleRequest, run: Any) -> dict[str, Any]:
    principal = request.principal
    now = timezone.now()
    definition = definitions.get_definition(run.definition)
    steps = _step_rows(run, now)
    tasks = list(selectors.saga_tasks(principal=principal, states=None, saga_id=run.pk))
    events = list(selectors.saga_events(run))
    inputs, inputs_redacted = _saga_inputs(principal, run)
    happened = sum(
        1
        for row in steps
        if row.view.effect is not None and row.view.effect.status in choices.STEP_HAPPENED
    )
    current = next((row for row in steps if row.current), None)
    token = poll_token(
        run.updated_at,
        run.state,
        run.frozen,
        [
            (
                r.view.record.pk if r.view.record else None,
                r.view.effect.status if r.view.effect else None,
                r.view.effect.updated_at if r.view.effect else None,
                r.window_left,
            )
            for r in steps
        ],
        [(task.pk, task.state) for task in tasks],
        events[-1].pk if events else None,
        since(run.state_changed_at),
    )
    return {
        "run": run,
        "definition": definition,
        "steps": steps,
        "happened": happened,
        "current": current,
        "tasks": tasks,
        "events": events,
        "inputs": inputs,
        "inputs_redacted": inputs_redacted,
        "actions": saga_actions(principal, run),
        "may_close_tasks": role_may(principal, OPERATOR_ROLES),
        "may_compensate_only": run.state not in choices.CANCELLABLE,
        "in_state": duration_label(now - run.state_changed_at),
        "token": token,
        "now": now,
        "view_name": "sagas",
    }


def _load_saga(request: ConsoleRequest, saga_id: str) -> Any:
    # Another tenant's run does not exist for this caller: NotFound, mapped to a 404.
    return selectors.saga_get(principal=request.principal, saga_id=saga_id)


@require_GET
@console_view
def saga_detail(request: ConsoleRequest, saga_id: str) -> HttpResponse:
    """``/sagas/<id>``: each step with its effect, receipt and compensation; the actions."""
    run = _load_saga(request, saga_id)
    return render_polled(request, "sagas/saga_detail.html", "saga", _saga_context(request, run))


class SagaCancelForm(forms.Form):
    reason = forms.CharField(max_length=2000, required=False)
    compensate = forms.BooleanField(required=False)


def _saga_resume(request: ConsoleRequest, run: Any, data: dict[str, Any]) -> str:
    services.saga_resume(run=run, principal=request.principal, reason=data["reason"])
    run.refresh_from_db()
    return f"Resumed {run.pk}: it is {run.state} now."


CANCEL_OUTCOMES = {
    "cancelled": "nothing of it had happened yet",
    "cancelled_with_effects": "{confirmed} step(s) had already happened and stay as they are",
    "cancelled_pending_reconciliation": (
        "{pending} step(s) were in flight or unknown: the reconciler settles them"
    ),
}


def _saga_cancel(request: ConsoleRequest, run: Any, data: dict[str, Any]) -> str:
    result = services.saga_cancel(
        run=run,
        principal=request.principal,
        compensate=data["compensate"],
        reason=data["reason"],
    )
    inventory = result.inventory
    said = CANCEL_OUTCOMES.get(result.outcome, result.outcome).format(
        confirmed=len(inventory["confirmed"]),
        pending=len(inventory["in_flight"]) + len(inventory["unknown"]),
    )
    if result.compensating:
        return (
            f"Cancelled {run.pk} with compensation: its confirmed steps are undone, newest first."
        )
    return f"Cancelled {run.pk}: {said}."


def _saga_freeze(request: ConsoleRequest, run: Any, data: dict[str, Any]) -> str:
    principal = request.principal
    froze = services.saga_freeze(
        saga_id=run.pk,
        actor=principal.label,
        principal=principal,
        reason=data["reason"] or "frozen by an operator",
    )
    if not froze:
        return f"{run.pk} was already frozen."
    return (
        f"Froze {run.pk}: it issues no further step and none of its effects is dispatched "
        "until it is unfrozen."
    )


def _saga_unfreeze(request: ConsoleRequest, run: Any, data: dict[str, Any]) -> str:
    services.saga_unfreeze(run=run, principal=request.principal, reason=data["reason"])
    return f"Unfroze {run.pk}: it goes on from where it stopped."


SAGA_ACTIONS: dict[str, Action] = {
    "resume": Action(ReasonForm, _saga_resume),
    "cancel": Action(SagaCancelForm, _saga_cancel),
    "freeze": Action(RequiredReasonForm, _saga_freeze),
    "unfreeze": Action(ReasonForm, _saga_unfreeze),
}


def _saga_perform(request: ConsoleRequest, run: Any, form: forms.Form, run_action) -> HttpResponse:
    def answer() -> str:
        fresh = _load_saga(request, run.pk)
        return render_to_string(
            "sagas/saga_detail.html#saga", _saga_context(request, fresh), request=request
        ) + badges_oob(request)

    return perform(
        request,
        form=form,
        run=run_action,
        back=reverse("console:saga", args=[run.pk]),
        answer=answer,
    )


@require_POST
@console_view
def saga_action(request: ConsoleRequest, saga_id: str, action: str) -> HttpResponse:
    """POST ``/sagas/<id>/<action>``: resume, cancel, freeze or unfreeze, through the sagas
    services the API calls; answered with the whole ``#saga`` block in place."""
    spec = SAGA_ACTIONS.get(action)
    if spec is None:
        raise NotFound(f"No action {action!r}.")
    run = _load_saga(request, saga_id)
    return _saga_perform(
        request, run, spec.form(request.POST), lambda data: spec.run(request, run, data)
    )


@require_POST
@console_view
def saga_task_done(request: ConsoleRequest, saga_id: str, task_id: str) -> HttpResponse:
    """POST ``/sagas/<id>/tasks/<task>/done``: an owner closes a task (``saga_task_close``)."""
    run = _load_saga(request, saga_id)
    task = selectors.saga_task_get(principal=request.principal, task_id=task_id)
    if task.run_id != run.pk:
        raise NotFound(f"No task {task_id} in saga {run.pk}.")

    def close(data: dict[str, Any]) -> str:
        services.saga_task_close(task=task, principal=request.principal, note=data["note"])
        return f"Closed task {task.pk} ({task.get_kind_display()}) of step {task.step.name}."

    return _saga_perform(request, run, NoteForm(request.POST), close)


# --- what sagas add to the ledger's pages (registered in SagasConfig.ready) -------------------


def triage_panel(principal: Principal) -> Panel:
    """Above the triage queue: the runs stopped for a human."""
    alerts, more_alerts = saga_alerts(principal)
    # The owners' open tasks (manual compensations, pages), counted per run shown.
    tasks = dict(
        SagaTask.objects.filter(
            tenant_id=principal.tenant_id, state=choices.TaskState.OPEN, run__in=alerts
        )
        .values_list("run_id")
        .annotate(n=Count("pk"))
    )
    for run in alerts:
        run.open_tasks = tasks.get(run.pk, 0)
    return Panel(
        {"saga_alerts": alerts, "more_saga_alerts": more_alerts},
        token=[
            (run.pk, run.state, run.frozen, run.updated_at, since(run.updated_at), run.open_tasks)
            for run in alerts
        ],
    )


def effect_panel(principal: Principal, effect: Effect) -> Panel:
    """On the effect page: the saga run it is a step of."""
    saga = _effect_saga(principal, effect.command)
    return Panel({"saga": saga}, token=(saga.state, saga.frozen) if saga is not None else None)


def _effect_saga(principal: Principal, command: Command) -> Any:
    """The saga run this effect is a step of, when it is one."""
    if not command.saga_id:
        return None
    return selectors.sagas_for_principal(principal).filter(pk=command.saga_id).first()


def search_hits(principal: Principal, q: str) -> list[Any]:
    """For the console's search box: the saga run with this id."""
    from gateway.console.search import Hit

    return [
        Hit(
            reverse("console:saga", args=[run.pk]),
            "saga",
            f"{run.pk} · {run.definition}",
            "saga id",
            run.state,
        )
        for run in selectors.sagas_for_principal(principal).filter(pk=q)[:1]
    ]


def dispatch_blockers(principal: Principal, effects: list[Any]) -> dict[str, str]:
    """For the approvals inbox: effects whose saga run is frozen (approved, they still wait)."""
    by_saga: dict[str, list[str]] = {}
    for effect in effects:
        if effect.command.saga_id:
            by_saga.setdefault(effect.command.saga_id, []).append(effect.pk)
    if not by_saga:
        return {}
    reasons = {}
    for run in selectors.sagas_for_principal(principal).filter(pk__in=list(by_saga), frozen=True):
        why = f"its saga {run.pk} is frozen" + (
            f" ({run.frozen_reason})" if run.frozen_reason else ""
        )
        for effect_id in by_saga[run.pk]:
            reasons[effect_id] = why
    return reasons
