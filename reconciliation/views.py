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
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.http import HttpRequest, HttpResponse, JsonResponse, QueryDict
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from gateway.api.problems import PROBLEM_CONTENT_TYPE, json_problem_view, problem
from gateway.choices import OPERATOR_ROLES, TO_RECONCILE, EffectStatus
from gateway.console import verdict as verdict_module
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
from gateway.console.effects import changed_by, load_effect
from gateway.console.extensions import BulkAction, EffectAction, Panel
from gateway.console.forms import NoteForm, ReasonForm, RequiredReasonForm
from gateway.console.selectors import owners
from gateway.contracts import get_contract
from gateway.errors import NotFound, NotPermitted
from gateway.lib import jsonin
from gateway.lib.any_of import AnyOf
from gateway.models import Effect, Principal
from gateway.providers.base import ProviderOperation
from gateway.templatetags.console import duration_label, money
from reconciliation import bulk, choices, claims, job_views, presence, selectors, services
from reconciliation.metrics import WEBHOOKS_REFUSED
from reconciliation.models import Case, OrphanReceipt
from reconciliation.services import resolution
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
    operation_id = forms.CharField(max_length=200, required=False)

    # The contract's receipt fields arrive as ``field_<name>`` (the form lists the effect's).
    FIELD_PREFIX = "field_"

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        cleaned["fields"] = {
            key[len(self.FIELD_PREFIX) :]: value
            for key, value in self.data.items()
            if key.startswith(self.FIELD_PREFIX) and isinstance(value, str)
        }
        return cleaned


# The outcomes an operator may record, as the forms of the pages list them.
RESOLVE_OUTCOMES = ResolveForm.OUTCOMES


def resolvable(effect: Effect) -> bool:
    """Whether an operator's resolution with evidence could apply (effect_resolve decides):
    an uncertain effect, or one CONFIRMED by hand whose receipt lacks what it needs."""
    return resolution.resolvable(effect) or resolution.amendable(effect)


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
    # The effect is settled (a confirmed charge whose later receipt disagreed): closed with a
    # note instead of resolved.
    may_close: bool = False
    # The effect page's verdict: what happened and the safe next step, in words.
    verdict: verdict_module.Verdict | None = None
    # The case's evidence without the fields nobody filled (a lookup that got no answer).
    evidence: dict[str, Any] | None = None
    # What the resolve form asks for besides the operation id (the contract's receipt_fields).
    receipt_fields: tuple[str, ...] = ()


def case_verdict(case: Any) -> verdict_module.Verdict:
    """The effect page's sentence for a case's effect, from what the row holds (no receipt
    or lookup query per row: the operation id is the effect's)."""
    effect = case.effect
    contract = get_contract(effect.type)
    proof = verdict_module.evidence(effect, contract, None)
    unresolved = case.state in choices.UNRESOLVED
    return verdict_module.verdict(
        effect,
        contract=contract,
        receipt=None,
        proof=proof,
        page={"open_case": case if unresolved else None},
    )


def _case_row(principal: Principal, case: Any, now: datetime) -> CaseRow:
    operator = role_may(principal, OPERATOR_ROLES)
    unresolved = case.state in choices.UNRESOLVED
    contract = get_contract(case.effect.type)
    return CaseRow(
        case=case,
        age=duration_label(now - case.opened_at),
        cost=money(case.effect.command.payload_redacted),
        may_acknowledge=operator and case.state == choices.CaseState.OPEN,
        may_resolve=operator and unresolved and resolution.resolvable(case.effect),
        may_close=operator and unresolved and case.effect.status not in TO_RECONCILE,
        verdict=case_verdict(case),
        receipt_fields=contract.receipt_fields if contract else (),
        evidence={
            key: value for key, value in (case.evidence or {}).items() if value not in (None, "")
        },
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
        operation_id=data.get("operation_id", ""),
        fields=data.get("fields") or {},
    )
    return (
        f"Resolved {effect.pk} as {data['outcome']}, with your evidence on record; "
        f"case {case.pk} is closed."
    )


def _case_close(request: ConsoleRequest, case: Any, data: dict[str, Any]) -> str:
    services.case_close(case=case, principal=request.principal, note=data["note"])
    return f"Closed case {case.pk} of {case.effect_id}, with your note on record."


