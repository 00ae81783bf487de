"""The operator console (SPEC §7): server-rendered pages, htmx fragments, and the actions of
§5 as forms that call the very services the API calls.

Every view is wrapped by ``console_view``: login required, the caller's principal resolved
once and everything scoped to its tenant, ``Vary: HX-Request`` on every answer, and domain
errors mapped once (``error_response``) to a readable message, never a stack trace.
A request is answered with a fragment only when ``is_partial(request)``; the same URL answers
with the full page otherwise, so every link and form works without JavaScript.
"""

from __future__ import annotations

import hashlib
import importlib
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
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import add_never_cache_headers, patch_vary_headers
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect, reswap, retarget

from gateway import selectors, services
from gateway.choices import (
    BEFORE_DISPATCH,
    TERMINAL,
    TO_RECONCILE,
    EffectClass,
    EffectStatus,
)
from gateway.contracts import CONTRACTS, EffectContract, get_contract
from gateway.errors import GatewayError, NotFound, NotPermitted, ValidationProblem
from gateway.models import Command, Effect, Principal, Receipt
from gateway.templatetags.console import approvals_badge, duration_label, money, since, until

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


@dataclass(frozen=True)
class TriageFilters:
    """The triage queue's query string, parsed; unknown values fall back to "any"."""

    status: str = ""
    type: str = ""
    owner: str = ""
    age: str = ""
    sort: str = "oldest"
    after: str = ""

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
        )

    def querystring(self, **changes: str) -> str:
        values = {**self.__dict__, **changes}
        return urlencode({k: v for k, v in values.items() if v and (k, v) != ("sort", "oldest")})

    @property
    def active(self) -> bool:
        return bool(self.status or self.type or self.owner or self.age)


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
        .defer("command__payload_sealed", "command__context", "command__intent")[
            : TRIAGE_PAGE_SIZE + 1
        ]
    )
    has_next = len(page) > TRIAGE_PAGE_SIZE
    page = page[:TRIAGE_PAGE_SIZE]
    rows = [_triage_row(effect, now) for effect in page]
    next_query = ""
    if has_next:
        last = page[-1]
        cursor = f"{last.risk}.{last.pk}" if filters.sort == "risk" else last.pk
        next_query = filters.querystring(after=cursor)
    # What the fragment shows, and nothing else: the poll answers 204 while it is unchanged.
    token = _token(
        filters.querystring(),
        summary["count"],
        summary["latest"],
        [(r.effect.pk, r.effect.updated_at, r.age, r.in_status, r.overdue) for r in rows],
        has_next,
    )
    return {
        "filters": filters,
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


def _optional(module: str, name: str) -> Any:
    """A function of an app that may not be installed yet (reconciliation, sagas), or None:
    the console then hides what needs it instead of failing."""
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


def _reconciliation_service(name: str) -> Callable[..., Any] | None:
    return _optional("reconciliation.services", name)


def _reconciliation(effect: Effect) -> tuple[Any, list[Any]]:
    """The effect's unresolved human-queue case and its reconciliation records (lookups and
    manual resolutions), when the reconciliation app is there."""
    open_case = _optional("reconciliation.selectors", "effect_open_case")
    records = _optional("reconciliation.selectors", "effect_records")
    return (
        open_case(effect) if open_case else None,
        list(records(effect)) if records else [],
    )


def _may_compensate(effect: Effect, contract: EffectContract | None, now: datetime) -> bool:
    if contract is None or not contract.compensator or contract.compensation is None:
        return False
    if effect.status != S.CONFIRMED:
        return False
    if contract.compensation_window and effect.confirmed_at:
        return now <= effect.confirmed_at + contract.compensation_window
    return True


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
        if effect.status in TO_RECONCILE and _reconciliation_service("effect_reconcile"):
            actions.add("reconcile")
        resolvable = effect.status in TO_RECONCILE or (
            effect.status == S.NOT_STARTED and effect.escalated
        )
        if resolvable and _reconciliation_service("effect_resolve"):
            actions.add("resolve")
        if open_case is not None and getattr(open_case, "state", "") == "open":
            actions.add("acknowledge")
        if _may_compensate(effect, get_contract(effect.type), timezone.now()) and getattr(
            services, "effect_compensate", None
        ):
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
        "actions": available_actions(principal, effect, open_case=open_case),
        "in_status": duration_label(now - effect.status_changed_at),
        "token": token,
        "now": now,
        "view_name": "effect",
    }


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


