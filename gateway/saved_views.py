"""Saved views: a console user's named filters of a page (triage, search, audit), for them
alone or shared with every console user of their tenant.

Reads (``saved_views_for``) and the writes (``saved_view_save``, ``saved_view_update``,
``saved_view_delete``). Everything is scoped to the caller's tenant: another tenant's view
does not exist for the caller. A shared view is listed for the whole tenant and changed only
by its owner or an admin. The query string is stored as the page's own parser normalised it
(the console does that before calling here), so a saved view never carries a page cursor.
"""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet

from gateway.choices import ADMIN_ROLES, SavedViewPage
from gateway.errors import NotFound, NotPermitted, ValidationProblem
from gateway.models import Principal, SavedView

# A tenant's views of one page are a short list: beyond this, the oldest are not listed.
SAVED_VIEWS_LISTED = 50


def saved_views_for(*, principal: Principal, page: str) -> QuerySet[SavedView]:
    """The caller's own views of ``page`` and the ones shared in its tenant, by name."""
    return (
        SavedView.objects.filter(tenant_id=principal.tenant_id, page=page)
        .filter(Q(owner=principal) | Q(shared=True))
        .select_related("owner")
        .order_by("name", "id")[:SAVED_VIEWS_LISTED]
    )


def may_change(principal: Principal, view: SavedView) -> bool:
    """Its owner, or an admin of its tenant (for a shared one), may change or delete it."""
    if view.tenant_id != principal.tenant_id:
        return False
    return view.owner_id == principal.pk or (view.shared and principal.role in ADMIN_ROLES)


def _clean_name(name: str) -> str:
    name = " ".join(name.split())
    if not name:
        raise ValidationProblem("A saved view needs a name.", errors={"name": ["required"]})
    if len(name) > 80:
        raise ValidationProblem(
            "A saved view's name has at most 80 characters.", errors={"name": ["too long"]}
        )
    return name


def saved_view_save(
    *, principal: Principal, page: str, name: str, query: str, shared: bool
) -> SavedView:
    """Save the filters ``query`` of ``page`` under ``name``: a new view, or the caller's own
    view of that name with its filters replaced."""
    if page not in SavedViewPage.values:
        raise ValidationProblem(f"No page {page!r} has saved views.", errors={"page": ["unknown"]})
    name = _clean_name(name)
    try:
        # A savepoint: a second tab saving the same name at once hits the unique constraint.
        with transaction.atomic():
            view, _ = SavedView.objects.update_or_create(
                owner=principal,
                page=page,
                name=name,
                defaults={"tenant_id": principal.tenant_id, "query": query, "shared": shared},
            )
    except IntegrityError as exc:
        raise ValidationProblem(
            f"A view named {name!r} was saved at the same time; try again.",
            errors={"name": ["saved at the same time"]},
        ) from exc
    return view


def _changeable(principal: Principal, view_id: int) -> SavedView:
    view = (
        SavedView.objects.filter(tenant_id=principal.tenant_id, pk=view_id)
        .filter(Q(owner=principal) | Q(shared=True))
        .first()
    )
    if view is None:
        raise NotFound(f"No saved view {view_id}.")
    if not may_change(principal, view):
        raise NotPermitted("Only its owner or an admin may change a shared view.")
    return view


def saved_view_update(*, principal: Principal, view_id: int, query: str) -> SavedView:
    """Replace the filters of a view the caller may change."""
    view = _changeable(principal, view_id)
    view.query = query
    view.save(update_fields=["query", "updated_at"])
    return view


def saved_view_delete(*, principal: Principal, view_id: int) -> str:
    """Delete a view the caller may change; returns its name."""
    view = _changeable(principal, view_id)
    view.delete()
    return view.name
