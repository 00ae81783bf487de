"""The operator console (SPEC §7): server-rendered pages, htmx fragments, and the actions of
§5 as forms that call the very services the API calls.

Pages: the triage queue, the effect page, the approvals inbox, the human queue of
reconciliation cases, the controls (freezes and capabilities) and the saga pages.

Every view is wrapped by ``console_view``: login required, the caller's principal resolved
once and everything scoped to its tenant, ``Vary: HX-Request`` on every answer, and domain
errors mapped once (``error_response``) to a readable message, never a stack trace.
A request is answered with a fragment only when ``is_partial(request)``; the same URL answers
with the full page otherwise, so every link and form works without JavaScript.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import wraps
from typing import Any
from urllib.parse import urlencode

from cryptography.fernet import InvalidToken
from django import forms
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.views import redirect_to_login
from django.db.models import Case, Count, IntegerField, Max, Q, QuerySet, Value, When
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import add_never_cache_headers, patch_vary_headers
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect, reswap, retarget

from gateway import capabilities, selectors, services
from gateway.choices import (
    BEFORE_DISPATCH,
    TERMINAL,
    TO_RECONCILE,
    EffectClass,
    EffectStatus,
    Role,
)
from gateway.contracts import CONTRACTS, EffectContract, get_contract
from gateway.errors import GatewayError, NotFound, NotPermitted, ValidationProblem
from gateway.models import Capability, Command, Effect, EffectTypeFreeze, Principal, Receipt
from gateway.templatetags.console import (
    approvals_badge,
    cases_badge,
    duration_label,
    money,
    since,
    until,
)
from reconciliation import choices as rec_choices
from reconciliation import selectors as rec_selectors
from reconciliation import services as rec_services
from reconciliation.models import OrphanReceipt
from sagas import choices as saga_choices
from sagas import definitions as saga_definitions
from sagas import selectors as saga_selectors
from sagas import services as saga_services
from sagas.api.serializers import receipt_summary

S = EffectStatus

# --- the one partial predicate, the principal, the one error mapping -------------------------


def is_partial(request: HttpRequest) -> bool:
    """Answer with a fragment: an htmx request that is neither boosted (it wants a whole page)
    nor a history restore (the browser lost its snapshot and needs the whole page)."""
    htmx = getattr(request, "htmx", None)
    return bool(htmx) and not htmx.boosted and not htmx.history_restore_request


def _principal_of(user) -> Principal | None:
    return Principal.objects.select_related("tenant").filter(user_id=user.pk).first()


def _finish(response: HttpResponse) -> HttpResponse:
    # The same URL answers with a page or a fragment: caches (and the browser's back button)
    # must keep them apart. Console pages are one user's view of live state: never stored.
    patch_vary_headers(response, ["HX-Request"])
    add_never_cache_headers(response)
    return response


def console_view(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Login required, ``request.principal`` set, domain errors mapped, ``Vary`` added."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            if request.htmx:
                # An expired session under a poll or a button: take the whole tab to the login
                # page (and back to the page it showed), instead of swapping it into a fragment.
                back = request.htmx.current_url_abs_path or request.get_full_path()
                return _finish(HttpResponseClientRedirect(redirect_to_login(back).url))
            return _finish(redirect_to_login(request.get_full_path()))
        principal = _principal_of(request.user)
        if principal is None:
            return _finish(render(request, "gateway/no_principal.html", status=403))
        request.principal = principal  # type: ignore[attr-defined]
        try:
            response = view(request, *args, **kwargs)
        except GatewayError as exc:
            response = error_response(request, exc)
        return _finish(response)

    return wrapper


def error_response(
    request: HttpRequest, exc: GatewayError, *, target: str = "#flash", back: str | None = None
) -> HttpResponse:
    """The console's one mapping of a domain error (STYLE 13).

    - htmx: the error partial, with the error's HTTP status, swapped into ``target`` (the
      flash region unless the caller names the form's own error slot);
    - a plain form post (no JavaScript): a flash message and a redirect back (``back``);
    - a plain page load (e.g. another tenant's effect): a readable error page.
    """
    context = {"error": exc, "title": exc.title, "detail": exc.detail}
    if is_partial(request):
        response = render(request, "partials/error.html", context, status=exc.status)
        return reswap(retarget(response, target), "innerHTML")
    if request.method == "POST" and back:
        messages.error(request, f"{exc.title}: {exc.detail}")
        return redirect(back)
    return render(request, "gateway/error.html", context, status=exc.status)


def _flash_oob(request: HttpRequest) -> str:
    """The flash region, swapped out of band next to a fragment (htmx answers)."""
    return render_to_string("partials/flash.html", {"oob": True}, request=request)


# --- display helpers ---------------------------------------------------------------------------


def _token(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:20]


def _role_may(principal: Principal, roles: Iterable[str]) -> bool:
    return principal.role in roles and not principal.frozen


# --- triage queue ---------------------------------------------------------------------------

TRIAGE_PAGE_SIZE = 50
# An IN_PROGRESS effect that has not moved for this long needs a look even if its next
# lookup is not due yet.
OVERDUE_AFTER = timedelta(minutes=10)
AGE_FILTERS = {"10m": timedelta(minutes=10), "1h": timedelta(hours=1), "24h": timedelta(days=1)}
SORTS = {"oldest": "oldest first", "newest": "newest first", "risk": "risk, then oldest"}
# Lower is riskier: money first, then writes outside our walls, then harmless repeats.
RISK_RANK = {
    EffectClass.FINANCIAL_WRITE: 0,
    EffectClass.EXTERNAL_WRITE: 1,
    EffectClass.IDEMPOTENT_WRITE: 2,
}


# The correlation ids of a command's context, in the order the effect page lists them; the
# triage queue filters on each with ``?context.<key>=<value>``, as the API does.
CORRELATION_KEYS = ("runtime", "agent", "session_id", "run_id", "thread_id", "call_id")


@dataclass(frozen=True)
class TriageFilters:
    """The triage queue's query string, parsed; unknown values fall back to "any"."""

    status: str = ""
    type: str = ""
    owner: str = ""
    age: str = ""
    sort: str = "oldest"
    after: str = ""
    # ((key, value), …): ``context.<key>=<value>`` for the keys of CONTEXT_FILTERS.
    context: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, params) -> TriageFilters:
        status = params.get("status", "")
        type_ = params.get("type", "")
        owner = params.get("owner", "")
        age = params.get("age", "")
        sort = params.get("sort", "oldest")
        return cls(
            status=status if status in S.values else "",
            type=type_ if type_ in CONTRACTS else "",
            owner=owner if owner in _owners() else "",
            age=age if age in AGE_FILTERS else "",
            sort=sort if sort in SORTS else "oldest",
            after=params.get("after", "")[:80],
            context=tuple(
                (key, params[f"context.{key}"][:200])
                for key in CORRELATION_KEYS
                if params.get(f"context.{key}")
            ),
        )

    def querystring(self, **changes: Any) -> str:
        values = {**self.__dict__, **changes}
        context = values.pop("context")
        after = values.pop("after")
        pairs = [(k, v) for k, v in values.items() if v and (k, v) != ("sort", "oldest")]
        pairs += [(f"context.{key}", value) for key, value in context]
        if after:
            pairs.append(("after", after))
        return urlencode(pairs)

    def without_context(self, key: str) -> str:
        """The first page of the same filters, less one correlation filter."""
        return self.querystring(after="", context=tuple(p for p in self.context if p[0] != key))

    @property
    def active(self) -> bool:
        return bool(self.status or self.type or self.owner or self.age or self.context)


