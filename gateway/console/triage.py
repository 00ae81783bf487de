"""``/``: the triage queue — what needs a human, with filters, keyset pages and a poll."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, cast

from django.db.models import Count, Max
from django.http import HttpResponse
from django.template import RequestContext, Template
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from gateway.choices import EffectStatus
from gateway.console import extensions
from gateway.console.base import ConsoleRequest, console_view, poll_token, render_polled
from gateway.console.providers import health_rows
from gateway.console.selectors import (
    APPROVAL_WAIT,
    CAUSES,
    CORRELATION_KEYS,
    OVERDUE_AFTER,
    SORTS,
    TriageFilters,
    apply_triage_filters,
    approvals_waiting,
    effects_for_triage,
    owners,
    providers,
    triage_groups,
    triage_keyset,
)
from gateway.console.settling import (
    GroupView,
    needs_a_human,
    needs_human_count,
    settling_q,
    split_groups,
)
from gateway.contracts import CONTRACTS, EffectContract, get_contract
from gateway.models import Effect
from gateway.providers.health import provider_health
from gateway.templatetags.console import duration_label, money

S = EffectStatus


TRIAGE_PAGE_SIZE = 50


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
    # Who is on it (the name of the principal who took it), "" when nobody.
    holder: str = ""


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
    if getattr(effect, "cause", "") == "case":
        reasons.append(("open case", "danger"))
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


def _triage_context(request: ConsoleRequest, params: Any = None) -> dict[str, Any]:
    principal = request.principal
    now = timezone.now()
    filters = TriageFilters.parse(request.GET if params is None else params)
    health = provider_health(principal.tenant_id, now=now)
    queue = effects_for_triage(principal=principal, now=now)
    matching = apply_triage_filters(queue, filters, now)
    matching, summary = _summary(matching, filters, health)
    settling_count = summary["settling"]
    # The whole queue by provider, type and cause (with the filters but the group's own):
    # what an incident looks like at a glance, and where the bulk actions are.
    groups = triage_groups(
        apply_triage_filters(
            queue,
            TriageFilters(**{**filters.__dict__, "provider": "", "type": "", "cause": ""}),
            now,
        )
    )
    human_groups, settling_groups = split_groups(groups, health, now)
    strip = [row for row in health_rows(health) if not row.quiet]
    # Unfiltered, the queue's own count is the page title's (and the nav badge's, which
    # reads it from the request); filtered, it is counted apart.
    needs_human = (
        summary["human"]
        if not filters.active
        else needs_human_count(principal, now=now, health=health)
    )
    cast(Any, request).needs_human = needs_human
    waiting_approvals = approvals_waiting(principal=principal, now=now)
    rows, has_next, next_query = _triage_page(matching, filters, now)
    # What the other apps show above the queue (the sagas stopped for a human).
    panels = [panel(principal) for panel in extensions.triage_panels]
    # What the fragment shows, and nothing else: the poll answers 204 while it is unchanged.
    token = poll_token(
        filters.querystring(),
        summary["count"],
        summary["latest"],
        [(r.effect.pk, r.effect.updated_at, r.age, r.in_status, r.overdue) for r in rows],
        has_next,
        [panel.token for panel in panels],
        [
            (v.group.provider, v.group.type, v.group.cause, v.group.count, v.signature)
            for v in human_groups + settling_groups
        ],
        [row.label_parts() for row in strip],
        waiting_approvals,
        [r.holder for r in rows],
        needs_human,
        settling_count,
    )
    context: dict[str, Any] = {
        "filters": filters,
        "context_chips": [
            (key, value, filters.without_context(key)) for key, value in filters.context
        ],
        "rows": rows,
        "groups": bulk_menu(request, human_groups),
        "settling_groups": bulk_menu(request, settling_groups),
        "strip": strip,
        "quiet_providers": len(health) - len(strip),
        "needs_human": needs_human,
        "settling_count": settling_count,
        "waiting_approvals": waiting_approvals,
        "approval_wait": duration_label(APPROVAL_WAIT),
        "count": summary["count"],
        "next_query": next_query,
        "first_query": filters.querystring(after=""),
        "token": token,
        **_filter_choices(),
        "sort_label": SORTS[filters.sort],
        "now": now,
        "view_name": "triage",
        # Reversed once: the groups and the pager link to it about a hundred times.
        "triage_url": reverse("console:triage"),
        # Computed once: each group's bulk forms carry it (two hundred forms).
        "querystring": filters.querystring(),
    }
    for panel in panels:
        context.update(panel.context)
    return context


def _summary(
    matching: Any, filters: TriageFilters, health: dict[str, Any]
) -> tuple[Any, dict[str, Any]]:
    """The rows to list (the settling effects only when asked for: their group's "Show
    these") and, in one query, how many need a human, how many are settling, the latest
    change; ``count`` is how many are listed."""
    settling = settling_q(health)
    summary = matching.aggregate(
        human=Count("pk", filter=~settling),
        settling=Count("pk", filter=settling),
        latest=Max("updated_at"),
    )
    if filters.cause == "settling":
        summary["count"] = summary["settling"]
        return matching, summary
    summary["count"] = summary["human"]
    return needs_a_human(matching, health), summary


def _triage_page(matching: Any, filters: TriageFilters, now: Any) -> tuple[list[Any], bool, str]:
    """One page of the queue: its rows (with who holds each), whether more follow, and the
    query string of the next page ("" on the last)."""
    # The page's ids first, then its rows with their commands: joined before the sort, the
    # command of every effect in the queue would be read to keep 51 (0.1 s at 5,000).
    ordered = triage_keyset(matching, filters)
    ids = list(ordered.values_list("pk", flat=True)[: TRIAGE_PAGE_SIZE + 1])
    page = list(
        ordered.filter(pk__in=ids)
        .select_related("command")
        .defer("command__payload_sealed", "command__intent")
    )
    has_next = len(page) > TRIAGE_PAGE_SIZE
    page = page[:TRIAGE_PAGE_SIZE]
    rows = [_triage_row(effect, now) for effect in page]
    for holders in extensions.triage_holders:
        held = holders([row.effect.pk for row in rows])
        for row in rows:
            row.holder = held.get(row.effect.pk, row.holder)
    next_query = ""
    if has_next:
        last = page[-1]
        # ``risk`` is annotated by triage_keyset when sorting by risk.
        cursor = f"{cast(Any, last).risk}.{last.pk}" if filters.sort == "risk" else last.pk
        next_query = filters.querystring(after=cursor)
    return rows, has_next, next_query


def _filter_choices() -> dict[str, Any]:
    """The choices of the queue's filter and sort controls."""
    return {
        "statuses": S.values,
        "types": sorted(CONTRACTS),
        "owners": owners(),
        "age_filters": [
            ("10m", "older than 10 min"),
            ("1h", "older than 1 h"),
            ("24h", "older than 1 day"),
        ],
        "sorts": SORTS,
        "providers": providers(),
        "correlation_keys": CORRELATION_KEYS,
        "causes": list(CAUSES.items()),
    }


def bulk_menu(request: ConsoleRequest, views: list[GroupView]) -> list[dict[str, Any]]:
    """Each group (with its cause signature) and the bulk actions this principal may take."""
    from gateway.console.bulk import available_bulk_actions

    # Each action's URL reversed once for the page, not once per group (48 groups of four
    # forms: two hundred reversals, about 10 ms).
    urls: dict[str, str] = {}
    menu = []
    for v in views:
        actions = []
        for action in available_bulk_actions(request.principal, v.group):
            if action.name not in urls:
                urls[action.name] = reverse("console:triage-bulk", args=[action.name])
            actions.append(replace(action, url=urls[action.name]))
        menu.append({"group": v.group, "view": v, "actions": actions})
    return menu


@require_GET
@console_view
def triage(request: ConsoleRequest) -> HttpResponse:
    """``/``: the triage queue, with filters, keyset pages and a 5 s poll of its table."""
    return render_polled(request, "gateway/effect_triage.html", "queue", _triage_context(request))


@require_GET
@console_view
def triage_badge(request: ConsoleRequest) -> HttpResponse:
    """The nav's Triage badge, loaded after the page: the count of effects that need a human."""
    cast(Any, request).needs_human = needs_human_count(request.principal)
    return HttpResponse(
        Template("{% load console %}{% triage_badge %}").render(RequestContext(request))
    )
