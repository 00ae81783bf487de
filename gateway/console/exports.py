"""``/export/<list>.<csv|jsonl>?<the page's filters>``: any filtered list of the console as a
streamed download — the triage queue (``triage``) and its groups (``triage-groups``), search
results (``search``), the audit list (``audit``), and what the other apps register in
``extensions.exports`` (the human queue, ``cases``).

Each list is read with the filters, the tenant scope and the role check of its page, from a
server-side cursor (``.iterator(chunk_size=EXPORT_CHUNK)``), and written as it is read
(gateway.lib.exports), so a million rows never sit in the web process's memory. The page
cursor (``after``) is ignored: an export is the whole filtered list, in the page's order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any, cast

from django.http import HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET

from gateway.console import extensions
from gateway.console.audit_list import EXPORT_COLUMNS as AUDIT_COLUMNS
from gateway.console.audit_list import AuditFilters, audit_events
from gateway.console.audit_list import export_row as audit_row
from gateway.console.base import ConsoleRequest, console_view
from gateway.console.extensions import Export
from gateway.console.search import effects_matching
from gateway.console.selectors import (
    CAUSES,
    TriageFilters,
    apply_triage_filters,
    effects_for_triage,
    triage_groups,
    triage_keyset,
)
from gateway.console.triage import correlation_label
from gateway.contracts import get_contract
from gateway.errors import NotFound
from gateway.lib.exports import FORMATS, export_response
from gateway.models import Effect
from gateway.templatetags.console import money

# Rows fetched from the server-side cursor per round trip.
EXPORT_CHUNK = 2000


TRIAGE_COLUMNS = (
    "effect_id",
    "type",
    "provider",
    "status",
    "cause",
    "owner",
    "created_at",
    "status_changed_at",
    "at_stake",
    "attempts",
    "mismatch",
    "escalated",
    "frozen",
    "correlation",
)


def _triage_row(effect: Effect) -> dict[str, Any]:
    contract = get_contract(effect.type)
    return {
        "effect_id": effect.pk,
        "type": effect.type,
        "provider": contract.provider if contract else "",
        "status": effect.status,
        "cause": CAUSES.get(getattr(effect, "cause", ""), ""),
        "owner": effect.owner,
        "created_at": effect.created_at,
        "status_changed_at": effect.status_changed_at,
        "at_stake": money(effect.command.payload_redacted),
        "attempts": effect.attempt_count,
        "mismatch": effect.mismatch,
        "escalated": effect.escalated,
        "frozen": effect.frozen,
        "correlation": correlation_label(effect.command.context),
    }


def triage_rows(request: ConsoleRequest) -> Iterator[dict[str, Any]]:
    """The triage queue with the page's filters and sort, every page of it."""
    now = timezone.now()
    filters = TriageFilters.parse(request.GET)
    queue = effects_for_triage(principal=request.principal, now=now)
    query = (
        triage_keyset(
            apply_triage_filters(queue, filters, now),
            replace(filters, after=""),
        )
        .select_related("command")
        .only(*_TRIAGE_FIELDS)
    )
    return (_triage_row(effect) for effect in query.iterator(chunk_size=EXPORT_CHUNK))


_TRIAGE_FIELDS = (
    "type",
    "status",
    "owner",
    "created_at",
    "status_changed_at",
    "attempt_count",
    "mismatch",
    "escalated",
    "frozen",
    "command__payload_redacted",
    "command__context",
)


GROUP_COLUMNS = ("provider", "type", "cause", "count", "oldest")


def triage_group_rows(request: ConsoleRequest) -> Iterator[dict[str, Any]]:
    """The groups of the triage queue as the page draws them (its filters but the group's
    own: provider, type and cause)."""
    now = timezone.now()
    filters = TriageFilters.parse(request.GET)
    queue = effects_for_triage(principal=request.principal, now=now)
    wide = replace(filters, provider="", type="", cause="")
    groups = triage_groups(apply_triage_filters(queue, wide, now))
    return (
        {
            "provider": g.provider,
            "type": g.type,
            "cause": g.cause_label,
            "count": g.count,
            "oldest": g.oldest,
        }
        for g in groups
    )


SEARCH_COLUMNS = ("kind", "label", "matched", "status", "url")


def search_rows(request: ConsoleRequest) -> Iterable[dict[str, Any]]:
    """What the search page lists for ``q`` (at most SEARCH_LIMIT effects, and sagas)."""
    q = request.GET.get("q", "").strip()[:330]
    if not q:
        return []
    hits = effects_matching(principal=request.principal, q=q)
    for more in extensions.search_hits:
        hits += more(request.principal, q)
    return (
        {
            "kind": hit.kind,
            "label": hit.label,
            "matched": hit.matched,
            "status": hit.status,
            "url": request.build_absolute_uri(hit.url),
        }
        for hit in hits
    )


def audit_rows(request: ConsoleRequest) -> Iterator[dict[str, Any]]:
    filters = AuditFilters.parse(request.GET)
    query = audit_events(principal=request.principal, filters=replace(filters, after=""))
    return (audit_row(event) for event in query.iterator(chunk_size=EXPORT_CHUNK))


OWN_EXPORTS: dict[str, Export] = {
    "triage": Export(TRIAGE_COLUMNS, triage_rows),
    "triage-groups": Export(GROUP_COLUMNS, triage_group_rows),
    "search": Export(SEARCH_COLUMNS, search_rows),
    "audit": Export(AUDIT_COLUMNS, audit_rows),
}


@require_GET
@console_view
def export(request: ConsoleRequest, name: str, fmt: str) -> HttpResponse:
    """GET ``/export/<name>.<fmt>``: the list ``name`` with the query's filters, streamed."""
    spec = OWN_EXPORTS.get(name) or extensions.exports.get(name)
    if spec is None or fmt not in FORMATS:
        raise NotFound(f"No export {name}.{fmt}.")
    # Called here, not inside the stream: its role check raises before the response starts.
    rows = spec.rows(request)
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    filename = f"{request.principal.tenant.slug}-{name}-{stamp}"
    response = export_response(fmt=fmt, filename=filename, columns=spec.columns, rows=rows)
    # console_view's frame (Vary, no-store) applies to any response; it is typed for pages.
    return cast(HttpResponse, response)