def _owners() -> list[str]:
    return sorted({contract.owner for contract in CONTRACTS.values()})


def _risk_rank() -> Case:
    whens = [
        When(type__in=[c.type for c in CONTRACTS.values() if c.effect_class == cls], then=rank)
        for cls, rank in RISK_RANK.items()
    ]
    return Case(*whens, default=Value(len(RISK_RANK)), output_field=IntegerField())


def effects_for_triage(*, principal: Principal, now: datetime) -> QuerySet[Effect]:
    """What needs a human in the caller's tenant: UNKNOWN, overdue IN_PROGRESS, mismatches,
    escalations and failed compensations. Served by the ``effect_triage`` partial index."""
    overdue = Q(status=S.IN_PROGRESS) & (
        Q(next_check_at__lt=now) | Q(status_changed_at__lt=now - OVERDUE_AFTER)
    )
    needs_human = (
        Q(status__in=[S.UNKNOWN, S.COMPENSATION_FAILED])
        | overdue
        | Q(mismatch=True)
        | Q(escalated=True)
    )
    return Effect.objects.filter(needs_human, tenant_id=principal.tenant_id)


def _apply_filters(query: QuerySet[Effect], filters: TriageFilters, now: datetime):
    if filters.status:
        query = query.filter(status=filters.status)
    if filters.type:
        query = query.filter(type=filters.type)
    if filters.owner:
        query = query.filter(owner=filters.owner)
    if filters.age:
        query = query.filter(created_at__lte=now - AGE_FILTERS[filters.age])
    # The filter of gateway.selectors.effects_filtered(context=…), which the API's list uses.
    for key, value in filters.context:
        query = query.filter(**{f"command__context__{key}": value})
    return query


def _keyset(query: QuerySet[Effect], filters: TriageFilters) -> QuerySet[Effect]:
    """Order and seek by the time-ordered primary key (plus the risk rank when sorting by
    risk): the cost of a page does not grow with its depth, unlike OFFSET."""
    after = filters.after
    if filters.sort == "newest":
        query = query.order_by("-command")
        return query.filter(command__lt=after) if after else query
    if filters.sort == "risk":
        query = query.annotate(risk=_risk_rank()).order_by("risk", "command")
        rank, _, pk = after.partition(".")
        if rank.isdigit() and pk:
            query = query.filter(Q(risk__gt=int(rank)) | Q(risk=int(rank), command__gt=pk))
        return query
    query = query.order_by("command")
    return query.filter(command__gt=after) if after else query


@dataclass
class TriageRow:
    effect: Effect
    contract: EffectContract | None
    age: str
    in_status: str
    cost: str
    overdue: bool
    reasons: list[tuple[str, str]] = field(default_factory=list)
    # "claude-code · refund-bot": the runtime and agent of the command's context, if given.
    correlation: str = ""


def correlation_label(context: Any) -> str:
    if not isinstance(context, dict):
        return ""
    return " · ".join(str(context[key]) for key in ("runtime", "agent") if context.get(key))


def _triage_row(effect: Effect, now: datetime) -> TriageRow:
    overdue = effect.status == S.IN_PROGRESS and (
        (effect.next_check_at is not None and effect.next_check_at < now)
        or effect.status_changed_at < now - OVERDUE_AFTER
    )
    # Why it is here beyond its status badge (UNKNOWN and COMPENSATION_FAILED say it
    # themselves), with a chip tone: said in words, coloured for scanning.
    reasons: list[tuple[str, str]] = []
    if overdue:
        reasons.append(("overdue", "attention"))
    if effect.mismatch:
        reasons.append(("receipt mismatch", "danger"))
    if effect.escalated:
        reasons.append(("escalated", "attention"))
    return TriageRow(
        effect=effect,
        contract=get_contract(effect.type),
        age=duration_label(now - effect.created_at),
        in_status=duration_label(now - effect.status_changed_at),
        cost=money(effect.command.payload_redacted),
        overdue=overdue,
        reasons=reasons,
        correlation=correlation_label(effect.command.context),
    )


def _triage_context(request: HttpRequest) -> dict[str, Any]:
    principal: Principal = request.principal  # type: ignore[attr-defined]
    now = timezone.now()
    filters = TriageFilters.parse(request.GET)
    matching = _apply_filters(effects_for_triage(principal=principal, now=now), filters, now)
    summary = matching.aggregate(count=Count("pk"), latest=Max("updated_at"))
    page = list(
        _keyset(matching, filters)
        .select_related("command")
        .defer("command__payload_sealed", "command__intent")[: TRIAGE_PAGE_SIZE + 1]
    )
    has_next = len(page) > TRIAGE_PAGE_SIZE
    page = page[:TRIAGE_PAGE_SIZE]
    rows = [_triage_row(effect, now) for effect in page]
    next_query = ""
    if has_next:
        last = page[-1]
        cursor = f"{last.risk}.{last.pk}" if filters.sort == "risk" else last.pk
        next_query = filters.querystring(after=cursor)
    alerts, more_alerts = saga_alerts(principal)
    # What the fragment shows, and nothing else: the poll answers 204 while it is unchanged.
    token = _token(
        filters.querystring(),
        summary["count"],
        summary["latest"],
        [(r.effect.pk, r.effect.updated_at, r.age, r.in_status, r.overdue) for r in rows],
        has_next,
        [(run.pk, run.state, run.frozen, run.updated_at, since(run.updated_at)) for run in alerts],
    )
    return {
        "filters": filters,
        "context_chips": [
            (key, value, filters.without_context(key)) for key, value in filters.context
        ],
        "saga_alerts": alerts,
        "more_saga_alerts": more_alerts,
        "rows": rows,
        "count": summary["count"],
        "next_query": next_query,
        "first_query": filters.querystring(after=""),
        "token": token,
        "statuses": S.values,
        "types": sorted(CONTRACTS),
        "owners": _owners(),
        "age_filters": [
            ("10m", "older than 10 min"),
            ("1h", "older than 1 h"),
            ("24h", "older than 1 day"),
        ],
        "sorts": SORTS,
        "sort_label": SORTS[filters.sort],
        "now": now,
        "view_name": "triage",
    }


@require_GET
@console_view
def triage(request: HttpRequest) -> HttpResponse:
    """``/``: the triage queue, with filters, keyset pages and a 5 s poll of its table."""
    context = _triage_context(request)
    if is_partial(request):
        if request.GET.get("since") == context["token"]:
            # Nothing the table shows has changed: keep the DOM (and the reader's place).
            return reswap(HttpResponse(status=204), "none")
        return render(request, "gateway/effect_triage.html#queue", context)
    return render(request, "gateway/effect_triage.html", context)


# --- effect page ---------------------------------------------------------------------------

MISSING = object()


@dataclass(frozen=True)
class FieldRow:
    """One line of the command/receipt comparison."""

    name: str
    command: Any = MISSING
    receipt: Any = MISSING
    differs: bool = False

    @property
    def command_missing(self) -> bool:
        return self.command is MISSING

    @property
    def receipt_missing(self) -> bool:
        return self.receipt is MISSING


