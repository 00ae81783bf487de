"""Template tags of reconciliation's console pages: the nav's count of the human queue."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from reconciliation.choices import UNRESOLVED
from reconciliation.models import Case

register = template.Library()


@register.simple_tag(takes_context=True)
def cases_badge(context: Any, oob: bool = False) -> str:
    """The nav's count of the tenant's unresolved reconciliation cases (open or taken), swapped
    out of band after an action that may take or settle one."""
    request = context.get("request")
    principal = getattr(request, "principal", None)
    if principal is None:
        return ""
    # Served by the partial index case_queue (tenant, opened_at) of unresolved cases.
    waiting = Case.objects.filter(
        tenant_id=principal.tenant_id, state__in=sorted(UNRESOLVED)
    ).count()
    return format_html(
        '<span id="cases-badge" class="count{}"{}>{}<span class="visually-hidden">'
        " unresolved</span></span>",
        " count-zero" if not waiting else "",
        mark_safe(' hx-swap-oob="true"') if oob else "",
        waiting,
    )
