"""Plain Django views of reconciliation: providers' asynchronous receipts, and its console
pages (the human queue of cases and orphan receipts, and what it adds to the effect page).

The webhook is not part of the agents' API: no session, no CSRF, no bearer token. A provider
proves itself with an HMAC signature over the timestamp and the exact body (see
reconciliation.webhooks); anything unsigned, mis-signed or stale is a 401 problem and is not
read any further.

The console pages use the ledger console's frame (``gateway.console.base``) and are composed
under the ``console:`` namespace by ``gateway.urls``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, JsonResponse, QueryDict
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from gateway.api.problems import PROBLEM_CONTENT_TYPE, json_problem_view, problem
from gateway.choices import OPERATOR_ROLES, TO_RECONCILE, EffectStatus
from gateway.console.base import (
    Action,
    ConsoleRequest,
    badges_oob,
    console_view,
    is_partial,
    perform,
    poll_token,
    render_polled,
    role_may,
)
from gateway.console.effects import load_effect
from gateway.console.extensions import EffectAction, Panel
from gateway.console.forms import NoteForm, ReasonForm
from gateway.console.selectors import owners
from gateway.errors import NotFound, NotPermitted
from gateway.lib import jsonin
from gateway.models import Effect, Principal
from gateway.providers.base import ProviderOperation
from gateway.templatetags.console import duration_label, money
from reconciliation import choices, selectors, services
from reconciliation.metrics import WEBHOOKS_REFUSED
from reconciliation.models import OrphanReceipt
from reconciliation.webhooks import BadSignature, verify

S = EffectStatus

# --- providers' asynchronous receipts -----------------------------------------------------------


def _invalid(errors: dict[str, list[str]]) -> JsonResponse:
    return JsonResponse(
        problem(
            status=400,
            slug="validation-error",
            title="The request is not valid",
            detail="The webhook body is not a receipt: see errors.",
            errors=errors,
        ),
        status=400,
        content_type=PROBLEM_CONTENT_TYPE,
    )


def _text(value: Any, limit: int, *, required: bool = True) -> str | None:
    if value is None or value == "":
        return None if required else ""
    if not isinstance(value, str) or len(value) > limit:
        return None
    return value


def parse_receipt(provider: str, body: bytes, signed_at: int):
    """The receipt of a verified body, or the field errors that make it none."""
    try:
        data = jsonin.loads(body)
    except jsonin.JsonInputError as exc:
        return None, {exc.where: [f"must be a UTF-8 JSON object: {exc}"]}
    if not isinstance(data, dict):
        return None, {"body": ["must be a JSON object"]}
    errors: dict[str, list[str]] = {}
    event_id = _text(data.get("event_id"), 200)
    if event_id is None:
        errors["event_id"] = ["required: a string of at most 200 characters"]
    operation = data.get("operation")
    if not isinstance(operation, dict):
        errors["operation"] = ["required: an object"]
        return None, errors
    op_id = _text(operation.get("id"), 200)
    status = _text(operation.get("status"), 32)
    digest = _text(operation.get("payload_digest"), 71, required=False)
    key = _text(operation.get("idempotency_key"), 330, required=False)
    result = operation.get("result", {})
    if op_id is None:
        errors["operation.id"] = ["required: a string of at most 200 characters"]
    if status is None:
        errors["operation.status"] = ["required: a string of at most 32 characters"]
    if digest is None:
        errors["operation.payload_digest"] = ["must be a string of at most 71 characters"]
    if key is None:
        errors["operation.idempotency_key"] = ["must be a string of at most 330 characters"]
    if not isinstance(result, dict):
        errors["operation.result"] = ["must be an object"]
    if errors:
        return None, errors
    # No errors: every field was found (mypy cannot follow the errors dict).
    assert event_id is not None and key is not None
    assert op_id is not None and status is not None and digest is not None
    receipt = services.WebhookReceipt(
        provider=provider,
        event_id=event_id,
        idempotency_key=key,
        operation=ProviderOperation(id=op_id, status=status, payload_digest=digest, result=result),
        signed_at=datetime.fromtimestamp(signed_at, tz=UTC),
    )
    return receipt, {}


@csrf_exempt
@require_POST
def provider_webhook(request: HttpRequest, name: str) -> HttpResponse:
    """POST /hooks/providers/{name}: one asynchronous receipt, applied at most once."""
    secrets: dict[str, str] = getattr(settings, "GATEWAY_WEBHOOK_SECRETS", {}) or {}
    # A label per configured provider only: an attacker must not mint label values.
    label = name if name in secrets else "unknown"
    try:
        body = request.body
    except RequestDataTooBig:
        return json_problem_view(400, "body-too-large", "The request body is too large", "")
    try:
        signed_at = verify(
            secret=secrets.get(name, ""),
            timestamp=request.headers.get("X-Gateway-Timestamp"),
            signature=request.headers.get("X-Gateway-Signature"),
            body=body,
            now=time.time(),
        )
    except BadSignature as exc:
        WEBHOOKS_REFUSED.labels(provider=label, reason=exc.reason).inc()
        response = json_problem_view(
            401, "webhook-signature", "The webhook signature is not valid", str(exc)
        )
        response["WWW-Authenticate"] = 'HMAC-SHA256 realm="providers"'
        return response
    receipt, errors = parse_receipt(name, body, signed_at)
    if receipt is None:
        return _invalid(errors)
    delivery, created = services.webhook_receive(receipt=receipt)
    return JsonResponse(
        {
            "received": True,
            "duplicate": not created,
            "outcome": delivery.outcome,
            "effect_id": delivery.effect_id,
        }
    )


# --- the human queue: reconciliation cases -----------------------------------------------------


CASES_PAGE_SIZE = 50


ORPHANS_SHOWN = 50


class ResolveForm(forms.Form):
    OUTCOMES = [
        ("confirmed", "confirmed — the provider did it"),
        ("not_started", "not started — the provider never received it"),
    ]
    outcome = forms.ChoiceField(choices=OUTCOMES, widget=forms.RadioSelect)
    evidence = forms.CharField(
        max_length=4000,
        widget=forms.Textarea,
        help_text="What proves it: a provider console link, a ticket, a statement line.",
    )


# The outcomes an operator may record, as the forms of the pages list them.
RESOLVE_OUTCOMES = ResolveForm.OUTCOMES


def resolvable(effect: Effect) -> bool:
    """Whether an operator's resolution with evidence could apply (effect_resolve decides)."""
    return effect.status in TO_RECONCILE or (effect.status == S.NOT_STARTED and effect.escalated)