def comparison(
    *,
    command: Command,
    clear_payload: dict[str, Any],
    shown_payload: dict[str, Any],
    receipt: Receipt | None,
    hidden: Iterable[str],
) -> list[FieldRow]:
    """The field-level diff of the command and the latest receipt.

    Compared on the clear values; shown with ``shown_payload`` (redacted for viewers who may
    not see the payload), and a receipt field that names a hidden field is hidden too.
    """
    hidden = set(hidden)
    result = receipt.result if receipt is not None and isinstance(receipt.result, dict) else {}
    rows = [
        FieldRow(
            "payload_digest",
            command.payload_digest,
            (receipt.payload_digest or "(none)") if receipt is not None else MISSING,
            differs=receipt is not None and not receipt.digest_matches,
        )
    ]
    for name, clear in clear_payload.items():
        answered = result.get(name, MISSING)
        differs = answered is not MISSING and answered is not None and answered != clear
        if answered is not MISSING and name in hidden:
            answered = services.REDACTED
        rows.append(FieldRow(f"payload.{name}", shown_payload.get(name), answered, differs))
    for name, value in result.items():
        if name not in clear_payload:
            rows.append(FieldRow(f"result.{name}", MISSING, value))
    return rows


@dataclass(frozen=True)
class Compensation:
    compensator: str | None
    window: timedelta | None
    ends_at: datetime | None
    time_left: str
    open: bool | None
    boundary: str | None
    irreversible: bool
    automatic: bool
    past_boundary: bool


def _compensation(
    effect: Effect, contract: EffectContract | None, receipt: Receipt | None, now: datetime
) -> Compensation | None:
    if contract is None:
        return None
    ends_at = None
    if contract.compensation_window and effect.confirmed_at:
        ends_at = effect.confirmed_at + contract.compensation_window
    time_left, is_open = "", None
    if ends_at is not None:
        is_open = ends_at > now
        time_left = (
            f"{duration_label(ends_at - now)} left"
            if is_open
            else f"closed {duration_label(now - ends_at)} ago"
        )
    return Compensation(
        compensator=contract.compensator,
        window=contract.compensation_window,
        ends_at=ends_at,
        time_left=time_left,
        open=is_open,
        boundary=contract.irreversible_boundary,
        irreversible=contract.irreversible,
        automatic=contract.automatic_compensation,
        past_boundary=bool(
            contract.irreversible_boundary
            and receipt is not None
            and contract.irreversible_boundary
            in (receipt.provider_status, (receipt.result or {}).get("state"))
        ),
    )


def _reconciliation(effect: Effect) -> tuple[Any, list[Any]]:
    """The effect's unresolved human-queue case and its reconciliation records (lookups and
    manual resolutions)."""
    return rec_selectors.effect_open_case(effect), list(rec_selectors.effect_records(effect))


def _may_compensate(effect: Effect, contract: EffectContract | None, now: datetime) -> bool:
    if contract is None or not contract.compensator or contract.compensation is None:
        return False
    if effect.status != S.CONFIRMED:
        return False
    if contract.compensation_window and effect.confirmed_at:
        return now <= effect.confirmed_at + contract.compensation_window
    return True


def resolvable(effect: Effect) -> bool:
    """Whether an operator's resolution with evidence could apply (effect_resolve decides)."""
    return effect.status in TO_RECONCILE or (effect.status == S.NOT_STARTED and effect.escalated)


def available_actions(principal: Principal, effect: Effect, *, open_case: Any = None) -> set[str]:
    """The buttons to show. The services decide again (and refuse with a reason); this only
    keeps buttons that could never work off the screen."""
    actions: set[str] = set()
    operator = _role_may(principal, services.OPERATOR_ROLES)
    if effect.status == S.AWAITING_APPROVAL and _role_may(principal, services.APPROVER_ROLES):
        actions.add("reject")
        if effect.command.requested_by_id != principal.pk:
            actions.add("approve")
    if operator:
        if effect.frozen:
            actions.add("unfreeze")
        elif effect.status not in TERMINAL:
            actions.add("freeze")
        if effect.status in TO_RECONCILE:
            actions.add("reconcile")
        if resolvable(effect):
            actions.add("resolve")
        if open_case is not None and getattr(open_case, "state", "") == "open":
            actions.add("acknowledge")
        if _may_compensate(effect, get_contract(effect.type), timezone.now()):
            actions.add("compensate")
    requester = effect.command.requested_by_id == principal.pk
    if effect.status in BEFORE_DISPATCH and (operator or (requester and not principal.frozen)):
        actions.add("cancel")
    return actions


def _open_payload(command: Command) -> dict[str, Any] | None:
    """The clear payload, or None when the vault key that sealed it is not configured (a
    rotation gone wrong): the page then shows the redacted payload instead of failing."""
    try:
        return services.command_payload(command)
    except InvalidToken:
        return None


def _effect_context(request: HttpRequest, effect: Effect) -> dict[str, Any]:
    principal: Principal = request.principal  # type: ignore[attr-defined]
    now = timezone.now()
    command = effect.command
    contract = get_contract(effect.type)
    clear = _open_payload(command)
    sealed_unreadable = clear is None
    if clear is None:
        clear = command.payload_redacted
    may_see = selectors.may_see_payload(principal, effect) and not sealed_unreadable
    shown = clear if may_see else command.payload_redacted
    receipt = selectors.effect_latest_receipt(effect)
    hidden = () if may_see or contract is None else contract.personal_fields
    events = list(selectors.effect_events(effect))
    attempts = list(effect.attempts.order_by("number"))
    compensations = list(
        Command.objects.filter(compensates_id=effect.pk).select_related("effect").order_by("pk")
    )
    open_case, records = _reconciliation(effect)
    saga = _effect_saga(principal, command)
    token = _token(
        effect.updated_at,
        effect.status,
        events[-1].pk if events else None,
        receipt.pk if receipt else None,
        [(a.pk, a.state) for a in attempts],
        [c.effect.status for c in compensations if hasattr(c, "effect")],
        duration_label(now - effect.status_changed_at),
        duration_label(abs(command.expires_at - now)),
        (open_case.pk, open_case.state) if open_case is not None else None,
        records[-1].pk if records else None,
        (saga.state, saga.frozen) if saga is not None else None,
    )
    return {
        "effect": effect,
        "command": command,
        "contract": contract,
        "may_see_payload": may_see,
        "sealed_unreadable": sealed_unreadable,
        "payload": shown,
        "cost": money(shown),
        "receipt": receipt,
        "receipt_count": effect.receipts.count() if receipt else 0,
        "rows": comparison(
            command=command,
            clear_payload=clear,
            shown_payload=shown,
            receipt=receipt,
            hidden=hidden,
        ),
        "attempts": attempts,
        "events": events,
        "compensation": _compensation(effect, contract, receipt, now),
        "compensations": compensations,
        "open_case": open_case,
        "records": records,
        "correlation": correlation(command.context),
        "other_context": {
            key: value
            for key, value in (command.context or {}).items()
            if key not in CORRELATION_KEYS
        },
        "saga": saga,
        "actions": available_actions(principal, effect, open_case=open_case),
        "in_status": duration_label(now - effect.status_changed_at),
        "token": token,
        "now": now,
        "view_name": "effect",
    }


