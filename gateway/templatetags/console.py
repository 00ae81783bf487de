"""Display helpers of the operator console: status badges, money, durations, JSON, digests,
and the nav's count of approvals (reconciliation and sagas have their own tag libraries).

Formatting lives here so that the views and the templates format one way; the only query is
the nav's approvals badge (one count).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from gateway.choices import STATUS_TONE, EffectStatus

register = template.Library()

# ISO 4217 minor units, where they are not 2.
_MINOR_UNITS = {
    **dict.fromkeys(("BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG"), 0),
    **dict.fromkeys(("RWF", "UGX", "VND", "VUV", "XAF", "XOF", "XPF"), 0),
    **dict.fromkeys(("BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"), 3),
}


@register.filter
def money(payload: Any) -> str:
    """``5,000.00 EUR`` for a payload with an integer ``amount`` in minor units and a
    ``currency``; empty otherwise."""
    if not isinstance(payload, dict):
        return ""
    amount, currency = payload.get("amount"), payload.get("currency")
    if isinstance(amount, bool) or not isinstance(amount, int) or not isinstance(currency, str):
        return ""
    digits = _MINOR_UNITS.get(currency, 2)
    return f"{amount / 10**digits:,.{digits}f} {currency}"


def duration_label(delta: timedelta) -> str:
    """A coarse, calm duration: ``<1 min``, ``12 min``, ``3 h``, ``2 d``. Coarse on purpose:
    a poll re-renders only when a label it shows changes."""
    seconds = int(delta.total_seconds())
    if seconds < 60:
        return "<1 min"
    if seconds < 3600:
        return f"{seconds // 60} min"
    if seconds < 48 * 3600:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} d"


@register.filter
def since(moment: datetime | None) -> str:
    """How long ago: ``12 min``."""
    if moment is None:
        return ""
    return duration_label(timezone.now() - moment)


@register.filter
def until(moment: datetime | None) -> str:
    """``in 12 min`` or ``12 min ago``."""
    if moment is None:
        return ""
    delta = moment - timezone.now()
    if delta.total_seconds() >= 0:
        return f"in {duration_label(delta)}"
    return f"{duration_label(-delta)} ago"


@register.simple_tag
def status_badge(status: str) -> str:
    """The status with its tone from ``STATUS_TONE`` (the one colour table)."""
    tone = STATUS_TONE.get(status, "neutral")
    label = EffectStatus(status).label if status in EffectStatus.values else status
    return format_html(
        '<span class="badge tone-{}" data-status="{}">{}</span>', tone, status, label
    )


@register.simple_tag
def timestamp(moment: datetime | None, text: str = "") -> str:
    """A ``<time>`` element: the relative ``text`` (or the UTC time) with the exact UTC time
    as its tooltip and machine-readable value."""
    if moment is None:
        return "—"
    utc = moment.astimezone(UTC)
    exact = utc.strftime("%Y-%m-%d %H:%M:%S UTC")
    return format_html(
        '<time datetime="{}" title="{}">{}</time>', utc.isoformat(), exact, text or exact
    )


@register.filter
def show(value: Any) -> str:
    """A JSON value as an operator reads it: strings bare, everything else as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


@register.simple_tag
def field_value(name: str, value: Any, currency: Any = "") -> str:
    """A payload or result field as an operator reads it; an ``amount`` (or ``*_amount``) in
    minor units, with a currency, in major units: ``49.99 EUR`` (the stored 4999 beside it)."""
    if (
        isinstance(name, str)
        and name.rsplit(".", 1)[-1].endswith("amount")
        and isinstance(currency, str)
        and currency
        and isinstance(value, int)
        and not isinstance(value, bool)
    ):
        return format_html(
            '{} <span class="muted small">({} in minor units)</span>',
            money({"amount": value, "currency": currency}),
            value,
        )
    return show(value)


@register.filter
def pretty(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True)


@register.simple_tag(takes_context=True)
def approvals_badge(context, oob: bool = False) -> str:
    """The nav's count of commands waiting for an approver (swapped out of band after an
    approval decision)."""
    request = context.get("request")
    principal = getattr(request, "principal", None)
    if principal is None:
        return ""
    from gateway.models import Effect

    waiting = Effect.objects.filter(
        tenant_id=principal.tenant_id, status=EffectStatus.AWAITING_APPROVAL
    ).count()
    return format_html(
        '<span id="approvals-badge" class="count{}"{}>{}<span class="visually-hidden">'
        " waiting</span></span>",
        " count-zero" if not waiting else "",
        mark_safe(' hx-swap-oob="true"') if oob else "",
        waiting,
    )


@register.filter
def as_options(values: Any) -> list[tuple[Any, Any]]:
    """``(value, label)`` pairs for ``partials/filter_select.html``: a mapping's items, or each
    value as its own label."""
    if isinstance(values, dict):
        return list(values.items())
    return [(value, value) for value in values]


@register.filter
def span(delta: timedelta | None) -> str:
    """A declared length of time: ``30 d``, ``12 h``."""
    if delta is None:
        return ""
    return duration_label(delta)


@register.filter
def took(attempt: Any) -> str:
    """How long an attempt took, or that it is still sending."""
    started, finished = getattr(attempt, "started_at", None), getattr(attempt, "finished_at", None)
    if started is None:
        return ""
    if finished is None:
        return "…"
    return f"{(finished - started).total_seconds():.2f} s"


@register.filter
def may_control(principal: Any) -> bool:
    """Whether the principal may open the controls page (the roles that freeze)."""
    from gateway.choices import OPERATOR_ROLES

    return getattr(principal, "role", None) in OPERATOR_ROLES


@register.simple_tag(takes_context=True)
def triage_badge(context, oob: bool = False) -> str:
    """The nav's count of effects that need a human (not those the reconciler is settling by
    itself: gateway.console.settling). The triage page has it already, an action's answer
    counts it (out of band); every other page loads it after the page (``triage-badge``), so
    that no page pays for provider health it does not show."""
    request = context.get("request")
    principal = getattr(request, "principal", None)
    if principal is None:
        return ""
    waiting = getattr(request, "needs_human", None)
    if waiting is None and not oob:
        from django.urls import reverse

        return format_html(
            '<span id="triage-badge" class="count count-zero" hx-get="{}" hx-trigger="load" '
            'hx-swap="outerHTML"><span aria-hidden="true">…</span><span class="visually-hidden">'
            " counting</span></span>",
            reverse("console:triage-badge"),
        )
    if waiting is None:
        from gateway.console.settling import needs_human_count

        waiting = needs_human_count(principal)
        request.needs_human = waiting
    return format_html(
        '<span id="triage-badge" class="count{}"{}>{}<span class="visually-hidden">'
        " need a human</span></span>",
        " count-zero" if not waiting else "",
        mark_safe(' hx-swap-oob="true"') if oob else "",
        waiting,
    )