class CloseForm(forms.Form):
    note = forms.CharField(max_length=2000)


CASE_ACTIONS: dict[str, Action] = {
    "acknowledge": Action(NoteForm, _case_acknowledge),
    "resolve": Action(ResolveForm, _case_resolve),
    "close": Action(CloseForm, _case_close),
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

    def answer(**extra: Any) -> str:
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
                **extra,
            },
            request=request,
        )
        return html + badges_oob(request)

    run = spec.run
    response = perform(
        request,
        form=spec.form(request.POST),
        run=lambda data: run(request, case, data),
        back=back,
        target=f"#case-{case.pk}-error",
        answer=answer,
    )
    if response.status_code == 409 and is_partial(request):
        # Someone else got there first: the card is redrawn (out of band) with who did what.
        events = list(case.effect.events.order_by("-id")[:1])
        response.content = (
            response.content + answer(oob=True, changed_by=changed_by(events)).encode()
        )
    return response


# --- what reconciliation adds to the effect page (registered in ReconciliationConfig.ready) ---


@dataclass(frozen=True)
class RecordRun:
    """Consecutive records that say the same thing (eight identical failed lookups), shown as
    one row with a count: ``record`` is the latest of them."""

    record: Any
    count: int
    first_at: datetime


def record_runs(records: list[Any]) -> list[RecordRun]:
    runs: list[RecordRun] = []
    for record in records:
        same = (
            record.kind,
            record.lookup_by,
            record.lookup_status,
            record.provider_status,
            record.http_status,
            record.outcome,
            record.actor,
        )
        if runs and record.kind == choices.RecordKind.LOOKUP:
            last = runs[-1].record
            if same == (
                last.kind,
                last.lookup_by,
                last.lookup_status,
                last.provider_status,
                last.http_status,
                last.outcome,
                last.actor,
            ):
                runs[-1] = RecordRun(record, runs[-1].count + 1, runs[-1].first_at)
                continue
        runs.append(RecordRun(record, 1, record.created_at))
    return runs


def failing_since(records: list[Any]) -> datetime | None:
    """When the lookups that are failing now started failing (the provider did not answer),
    or None when the latest lookup got an answer."""
    since = None
    for record in reversed(records):
        if record.kind != choices.RecordKind.LOOKUP:
            break
        if record.lookup_status != choices.LookupStatus.UNREACHABLE:
            break
        since = record.created_at
    return since