@dataclass(frozen=True)
class Correlation:
    """One correlation id of a command's context, with the triage queue filtered by it."""

    key: str
    value: Any
    url: str  # "" when the value is not a string (the filter compares strings)


def correlation(context: Any) -> list[Correlation]:
    if not isinstance(context, dict):
        return []
    triage = reverse("console:triage")
    found = []
    for key in CORRELATION_KEYS:
        value = context.get(key)
        if value in (None, ""):
            continue
        url = f"{triage}?{urlencode({f'context.{key}': value})}" if isinstance(value, str) else ""
        found.append(Correlation(key, value, url))
    return found


def _effect_saga(principal: Principal, command: Command) -> Any:
    """The saga run this effect is a step of, when it is one."""
    if not command.saga_id:
        return None
    return saga_selectors.sagas_for_principal(principal).filter(pk=command.saga_id).first()


def _load_effect(request: HttpRequest, effect_id: str) -> Effect:
    # Another tenant's effect does not exist for this caller: NotFound, mapped to a 404.
    return selectors.effect_get(principal=request.principal, effect_id=effect_id)  # type: ignore[attr-defined]


@require_GET
@console_view
def effect_detail(request: HttpRequest, effect_id: str) -> HttpResponse:
    """``/effects/<id>``: intent, command and receipt side by side, timelines, compensation."""
    effect = _load_effect(request, effect_id)
    context = _effect_context(request, effect)
    if is_partial(request):
        if request.GET.get("since") == context["token"]:
            return reswap(HttpResponse(status=204), "none")
        return render(request, "gateway/effect_detail.html#effect", context)
    return render(request, "gateway/effect_detail.html", context)


# --- approvals inbox -----------------------------------------------------------------------

APPROVALS_PAGE_SIZE = 25


@dataclass
class ApprovalCard:
    effect: Effect
    contract: EffectContract | None
    headline: str
    cost: str
    payload: dict[str, Any]
    mine: bool
    can_decide: bool


def plain_words(effect: Effect, contract: EffectContract | None, payload: dict) -> str:
    """What the command will do, in one sentence an approver can check against the payload."""
    resource = effect.command.resource or {}
    target = f"{resource.get('type', 'resource')} {resource.get('id', '?')}"
    if resource.get("version") is not None:
        target += f" (expected version {resource['version']})"
    what = contract.description.rstrip(".") if contract else effect.type
    cost = money(payload)
    details = [cost] if cost else []
    for name in (
        "environment",
        "sha",
        "release",
        "sku",
        "quantity",
        "priority",
        "title",
        "subject",
        "reason",
    ):
        value = payload.get(name)
        if value not in (None, "", services.REDACTED):
            details.append(f"{name} {value}")
    sentence = f"{what} — on {target}"
    if details:
        sentence += ": " + ", ".join(str(d) for d in details)
    return sentence + "."


def _approval_card(principal: Principal, effect: Effect) -> ApprovalCard:
    contract = get_contract(effect.type)
    payload = effect.command.payload_redacted
    mine = effect.command.requested_by_id == principal.pk
    return ApprovalCard(
        effect=effect,
        contract=contract,
        headline=plain_words(effect, contract, payload),
        cost=money(payload),
        payload=payload,
        mine=mine,
        can_decide=effect.status == S.AWAITING_APPROVAL
        and _role_may(principal, services.APPROVER_ROLES),
    )


def _approvals_context(request: HttpRequest) -> dict[str, Any]:
    principal: Principal = request.principal  # type: ignore[attr-defined]
    after = request.GET.get("after", "")[:80]
    query = (
        selectors.effects_for_principal(principal)
        .filter(status=S.AWAITING_APPROVAL)
        .defer("command__payload_sealed")
        .order_by("command")
    )
    summary = query.aggregate(count=Count("pk"), latest=Max("updated_at"))
    if after:
        query = query.filter(command__gt=after)
    page = list(query[: APPROVALS_PAGE_SIZE + 1])
    has_next = len(page) > APPROVALS_PAGE_SIZE
    page = page[:APPROVALS_PAGE_SIZE]
    cards = [_approval_card(principal, effect) for effect in page]
    return {
        "cards": cards,
        "count": summary["count"],
        "after": after,
        "next_query": urlencode({"after": page[-1].pk}) if has_next else "",
        # The cards and their "… ago" / "expires in …" labels: the poll redraws when they move.
        "token": _token(
            after,
            summary["count"],
            summary["latest"],
            [
                (c.effect.pk, since(c.effect.created_at), until(c.effect.command.expires_at))
                for c in cards
            ],
        ),
        "may_approve": _role_may(principal, services.APPROVER_ROLES),
        "now": timezone.now(),
        "view_name": "approvals",
    }


@require_GET
@console_view
def approvals(request: HttpRequest) -> HttpResponse:
    """``/approvals``: commands waiting for an approver, in plain words, with their digest."""
    context = _approvals_context(request)
    if is_partial(request):
        if request.GET.get("since") == context["token"]:
            return reswap(HttpResponse(status=204), "none")
        return render(request, "gateway/effect_approvals.html#inbox", context)
    return render(request, "gateway/effect_approvals.html", context)


# --- actions -----------------------------------------------------------------------------------


def normalise_digest(value: str) -> str:
    """What an approver pastes: surrounding blanks and a missing ``sha256:`` are forgiven;
    the hex itself must be the command's, character for character."""
    value = "".join(value.split()).lower()
    if value and not value.startswith("sha256:"):
        value = "sha256:" + value
    return value


class ApproveForm(forms.Form):
    payload_digest = forms.CharField(
        label="Digest you read",
        max_length=100,
        help_text="Type or paste the payload digest shown above; it must be the command's.",
    )
    comment = forms.CharField(max_length=2000, required=False, widget=forms.Textarea)

    def clean_payload_digest(self) -> str:
        return normalise_digest(self.cleaned_data["payload_digest"])


class ReasonForm(forms.Form):
    reason = forms.CharField(max_length=2000, required=False)


class RequiredReasonForm(forms.Form):
    reason = forms.CharField(max_length=2000)


class ResolveForm(forms.Form):
    outcome = forms.ChoiceField(
        choices=[
            ("confirmed", "confirmed — the provider did it"),
            ("not_started", "not started — the provider never received it"),
        ],
        widget=forms.RadioSelect,
    )
    evidence = forms.CharField(
        max_length=4000,
        widget=forms.Textarea,
        help_text="What proves it: a provider console link, a ticket, a statement line.",
    )


def _approve(request, effect, data) -> str:
    services.effect_approve(
        effect=effect,
        principal=request.principal,
        payload_digest=data["payload_digest"],
        comment=data.get("comment", ""),
    )
    return f"Approved {effect.pk}: digest {data['payload_digest'][:19]}… is queued for dispatch."


def _reject(request, effect, data) -> str:
    services.effect_reject(effect=effect, principal=request.principal, reason=data["reason"])
    return f"Rejected {effect.pk}."


def _freeze(request, effect, data) -> str:
    services.effect_set_frozen(
        effect=effect, principal=request.principal, frozen=True, reason=data["reason"]
    )
    return f"Froze {effect.pk}: nothing of it will be dispatched until it is unfrozen."


def _unfreeze(request, effect, data) -> str:
    services.effect_set_frozen(
        effect=effect, principal=request.principal, frozen=False, reason=data["reason"]
    )
    return f"Unfroze {effect.pk}."