@dataclass(frozen=True)
class CaseFilters:
    """The human queue's query string, parsed; unknown values fall back to "any"."""

    owner: str = ""
    reason: str = ""
    state: str = ""  # "": open and acknowledged (unresolved)
    after: str = ""

    @classmethod
    def parse(cls, params) -> CaseFilters:
        owner = params.get("owner", "")
        reason = params.get("reason", "")
        state = params.get("state", "")
        return cls(
            owner=owner if owner in owners() else "",
            reason=reason if reason in choices.CaseReason.values else "",
            state=state if state in choices.CaseState.values else "",
            after=params.get("after", "")[:80],
        )

    def querystring(self, **changes: str) -> str:
        return urlencode({k: v for k, v in {**self.__dict__, **changes}.items() if v})

    @property
    def active(self) -> bool:
        return bool(self.owner or self.reason or self.state)


@dataclass
class CaseRow:
    """One case of the queue, with what this principal may do about it."""

    case: Any
    age: str
    cost: str
    may_acknowledge: bool
    may_resolve: bool


def _case_row(principal: Principal, case: Any, now: datetime) -> CaseRow:
    operator = role_may(principal, OPERATOR_ROLES)
    unresolved = case.state in choices.UNRESOLVED
    return CaseRow(
        case=case,
        age=duration_label(now - case.opened_at),
        cost=money(case.effect.command.payload_redacted),
        may_acknowledge=operator and case.state == choices.CaseState.OPEN,
        may_resolve=operator and unresolved and resolvable(case.effect),
    )