def effect_panel(principal: Principal, effect: Effect) -> Panel:
    """The effect's unresolved human-queue case and its reconciliation records (lookups and
    manual resolutions), repeated lookups collapsed into one row with a count."""
    open_case = selectors.effect_open_case(effect)
    records = list(selectors.effect_records(effect))
    return Panel(
        {
            "open_case": open_case,
            "records": records,
            "record_runs": record_runs(records),
            "failing_since": failing_since(records),
        },
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
        operation_id=data.get("operation_id", ""),
        fields=data.get("fields") or {},
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


# --- who is on it, closing cases, failed compensations (registered in ReconciliationConfig) ---


def _take(request: ConsoleRequest, effect: Effect, data: dict[str, Any]) -> str:
    claims.effect_take(effect=effect, principal=request.principal, note=data.get("reason", ""))
    return f"You are on {effect.pk}: triage and its page say so."


def _release(request: ConsoleRequest, effect: Effect, data: dict[str, Any]) -> str:
    released = claims.effect_release(
        effect=effect, principal=request.principal, note=data.get("reason", "")
    )
    return f"Released {effect.pk}." if released else f"Nobody held {effect.pk}."


def _close_case(request: ConsoleRequest, effect: Effect, data: dict[str, Any]) -> str:
    open_case = selectors.effect_open_case(effect)
    if open_case is None:
        raise NotFound(f"{effect.pk} has no open case to close.")
    services.case_close(case=open_case, principal=request.principal, note=data["reason"])
    return f"Closed case {open_case.pk} of {effect.pk}, with your note on record."


def _record_fix(request: ConsoleRequest, effect: Effect, data: dict[str, Any]) -> str:
    case = services.effect_record_fix(
        effect=effect, principal=request.principal, note=data["reason"]
    )
    return f"Recorded the fix of {effect.pk} (case {case.pk}); it leaves the triage queue."


def needs_human(effect: Effect, page: dict[str, Any]) -> bool:
    """What the triage queue lists (an effect someone may want to say they are on)."""
    return (
        effect.status in TO_RECONCILE
        or effect.status == S.COMPENSATION_FAILED
        or effect.escalated
        or effect.mismatch
        or page.get("open_case") is not None
    )


def effect_holder_panel(principal: Principal, effect: Effect) -> Panel:
    """Who holds the effect, and who else has it open now."""
    holder = claims.effect_holder(effect)
    viewers = presence.effect_viewers(effect_id=effect.pk, principal=principal)
    return Panel(
        {"holder": holder, "viewers": viewers},
        token=(holder.principal_id if holder else None, viewers),
    )


CLAIM_ACTIONS: dict[str, EffectAction] = {
    "take": EffectAction(
        ReasonForm,
        _take,
        shown=lambda principal, effect, page: (
            _operator(principal) and page.get("holder") is None and needs_human(effect, page)
        ),
    ),
    "release": EffectAction(
        ReasonForm,
        _release,
        shown=lambda principal, effect, page: (
            _operator(principal) and page.get("holder") is not None
        ),
    ),
    "close-case": EffectAction(
        RequiredReasonForm,
        _close_case,
        shown=lambda principal, effect, page: (
            _operator(principal)
            and page.get("open_case") is not None
            and effect.status not in TO_RECONCILE
        ),
    ),
    "record-fix": EffectAction(
        RequiredReasonForm,
        _record_fix,
        shown=lambda principal, effect, page: (
            _operator(principal) and effect.status == S.COMPENSATION_FAILED
        ),
    ),
}


def _bulk_rearm(request: ConsoleRequest, ids: list[str], group: Any) -> str:
    done = bulk.effects_rearm(
        effect_ids=ids,
        actor=request.principal.label,
        principal=request.principal,
        reason=f"re-armed by hand with {len(ids)} effects escalated at {group.provider}",
    )
    return (
        f"Re-armed the lookups of {len(done)} of {len(ids)} effects: the reconciler asks "
        f"{group.provider} about them again on its next sweep."
    )


def _bulk_take(request: ConsoleRequest, ids: list[str], group: Any) -> str:
    result = bulk.effects_take(effect_ids=ids, principal=request.principal)
    refused = f"; {len(result.refused)} held by someone else" if result.refused else ""
    return f"You are on {result.changed} of {result.asked} effects{refused}."


BULK_ACTIONS: dict[str, BulkAction] = {
    # A background job (reconciliation.jobs): the click answers with the job's card.
    "reconcile": BulkAction(
        "Look up all {count} now",
        frozenset({"escalated", "unknown", "overdue", "settling"}),
        job_views.start_lookup,
        tone="primary",
        answer=job_views.jobs_oob,
    ),
    "rearm": BulkAction("Re-arm lookups of {count}", frozenset({"escalated"}), _bulk_rearm),
    "take": BulkAction("Take all {count}", frozenset(), _bulk_take),
}


# More open cases than this in one tenant and the rest show under Cases only.
OPEN_CASES_IN_TRIAGE = 2000


def has_open_case(tenant_id: int) -> Q:
    """For the triage queue: effects with an unresolved case (a confirmed effect whose later
    receipt disagrees), as a short list of ids read through the case_queue index — so the
    queue's own partial index still serves the rest of its query (the list as one array
    parameter: gateway.lib.any_of)."""
    ids = list(
        Case.objects.filter(tenant_id=tenant_id, state__in=sorted(choices.UNRESOLVED))
        .order_by("opened_at")
        .values_list("effect_id", flat=True)[:OPEN_CASES_IN_TRIAGE]
    )
    return Q(AnyOf("pk", ids))


def failure_fixed() -> Q:
    """A failed compensation someone fixed by hand (a case closed since it failed)."""
    return (
        Q(status=S.COMPENSATION_FAILED)
        & Q(
            Exists(
                Case.objects.filter(
                    effect=OuterRef("pk"),
                    state=choices.CaseState.RESOLVED,
                    resolved_at__gte=OuterRef("status_changed_at"),
                )
            )
        )
        & ~Q(
            Exists(Case.objects.filter(effect=OuterRef("pk"), state__in=sorted(choices.UNRESOLVED)))
        )
    )