def _cancel(request, effect, data) -> str:
    services.effect_cancel(effect=effect, principal=request.principal, reason=data["reason"])
    return f"Cancelled {effect.pk} before dispatch."


def _reconcile(request, effect, data) -> str:
    # Not an operator: refuse before the provider is asked anything on the caller's behalf.
    if not _role_may(request.principal, services.OPERATOR_ROLES):
        raise NotPermitted(f"A principal with role {request.principal.role} cannot reconcile.")
    rec_services.effect_reconcile(
        effect_id=effect.pk, actor=request.principal.label, principal=request.principal
    )
    effect.refresh_from_db()
    return f"Asked the provider about {effect.pk}: it is now {effect.status}."


def _resolve(request, effect, data) -> str:
    rec_services.effect_resolve(
        effect=effect,
        principal=request.principal,
        outcome=data["outcome"],
        evidence=data["evidence"],
    )
    effect.refresh_from_db()
    return f"Resolved {effect.pk} as {data['outcome']}, with your evidence on record."


def _acknowledge(request, effect, data) -> str:
    open_case = rec_selectors.effect_open_case(effect)
    if open_case is None:
        raise NotFound(f"{effect.pk} has no open case to acknowledge.")
    rec_services.case_acknowledge(case=open_case, principal=request.principal, note=data["reason"])
    return f"You took case {open_case.pk} of {effect.pk}."


def _compensate(request, effect, data) -> str:
    submission = services.effect_compensate(
        effect=effect, principal=request.principal, reason=data["reason"]
    )
    issued = submission.effect
    return (
        f"Issued compensation {issued.pk} ({issued.type}), {issued.status}; "
        f"{effect.pk} is now COMPENSATING."
    )


@dataclass(frozen=True)
class Action:
    """A console action: the form it validates, and the call of the one service the API
    calls (``run(request, object, cleaned_data)``), which returns what to tell the operator."""

    form: type[forms.Form]
    run: Callable[[HttpRequest, Any, dict[str, Any]], str]


ACTIONS: dict[str, Action] = {
    "approve": Action(ApproveForm, _approve),
    "reject": Action(ReasonForm, _reject),
    "freeze": Action(ReasonForm, _freeze),
    "unfreeze": Action(ReasonForm, _unfreeze),
    "cancel": Action(ReasonForm, _cancel),
    "reconcile": Action(ReasonForm, _reconcile),
    "resolve": Action(ResolveForm, _resolve),
    "acknowledge": Action(ReasonForm, _acknowledge),
    "compensate": Action(RequiredReasonForm, _compensate),
}


def _form_problem(form: forms.Form) -> GatewayError:
    errors = {name: [str(e) for e in errs] for name, errs in form.errors.items()}
    detail = "; ".join(f"{name}: {' '.join(msgs)}" for name, msgs in errors.items())
    return ValidationProblem(f"The form is not complete — {detail}", errors=errors)


@require_POST
@console_view
def effect_action(request: HttpRequest, effect_id: str, action: str) -> HttpResponse:
    """POST ``/effects/<id>/<action>``: validate the form, call the one service the API calls,
    answer with the changed fragment and a flash (htmx) or redirect back (no JavaScript)."""
    spec = ACTIONS.get(action)
    if spec is None:
        raise NotFound(f"No action {action!r}.")
    effect = _load_effect(request, effect_id)
    from_inbox = request.POST.get("view") == "approvals"
    back = (
        reverse("console:approvals") if from_inbox else reverse("console:effect", args=[effect.pk])
    )
    target = f"#approval-{effect.pk}-error" if from_inbox else "#flash"

    def answer() -> str:
        fresh = _load_effect(request, effect_id)
        if from_inbox:
            card = _approval_card(request.principal, fresh)  # type: ignore[attr-defined]
            html = render_to_string(
                "gateway/effect_approvals.html#card", {"card": card}, request=request
            )
        else:
            html = render_to_string(
                "gateway/effect_detail.html#effect",
                _effect_context(request, fresh),
                request=request,
            )
        # The nav's counts may have changed too (an approval, a case taken or settled).
        return html + _badges_oob(request)

    return _perform(
        request,
        form=spec.form(request.POST),
        run=lambda data: spec.run(request, effect, data),
        back=back,
        target=target,
        answer=answer,
    )


def _badges_oob(request: HttpRequest) -> str:
    """The nav's counts, swapped out of band after an action that may have changed them."""
    context = {"request": request}
    return approvals_badge(context, oob=True) + cases_badge(context, oob=True)


def _perform(
    request: HttpRequest,
    *,
    form: forms.Form,
    run: Callable[[dict[str, Any]], str],
    back: str,
    answer: Callable[[], str],
    target: str = "#flash",
) -> HttpResponse:
    """The one shape of every console action: validate the form, call the service (``run``
    returns what to tell the operator), then answer with the changed fragment and the flash
    (htmx) or with a redirect back (no JavaScript). A domain error changes nothing and goes
    through ``error_response``, into ``target`` (the flash region or the form's error slot).
    """
    try:
        if not form.is_valid():
            raise _form_problem(form)
        message = run(form.cleaned_data)
    except GatewayError as exc:
        return error_response(request, exc, target=target, back=back)
    messages.success(request, message)
    if not is_partial(request):
        return redirect(back)
    return HttpResponse(answer() + _flash_oob(request))


# --- the human queue: reconciliation cases -----------------------------------------------------

CASES_PAGE_SIZE = 50
ORPHANS_SHOWN = 50


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
            owner=owner if owner in _owners() else "",
            reason=reason if reason in rec_choices.CaseReason.values else "",
            state=state if state in rec_choices.CaseState.values else "",
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
    operator = _role_may(principal, services.OPERATOR_ROLES)
    unresolved = case.state in rec_choices.UNRESOLVED
    return CaseRow(
        case=case,
        age=duration_label(now - case.opened_at),
        cost=money(case.effect.command.payload_redacted),
        may_acknowledge=operator and case.state == rec_choices.CaseState.OPEN,
        may_resolve=operator and unresolved and resolvable(case.effect),
    )


