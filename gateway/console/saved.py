"""Saved views in the console: the panel above the triage, search and audit pages (its
context, ``panel``) and its three forms — save the page's filters under a name, replace a
view's filters with the current ones, delete a view — each calling one function of
gateway.saved_views and answering with a redirect to the page (the saved view applied).

The filters are stored as the page's own parser keeps them (``normalise``): unknown values
and the page cursor (``after``) never reach the database, and applying a view is a plain
link to the page with its query string.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.http import HttpResponse, QueryDict
from django.urls import reverse
from django.views.decorators.http import require_POST

from gateway import saved_views
from gateway.choices import SavedViewPage
from gateway.console.audit_list import AuditFilters
from gateway.console.base import ConsoleRequest, console_view, perform
from gateway.console.selectors import TriageFilters


def _search_query(params: QueryDict) -> str:
    q = params.get("q", "").strip()[:330]
    return urlencode({"q": q}) if q else ""


# Each page with saved views: its URL name, the parser that keeps its filters, and the lists
# its export links offer (gateway.console.exports), with their labels.
PAGES: dict[str, tuple[str, Callable[[QueryDict], str], tuple[tuple[str, str], ...]]] = {
    SavedViewPage.TRIAGE: (
        "console:triage",
        lambda params: TriageFilters.parse(params).querystring(after=""),
        (("triage", "effects"), ("triage-groups", "groups")),
    ),
    SavedViewPage.SEARCH: ("console:search", _search_query, (("search", "results"),)),
    SavedViewPage.AUDIT: (
        "console:audit",
        lambda params: AuditFilters.parse(params).querystring(after=""),
        (("audit", "events"),),
    ),
}


def normalise(page: str, query: str | QueryDict) -> str:
    params = query if isinstance(query, QueryDict) else QueryDict(query)
    return PAGES[page][1](params)


def page_url(page: str, query: str = "") -> str:
    return reverse(PAGES[page][0]) + (f"?{query}" if query else "")


def panel(request: Any, page: str) -> dict[str, Any]:
    """What the saved views partial shows on ``page``: the views the caller sees (with
    whether they may change each), the page's current filters, and its export links."""
    principal = request.principal
    query = normalise(page, request.GET)
    views = [
        {
            "view": view,
            "url": page_url(page, view.query),
            "mine": view.owner_id == principal.pk,
            "may_change": saved_views.may_change(principal, view),
            "current": view.query == query,
        }
        for view in saved_views.saved_views_for(principal=principal, page=page)
    ]
    return {
        "page": page,
        "views": views,
        "query": query,
        "exports": PAGES[page][2],
    }


class SaveViewForm(forms.Form):
    page = forms.ChoiceField(choices=SavedViewPage.choices)
    name = forms.CharField(max_length=80)
    query = forms.CharField(max_length=2000, required=False)
    shared = forms.BooleanField(required=False)


class ChangeViewForm(forms.Form):
    page = forms.ChoiceField(choices=SavedViewPage.choices)
    query = forms.CharField(max_length=2000, required=False)


def _back(request: ConsoleRequest) -> tuple[str, str]:
    """The page the form was on, with its filters re-parsed (never a URL from the form)."""
    page = request.POST.get("page", "")
    if page not in PAGES:
        page = SavedViewPage.TRIAGE
    query = normalise(page, request.POST.get("query", ""))
    return page, query


@require_POST
@console_view
def saved_view_save(request: ConsoleRequest) -> HttpResponse:
    """POST ``/saved-views``: save the page's filters under a name (the caller's own view of
    that name is replaced), then show the page with them."""
    page, query = _back(request)

    def run(data: dict[str, Any]) -> str:
        view = saved_views.saved_view_save(
            principal=request.principal,
            page=data["page"],
            name=data["name"],
            query=query,
            shared=data["shared"],
        )
        shared = ", shared with your tenant" if view.shared else ""
        return f"Saved the view {view.name!r}{shared}."

    form = SaveViewForm(request.POST)
    return perform(request, form=form, run=run, back=page_url(page, query), answer=str)


@require_POST
@console_view
def saved_view_change(request: ConsoleRequest, view_id: int, verb: str) -> HttpResponse:
    """POST ``/saved-views/<id>/update`` (the page's current filters replace the view's) or
    ``/saved-views/<id>/delete``: by its owner, or an admin for a shared view."""
    page, query = _back(request)

    def run(data: dict[str, Any]) -> str:
        if verb == "delete":
            name = saved_views.saved_view_delete(principal=request.principal, view_id=view_id)
            return f"Deleted the view {name!r}."
        view = saved_views.saved_view_update(
            principal=request.principal, view_id=view_id, query=query
        )
        return f"The view {view.name!r} now has these filters."

    if verb not in ("update", "delete"):
        return HttpResponse(status=404)
    form = ChangeViewForm(request.POST)
    return perform(request, form=form, run=run, back=page_url(page, query), answer=str)