def _service_or_404(name: str) -> Callable[..., Any]:
    service = _reconciliation_service(name)
    if service is None:
        raise NotFound("Reconciliation is not available in this deployment yet.")
    return service


def _reconcile(request, effect, data) -> str:
    # Not an operator: refuse before the provider is asked anything on the caller's behalf.
    if not _role_may(request.principal, services.OPERATOR_ROLES):
        raise NotPermitted(f"A principal with role {request.principal.role} cannot reconcile.")
    reconcile = _service_or_404("effect_reconcile")
    reconcile(effect_id=effect.pk, actor=request.principal.label, principal=request.principal)
    effect.refresh_from_db()
    return f"Asked the provider about {effect.pk}: it is now {effect.status}."


def _resolve(request, effect, data) -> str:
    resolve = _service_or_404("effect_resolve")
    resolve(
        effect=effect,
        principal=request.principal,
        outcome=data["outcome"],
        evidence=data["evidence"],
    )
    effect.refresh_from_db()
    return f"Resolved {effect.pk} as {data['outcome']}, with your evidence on record."


def _acknowledge(request, effect, data) -> str:
    acknowledge = _service_or_404("case_acknowledge")
    open_case, _ = _reconciliation(effect)
    if open_case is None:
        raise NotFound(f"{effect.pk} has no open case to acknowledge.")
    acknowledge(case=open_case, principal=request.principal, note=data["reason"])
    return f"You took case {open_case.pk} of {effect.pk}."


def _compensate(request, effect, data) -> str:
    compensate = getattr(services, "effect_compensate", None)
    if compensate is None:
        raise NotFound("Compensation is not available in this deployment yet.")
    submission = compensate(effect=effect, principal=request.principal, reason=data["reason"])
    issued = submission.effect
    return (
        f"Issued compensation {issued.pk} ({issued.type}), {issued.status}; "
        f"{effect.pk} is now COMPENSATING."
    )


@dataclass(frozen=True)
class Action:
    form: type[forms.Form]
    run: Callable[[HttpRequest, Effect, dict[str, Any]], str]


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
    form = spec.form(request.POST)
    try:
        if not form.is_valid():
            raise _form_problem(form)
        message = spec.run(request, effect, form.cleaned_data)
    except GatewayError as exc:
        return error_response(request, exc, target=target, back=back)
    messages.success(request, message)
    if not is_partial(request):
        return redirect(back)
    effect = _load_effect(request, effect_id)
    if from_inbox:
        card = _approval_card(request.principal, effect)  # type: ignore[attr-defined]
        html = render_to_string(
            "gateway/effect_approvals.html#card", {"card": card}, request=request
        )
    else:
        html = render_to_string(
            "gateway/effect_detail.html#effect", _effect_context(request, effect), request=request
        )
    # The nav's approvals count may have changed too: swap it out of band.
    badge = approvals_badge({"request": request}, oob=True)
    return HttpResponse(html + badge + _flash_oob(request))


# --- login and logout ------------------------------------------------------------------------


class LoginView(auth_views.LoginView):
    """Django's login, with the console's page; usernames are ``NAME@TENANT``."""

    template_name = "gateway/login.html"
    redirect_authenticated_user = True


login_view = LoginView.as_view()
logout_view = require_http_methods(["POST"])(auth_views.LogoutView.as_view())
