"""The saved views panel's tag: ``{% saved_views_panel as panel %}`` reads the views the
caller sees on the current page (one query) and the page's filters (gateway.console.saved)."""

from __future__ import annotations

from typing import Any

from django import template

register = template.Library()


@register.simple_tag(takes_context=True)
def saved_views_panel(context: template.Context) -> dict[str, Any] | None:
    """The panel of the page named by ``view_name``; None outside a console page."""
    from gateway.console.saved import PAGES, panel

    request = context.get("request")
    page = context.get("view_name", "")
    if request is None or getattr(request, "principal", None) is None or page not in PAGES:
        return None
    return panel(request, page)


@register.filter
def may_read_audit(principal: Any) -> bool:
    """The nav shows the audit list to the roles that may read it."""
    from gateway.console.audit_list import AUDIT_READERS

    return principal is not None and principal.role in AUDIT_READERS


@register.filter
def may_connect_clients(principal: Any) -> bool:
    """The nav shows the connected MCP clients to whom the page lets in: an unfrozen admin
    (gateway.console.oauth)."""
    from gateway.choices import Role

    return principal is not None and principal.role == Role.ADMIN and not principal.frozen