def _cases_query(principal: Principal, filters: CaseFilters) -> QuerySet:
    return (
        selectors.cases_queue(
            principal=principal,
            states=[filters.state] if filters.state else None,
            owner=filters.owner or None,
            reason=filters.reason or None,
        )
        .select_related("effect__command")
        .defer("effect__command__payload_sealed")
    )


def orphan_receipts(principal: Principal) -> tuple[list[Any], int]:
    """Open orphan receipts of the tenant (receipts naming no command of ours), oldest first."""
    query = OrphanReceipt.objects.filter(
        tenant_id=principal.tenant_id, state=choices.OrphanState.OPEN
    )
    return list(query.order_by("received_at", "id")[:ORPHANS_SHOWN]), query.count()


def _cases_context(request: ConsoleRequest, *, full: bool) -> dict[str, Any]:
    principal = request.principal
    now = timezone.now()
    filters = CaseFilters.parse(request.GET)
    query = _cases_query(principal, filters)
    count = query.count()
    if filters.after:
        # Keyset on the queue's order (opened_at, id): the anchor is read among all of the
        # tenant's cases, since it may have been resolved since the page was drawn.
        anchor = (
            selectors.cases_for_principal(principal)
            .filter(pk=filters.after)
            .values_list("opened_at", flat=True)
            .first()
        )
        if anchor is not None:
            query = query.filter(
                Q(opened_at__gt=anchor) | Q(opened_at=anchor, pk__gt=filters.after)
            )
    page = list(query[: CASES_PAGE_SIZE + 1])
    has_next = len(page) > CASES_PAGE_SIZE
    page = page[:CASES_PAGE_SIZE]
    rows = [_case_row(principal, case, now) for case in page]
    context: dict[str, Any] = {
        "filters": filters,
        "rows": rows,
        "count": count,
        "next_query": filters.querystring(after=page[-1].pk) if has_next else "",
        "first_query": filters.querystring(after=""),
        "token": poll_token(
            filters.querystring(),
            count,
            [
                (
                    r.case.pk,
                    r.case.state,
                    r.case.acknowledged_by_id,
                    r.case.effect.status,
                    r.case.effect.updated_at,
                    r.age,
                )
                for r in rows
            ],
            has_next,
        ),
        "owners": owners(),
        "reasons": choices.CaseReason.choices,
        "states": [
            (choices.CaseState.OPEN, "open"),
            (choices.CaseState.ACKNOWLEDGED, "acknowledged"),
            (choices.CaseState.RESOLVED, "resolved"),
        ],
        "resolve_outcomes": RESOLVE_OUTCOMES,
        "now": now,
        "view_name": "cases",
    }
    if full:
        orphans, orphan_count = orphan_receipts(principal)
        context.update(
            orphans=orphans,
            orphan_count=orphan_count,
            may_see_results=principal.role in OPERATOR_ROLES,
        )
    return context


@require_GET
@console_view
def cases(request: ConsoleRequest) -> HttpResponse:
    """``/cases``: the human queue, oldest first, with filters; orphan receipts below."""
    context = _cases_context(request, full=not is_partial(request))
    return render_polled(request, "reconciliation/case_queue.html", "cases", context)


def _case_acknowledge(request: ConsoleRequest, case: Any, data: dict[str, Any]) -> str:
    services.case_acknowledge(case=case, principal=request.principal, note=data["note"])
    return f"You took case {case.pk} of {case.effect_id}."


def _case_resolve(request: ConsoleRequest, case: Any, data: dict[str, Any]) -> str:
    effect = load_effect(request, case.effect_id)
    services.effect_resolve(
        effect=effect,
        principal=request.principal,
        outcome=data["outcome"],
        evidence=data["evidence"],
    )
    return (
        f"Resolved {effect.pk} as {data['outcome']}, with your evidence on record; "
        f"case {case.pk} is closed."
    )


CASE_ACTIONS: dict[str, Action] = {
    "acknowledge": Action(NoteForm, _case_acknowledge),
    "resolve": Action(ResolveForm, _case_resolve),
}