def _cases_query(principal: Principal, filters: CaseFilters) -> QuerySet:
    return (
        rec_selectors.cases_queue(
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
        tenant_id=principal.tenant_id, state=rec_choices.OrphanState.OPEN
    )
    return list(query.order_by("received_at", "id")[:ORPHANS_SHOWN]), query.count()


def _cases_context(request: HttpRequest, *, full: bool) -> dict[str, Any]:
    principal: Principal = request.principal  # type: ignore[attr-defined]
    now = timezone.now()
    filters = CaseFilters.parse(request.GET)
    query = _cases_query(principal, filters)
    count = query.count()
    if filters.after:
        # Keyset on the queue's order (opened_at, id): the anchor is read among all of the
        # tenant's cases, since it may have been resolved since the page was drawn.
        anchor = (
            rec_selectors.cases_for_principal(principal)
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
        "token": _token(
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
        "owners": _owners(),
        "reasons": rec_choices.CaseReason.choices,
        "states": [
            (rec_choices.CaseState.OPEN, "open"),
            (rec_choices.CaseState.ACKNOWLEDGED, "acknowledged"),
            (rec_choices.CaseState.RESOLVED, "resolved"),
        ],
        "resolve_outcomes": ResolveForm.base_fields["outcome"].choices,
        "now": now,
        "view_name": "cases",
    }
    if full:
        orphans, orphan_count = orphan_receipts(principal)
        context.update(
            orphans=orphans,
            orphan_count=orphan_count,
            may_see_results=principal.role in selectors.PAYLOAD_ROLES,
        )
    return context


@require_GET
@console_view
def cases(request: HttpRequest) -> HttpResponse:
    """``/cases``: the human queue, oldest first, with filters; orphan receipts below."""
    partial = is_partial(request)
    context = _cases_context(request, full=not partial)
    if partial:
        if request.GET.get("since") == context["token"]:
            return reswap(HttpResponse(status=204), "none")
        return render(request, "reconciliation/case_queue.html#cases", context)
    return render(request, "reconciliation/case_queue.html", context)


class NoteForm(forms.Form):
    note = forms.CharField(max_length=2000, required=False)


def _case_acknowledge(request: HttpRequest, case: Any, data: dict[str, Any]) -> str:
    rec_services.case_acknowledge(case=case, principal=request.principal, note=data["note"])  # type: ignore[attr-defined]
    return f"You took case {case.pk} of {case.effect_id}."


def _case_resolve(request: HttpRequest, case: Any, data: dict[str, Any]) -> str:
    effect = _load_effect(request, case.effect_id)
    rec_services.effect_resolve(
        effect=effect,
        principal=request.principal,  # type: ignore[attr-defined]
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
def case_action(request: HttpRequest, case_id: str, action: str) -> HttpResponse:
    """POST ``/cases/<id>/<action>``: take a case (``case_acknowledge``) or resolve its effect
    with evidence (``effect_resolve``), answered with the case's card in place."""
    spec = CASE_ACTIONS.get(action)
    if spec is None:
        raise NotFound(f"No action {action!r}.")
    principal: Principal = request.principal  # type: ignore[attr-defined]
    case = rec_selectors.case_get(principal=principal, case_id=case_id)
    # Back to the page of the queue the form was on (its filters, re-parsed: never a URL
    # taken from the form as it is).
    filters = CaseFilters.parse(QueryDict(request.POST.get("filters", "")))
    back = reverse("console:cases") + (f"?{filters.querystring()}" if filters.active else "")

    def answer() -> str:
        fresh = (
            rec_selectors.cases_for_principal(principal)
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
                "resolve_outcomes": ResolveForm.base_fields["outcome"].choices,
            },
            request=request,
        )
        return html + _badges_oob(request)

    return _perform(
        request,
        form=spec.form(request.POST),
        run=lambda data: spec.run(request, case, data),
        back=back,
        target=f"#case-{case.pk}-error",
        answer=answer,
    )


# --- controls: freezes and capabilities -------------------------------------------------------

GRANTS_SHOWN = 100
# What "expires in" offers when granting (seconds; None: the grant does not expire).
GRANT_EXPIRIES = [
    ("", "never"),
    ("3600", "in 1 hour"),
    ("28800", "in 8 hours"),
    ("86400", "in 1 day"),
    ("604800", "in 7 days"),
    ("2592000", "in 30 days"),
    ("7776000", "in 90 days"),
]


def _require_controls(principal: Principal) -> None:
    """The controls are the freezers' (the roles the capabilities services accept)."""
    if principal.role not in capabilities.FREEZER_ROLES:
        raise NotPermitted(
            f"The controls are for operators and admins; you are signed in as "
            f"{principal.role}. Ask an operator to freeze or unfreeze, or an admin for a grant."
        )


@dataclass(frozen=True)
class TypeRow:
    contract: EffectContract
    freeze: EffectTypeFreeze | None


@dataclass(frozen=True)
class GrantRow:
    grant: Capability
    state: str  # live, expired, revoked
    count: str
    amount: str


def _budget_amount(amount: int, currency: str) -> str:
    return money({"amount": amount, "currency": currency}) or f"{amount:,} (minor units)"


def _grant_row(grant: Capability, now: datetime) -> GrantRow:
    if grant.revoked_at is not None:
        state = "revoked"
    elif grant.expires_at is not None and grant.expires_at <= now:
        state = "expired"
    else:
        state = "live"
    count = (
        f"{grant.spent_count} of {grant.budget_count}"
        if grant.budget_count is not None
        else "no limit"
    )
    amount = "—"
    if grant.budget_amount is not None:
        currency = grant.budget_currency
        amount = (
            f"{_budget_amount(grant.spent_amount, currency)} of "
            f"{_budget_amount(grant.budget_amount, currency)}"
        )
    return GrantRow(grant=grant, state=state, count=count, amount=amount)


def type_freezes(principal: Principal) -> dict[str, EffectTypeFreeze]:
    return {
        freeze.type: freeze
        for freeze in EffectTypeFreeze.objects.filter(tenant_id=principal.tenant_id).select_related(
            "frozen_by"
        )
    }


def capabilities_for_principal(principal: Principal) -> QuerySet[Capability]:
    """Grants of the caller's tenant, newest first (what the API's list shows)."""
    return (
        Capability.objects.filter(tenant_id=principal.tenant_id)
        .select_related("principal")
        .order_by("-created_at", "-id")
    )


def _controls_context(request: HttpRequest) -> dict[str, Any]:
    principal: Principal = request.principal  # type: ignore[attr-defined]
    _require_controls(principal)
    now = timezone.now()
    freezes = type_freezes(principal)
    people = list(
        Principal.objects.filter(tenant_id=principal.tenant_id)
        .annotate(
            live_grants=Count(
                "capabilities",
                filter=Q(capabilities__revoked_at__isnull=True)
                & (Q(capabilities__expires_at__isnull=True) | Q(capabilities__expires_at__gt=now)),
            )
        )
        .order_by("role", "name")
    )
    grants = list(capabilities_for_principal(principal)[:GRANTS_SHOWN])
    return {
        "types": [
            TypeRow(contract, freezes.get(name)) for name, contract in sorted(CONTRACTS.items())
        ],
        "frozen_types": len(freezes),
        "people": people,
        "agents": [p for p in people if p.role == Role.AGENT],
        "grants": [_grant_row(grant, now) for grant in grants],
        "grants_capped": len(grants) == GRANTS_SHOWN,
        "may_grant": principal.role in capabilities.GRANTOR_ROLES,
        "expiries": GRANT_EXPIRIES,
        "now": now,
        "view_name": "controls",
    }


@require_GET
@console_view
def controls(request: HttpRequest) -> HttpResponse:
    """``/controls``: frozen effect types, principals, capabilities (operators and admins)."""
    context = _controls_context(request)
    return render(request, "gateway/tenant_controls.html", context)


def _controls_answer(request: HttpRequest, section: str) -> Callable[[], str]:
    def answer() -> str:
        return render_to_string(
            f"gateway/tenant_controls.html#{section}", _controls_context(request), request=request
        )

    return answer


def _controls_perform(
    request: HttpRequest,
    *,
    form: forms.Form,
    run: Callable[[dict[str, Any]], str],
    section: str,
    target: str = "#flash",
) -> HttpResponse:
    return _perform(
        request,
        form=form,
        run=run,
        back=reverse("console:controls") + f"#{section}",
        target=target,
        answer=_controls_answer(request, section),
    )


@require_POST
@console_view
def effect_type_freeze(request: HttpRequest, effect_type: str, verb: str) -> HttpResponse:
    """POST ``/controls/types/<type>/freeze|unfreeze``: ``effect_type_set_frozen``."""
    principal: Principal = request.principal  # type: ignore[attr-defined]
    _require_controls(principal)
    if verb not in ("freeze", "unfreeze"):
        raise NotFound(f"No action {verb!r}.")
    if effect_type not in CONTRACTS:
        raise NotFound(f"No effect type {effect_type}.")
    freeze = verb == "freeze"

    def run(data: dict[str, Any]) -> str:
        changed = capabilities.effect_type_set_frozen(
            tenant_id=principal.tenant_id,
            effect_type=effect_type,
            principal=principal,
            frozen=freeze,
            reason=data["reason"],
        )
        if freeze:
            if not changed:
                return f"{effect_type} was already frozen."
            return (
                f"Froze {effect_type}: no command of this type is dispatched in "
                f"{principal.tenant.slug} until it is unfrozen."
            )
        if not changed:
            return f"{effect_type} was not frozen."
        return f"Unfroze {effect_type}: its commands may be dispatched again."

    return _controls_perform(
        request,
        form=(RequiredReasonForm if freeze else ReasonForm)(request.POST),
        run=run,
        section="types",
    )


@require_POST
@console_view
def principal_freeze(request: HttpRequest, name: str, verb: str) -> HttpResponse:
    """POST ``/controls/principals/<name>/freeze|unfreeze``: ``principal_set_frozen``."""
    principal: Principal = request.principal  # type: ignore[attr-defined]
    _require_controls(principal)
    if verb not in ("freeze", "unfreeze"):
        raise NotFound(f"No action {verb!r}.")
    target = Principal.objects.filter(tenant_id=principal.tenant_id, name=name).first()
    if target is None:
        raise NotFound(f"No principal {name}.")
    freeze = verb == "freeze"

    def run(data: dict[str, Any]) -> str:
        capabilities.principal_set_frozen(
            target=target, principal=principal, frozen=freeze, reason=data.get("reason", "")
        )
        if freeze:
            return (
                f"Froze {target.name}: it may submit, approve or operate nothing, and none of "
                "its commands is dispatched, until it is unfrozen."
            )
        return f"Unfroze {target.name}."

    return _controls_perform(request, form=forms.Form(request.POST), run=run, section="principals")


@require_POST
@console_view
def capability_revoke(request: HttpRequest, capability_id: str) -> HttpResponse:
    """POST ``/controls/capabilities/<id>/revoke``: ``capability_revoke``."""
    principal: Principal = request.principal  # type: ignore[attr-defined]
    _require_controls(principal)
    grant = capabilities_for_principal(principal).filter(pk=capability_id).first()
    if grant is None:
        raise NotFound(f"No capability {capability_id}.")

    def run(data: dict[str, Any]) -> str:
        capabilities.capability_revoke(capability=grant, principal=principal, reason=data["reason"])
        return (
            f"Revoked {grant.pk} of {grant.principal.name}: commands submitted under it and not "
            "yet sent will not be sent."
        )

    return _controls_perform(
        request, form=RequiredReasonForm(request.POST), run=run, section="grants"
    )


class GrantForm(forms.Form):
    """What ``POST /api/v1/capabilities`` takes (CapabilityGrantSerializer), as a form."""

    principal = forms.CharField(max_length=150)
    effect_types = forms.CharField(
        max_length=2000,
        help_text="Types or patterns, separated by spaces or commas: ticket.create billing.*",
    )
    resource_selector = forms.CharField(max_length=200, required=False)
    budget_count = forms.IntegerField(min_value=1, required=False)
    budget_amount = forms.IntegerField(min_value=1, required=False)
    budget_currency = forms.CharField(max_length=3, required=False)
    expires_in = forms.TypedChoiceField(
        choices=GRANT_EXPIRIES, coerce=int, empty_value=None, required=False
    )

    def clean_effect_types(self) -> list[str]:
        patterns = [p for p in self.cleaned_data["effect_types"].replace(",", " ").split() if p]
        if not patterns:
            raise forms.ValidationError("Name at least one effect type (patterns allowed).")
        if any(len(p) > 100 for p in patterns):
            raise forms.ValidationError("A type or pattern is at most 100 characters.")
        return patterns

    def clean_budget_currency(self) -> str:
        currency = self.cleaned_data["budget_currency"].strip().upper()
        if currency and not (len(currency) == 3 and currency.isalpha() and currency.isascii()):
            raise forms.ValidationError("An ISO 4217 code: three letters, like EUR.")
        return currency


@require_POST
@console_view
def capability_grant(request: HttpRequest) -> HttpResponse:
    """POST ``/controls/capabilities``: ``capability_grant`` (admins)."""
    principal: Principal = request.principal  # type: ignore[attr-defined]
    _require_controls(principal)
    if principal.role not in capabilities.GRANTOR_ROLES:
        raise NotPermitted("Only an admin grants capabilities.")

    def run(data: dict[str, Any]) -> str:
        target = Principal.objects.filter(
            tenant_id=principal.tenant_id, name=data["principal"]
        ).first()
        if target is None:
            raise NotFound(f"No principal {data['principal']}.")
        grant = capabilities.capability_grant(
            granted_by=principal.label,
            principal=target,
            effect_types=data["effect_types"],
            resource_selector=data["resource_selector"] or "*",
            budget_count=data["budget_count"],
            budget_amount=data["budget_amount"],
            budget_currency=data["budget_currency"],
            expires_in=data["expires_in"],
        )
        return (
            f"Granted {grant.pk} to {target.name}: {' '.join(grant.effect_types)} on "
            f"{grant.resource_selector}."
        )

    return _controls_perform(
        request, form=GrantForm(request.POST), run=run, section="grants", target="#grant-error"
    )


# --- sagas ---------------------------------------------------------------------------------------

SAGAS_PAGE_SIZE = 50
SAGA_ALERTS_SHOWN = 10


def saga_alerts(principal: Principal) -> tuple[list[Any], bool]:
    """For the triage queue: the tenant's frozen runs and runs whose compensation failed
    (which stay frozen), oldest change first; and whether there are more than shown."""
    runs = list(
        saga_selectors.sagas_for_principal(principal)
        .filter(Q(frozen=True) | Q(state=saga_choices.SagaState.COMPENSATION_FAILED))
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
            state=state if state in saga_choices.SagaState.values else "",
            definition=definition if definition in saga_definitions.DEFINITIONS else "",
            frozen=frozen if frozen in ("yes", "no") else "",
            after=params.get("after", "")[:80],
        )

    def querystring(self, **changes: str) -> str:
        return urlencode({k: v for k, v in {**self.__dict__, **changes}.items() if v})

    @property
    def active(self) -> bool:
        return bool(self.state or self.definition or self.frozen)


def _sagas_context(request: HttpRequest) -> dict[str, Any]:
    principal: Principal = request.principal  # type: ignore[attr-defined]
    filters = SagaFilters.parse(request.GET)
    query = saga_selectors.sagas_filtered(
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
        "token": _token(
            filters.querystring(),
            summary["count"],
            summary["latest"],
            [
                (run.pk, run.updated_at, since(run.created_at), since(run.state_changed_at))
                for run in page
            ],
            has_next,
        ),
        "states": saga_choices.SagaState.values,
        "definitions": sorted(saga_definitions.DEFINITIONS),
        "now": now,
        "view_name": "sagas",
    }


@require_GET
@console_view
def saga_list(request: HttpRequest) -> HttpResponse:
    """``/sagas``: the tenant's runs, newest first, filtered by state, definition, frozen."""
    context = _sagas_context(request)
    if is_partial(request):
        if request.GET.get("since") == context["token"]:
            return reswap(HttpResponse(status=204), "none")
        return render(request, "sagas/saga_list.html#runs", context)
    return render(request, "sagas/saga_list.html", context)


@dataclass(frozen=True)
class SagaStepRow:
    """One step of a run as the saga page shows it."""

    view: Any  # saga_selectors.StepView: the step, its latest record, effect and receipt
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
    if status == S.COMPENSATION_FAILED or status in saga_choices.STEP_FAILED:
        return "failed"
    return "waiting"


def _step_rows(run: Any, now: datetime) -> list[SagaStepRow]:
    rows = []
    for view in saga_selectors.saga_step_views(run):
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
    operator = _role_may(principal, services.OPERATOR_ROLES)
    if operator:
        if run.frozen:
            # A failed compensation keeps its run frozen: saga_unfreeze refuses it.
            if run.state != saga_choices.SagaState.COMPENSATION_FAILED:
                actions.add("unfreeze")
        elif saga_choices.ALLOWED_TRANSITIONS[run.state]:
            actions.add("freeze")
        if not run.frozen and run.state in saga_choices.RESUMABLE:
            actions.add("resume")
    requester = run.requested_by_id == principal.pk
    if run.state in saga_choices.ABANDONABLE and (operator or (requester and not principal.frozen)):
        actions.add("cancel")
    return actions


def _saga_inputs(principal: Principal, run: Any) -> tuple[dict, bool]:
    """The inputs this principal may read, and whether they are the redacted copy."""
    if not saga_selectors.may_see_inputs(principal, run):
        return run.inputs_redacted, True
    try:
        return saga_selectors.saga_inputs(run), False
    except InvalidToken:
        return run.inputs_redacted, True


def _saga_context(request: HttpRequest, run: Any) -> dict[str, Any]:
    principal: Principal = request.principal  # type: ignore[attr-defined]
    now = timezone.now()
    definition = saga_definitions.get_definition(run.definition)
    steps = _step_rows(run, now)
    tasks = list(saga_selectors.saga_tasks(principal=principal, states=None, saga_id=run.pk))
    events = list(saga_selectors.saga_events(run))
    inputs, inputs_redacted = _saga_inputs(principal, run)
    happened = sum(
        1
        for row in steps
        if row.view.effect is not None and row.view.effect.status in saga_choices.STEP_HAPPENED
    )
    current = next((row for row in steps if row.current), None)
    token = _token(
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
        "may_close_tasks": _role_may(principal, services.OPERATOR_ROLES),
        "may_compensate_only": run.state not in saga_choices.CANCELLABLE,
        "in_state": duration_label(now - run.state_changed_at),
        "token": token,
        "now": now,
        "view_name": "sagas",
    }


def _load_saga(request: HttpRequest, saga_id: str) -> Any:
    # Another tenant's run does not exist for this caller: NotFound, mapped to a 404.
    return saga_selectors.saga_get(principal=request.principal, saga_id=saga_id)  # type: ignore[attr-defined]


@require_GET
@console_view
def saga_detail(request: HttpRequest, saga_id: str) -> HttpResponse:
    """``/sagas/<id>``: each step with its effect, receipt and compensation; the actions."""
    run = _load_saga(request, saga_id)
    context = _saga_context(request, run)
    if is_partial(request):
        if request.GET.get("since") == context["token"]:
            return reswap(HttpResponse(status=204), "none")
        return render(request, "sagas/saga_detail.html#saga", context)
    return render(request, "sagas/saga_detail.html", context)


class SagaCancelForm(forms.Form):
    reason = forms.CharField(max_length=2000, required=False)
    compensate = forms.BooleanField(required=False)


def _saga_resume(request: HttpRequest, run: Any, data: dict[str, Any]) -> str:
    saga_services.saga_resume(run=run, principal=request.principal, reason=data["reason"])  # type: ignore[attr-defined]
    run.refresh_from_db()
    return f"Resumed {run.pk}: it is {run.state} now."


CANCEL_OUTCOMES = {
    "cancelled": "nothing of it had happened yet",
    "cancelled_with_effects": "{confirmed} step(s) had already happened and stay as they are",
    "cancelled_pending_reconciliation": (
        "{pending} step(s) were in flight or unknown: the reconciler settles them"
    ),
}


def _saga_cancel(request: HttpRequest, run: Any, data: dict[str, Any]) -> str:
    result = saga_services.saga_cancel(
        run=run,
        principal=request.principal,  # type: ignore[attr-defined]
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


def _saga_freeze(request: HttpRequest, run: Any, data: dict[str, Any]) -> str:
    principal: Principal = request.principal  # type: ignore[attr-defined]
    froze = saga_services.saga_freeze(
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


def _saga_unfreeze(request: HttpRequest, run: Any, data: dict[str, Any]) -> str:
    saga_services.saga_unfreeze(run=run, principal=request.principal, reason=data["reason"])  # type: ignore[attr-defined]
    return f"Unfroze {run.pk}: it goes on from where it stopped."


SAGA_ACTIONS: dict[str, Action] = {
    "resume": Action(ReasonForm, _saga_resume),
    "cancel": Action(SagaCancelForm, _saga_cancel),
    "freeze": Action(ReasonForm, _saga_freeze),
    "unfreeze": Action(ReasonForm, _saga_unfreeze),
}


def _saga_perform(request: HttpRequest, run: Any, form: forms.Form, run_action) -> HttpResponse:
    def answer() -> str:
        fresh = _load_saga(request, run.pk)
        return render_to_string(
            "sagas/saga_detail.html#saga", _saga_context(request, fresh), request=request
        ) + _badges_oob(request)

    return _perform(
        request,
        form=form,
        run=run_action,
        back=reverse("console:saga", args=[run.pk]),
        answer=answer,
    )


@require_POST
@console_view
def saga_action(request: HttpRequest, saga_id: str, action: str) -> HttpResponse:
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
def saga_task_done(request: HttpRequest, saga_id: str, task_id: str) -> HttpResponse:
    """POST ``/sagas/<id>/tasks/<task>/done``: an owner closes a task (``saga_task_close``)."""
    run = _load_saga(request, saga_id)
    task = saga_selectors.saga_task_get(principal=request.principal, task_id=task_id)  # type: ignore[attr-defined]
    if task.run_id != run.pk:
        raise NotFound(f"No task {task_id} in saga {run.pk}.")

    def close(data: dict[str, Any]) -> str:
        saga_services.saga_task_close(task=task, principal=request.principal, note=data["note"])  # type: ignore[attr-defined]
        return f"Closed task {task.pk} ({task.get_kind_display()}) of step {task.step.name}."

    return _saga_perform(request, run, NoteForm(request.POST), close)


# --- login and logout ------------------------------------------------------------------------


class LoginView(auth_views.LoginView):
    """Django's login, with the console's page; usernames are ``NAME@TENANT``."""

    template_name = "gateway/login.html"
    redirect_authenticated_user = True


login_view = LoginView.as_view()
logout_view = require_http_methods(["POST"])(auth_views.LogoutView.as_view())