@require_POST
@console_view
def case_action(request: ConsoleRequest, case_id: str, action: str) -> HttpResponse:
    """POST ``/cases/<id>/<action>``: take a case (``case_acknowledge``) or resolve its effect
    with evidence (``effect_resolve``), answered with the case's card in place."""
    spec = CASE_ACTIONS.get(action)
    if spec is None:
        raise NotFound(f"No action {action!r}.")
    principal = request.principal
    case = selectors.case_get(principal=principal, case_id=case_id)
    # Back to the page of the queue the form was on (its filters, re-parsed: never a URL
    # taken from the form as it is).
    filters = CaseFilters.parse(QueryDict(request.POST.get("filters", "")))
    back = reverse("console:cases") + (f"?{filters.querystring()}" if filters.active else "")

    def answer() -> str:
        fresh = (
            selectors.cases_for_principal(principal)
            .select_related("effect__command")
            .defer("effect__command__payload_sealed")
            .get(pk=case.pk)
        )
        row = _case_row(principal, fresh, timezone.now())
        html = render_to_string(
            "reconciliation/case_queue.html#case",
            {
                "row": row,
                "filters": filters,
                "resolve_outcomes": RESOLVE_OUTCOMES,
            },
            request=request,
        )
        return html + badges_oob(request)

    run = spec.run
    return perform(
        request,
        form=spec.form(request.POST),
        run=lambda data: run(request, case, data),
        back=back,
        target=f"#case-{case.pk}-error",
        answer=answer,
    )


# --- what reconciliation adds to the effect page (registered in ReconciliationConfig.ready) ---


def effect_panel(principal: Principal, effect: Effect) -> Panel:
    """The effect's unresolved human-queue case and its reconciliation records (lookups and
    manual resolutions)."""
    open_case = selectors.effect_open_case(effect)
    records = list(selectors.effect_records(effect))
    return Panel(
        {"open_case": open_case, "records": records},
        token=(
            (open_case.pk, open_case.state) if open_case is not None else None,
            records[-1].pk if records else None,
        ),
    )


def _reconcile(request: ConsoleRequest, effect: Effect, data: dict[str, Any]) -> str:
    # Not an operator: refuse before the provider is asked anything on the caller's behalf.
    if not role_may(request.principal, OPERATOR_ROLES):
        raise NotPermitted(f"A principal with role {request.principal.role} cannot reconcile.")
    services.effect_reconcile(
        effect_id=effect.pk, actor=request.principal.label, principal=request.principal
    )
    effect.refresh_from_db()
    return f"Asked the provider about {effect.pk}: it is now {effect.status}."


def _resolve(request: ConsoleRequest, effect: Effect, data: dict[str, Any]) -> str:
    services.effect_resolve(
        effect=effect,
        principal=request.principal,
        outcome=data["outcome"],
        evidence=data["evidence"],
    )
    effect.refresh_from_db()
    return f"Resolved {effect.pk} as {data['outcome']}, with your evidence on record."


def _acknowledge(request: ConsoleRequest, effect: Effect, data: dict[str, Any]) -> str:
    open_case = selectors.effect_open_case(effect)
    if open_case is None:
        raise NotFound(f"{effect.pk} has no open case to acknowledge.")
    services.case_acknowledge(case=open_case, principal=request.principal, note=data["reason"])
    return f"You took case {open_case.pk} of {effect.pk}."


def _operator(principal: Principal) -> bool:
    return role_may(principal, OPERATOR_ROLES)


EFFECT_ACTIONS: dict[str, EffectAction] = {
    "reconcile": EffectAction(
        ReasonForm,
        _reconcile,
        shown=lambda principal, effect, page: (
            _operator(principal) and effect.status in TO_RECONCILE
        ),
    ),
    "resolve": EffectAction(
        ResolveForm,
        _resolve,
        shown=lambda principal, effect, page: _operator(principal) and resolvable(effect),
    ),
    "acknowledge": EffectAction(
        ReasonForm,
        _acknowledge,
        shown=lambda principal, effect, page: (
            _operator(principal)
            and page.get("open_case") is not None
            and getattr(page["open_case"], "state", "") == "open"
        ),
    ),
}
