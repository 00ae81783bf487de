"""``/audit``: the tenant's audit list — who did what to which effect (or which type,
principal, grant), newest first, from the events of the hash chain (gateway.audit). Filtered
by actor, action, effect id and time range, paged by keyset on the event id, exported as CSV
or JSON Lines (gateway.console.exports).

Operators, approvers and admins read it: the roles that may prove any event of the tenant
(``gateway.api.audit.PROOF_ROLES``). An agent's own effects' events are on their pages.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.db.models import Q, QuerySet
from django.http import HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from gateway.choices import APPROVER_ROLES, OPERATOR_ROLES
from gateway.console.base import ConsoleRequest, console_view
from gateway.errors import NotPermitted
from gateway.models import EffectEvent, Principal

AUDIT_READERS = OPERATOR_ROLES | APPROVER_ROLES
AUDIT_PAGE_SIZE = 50


def _when(raw: str) -> datetime | None:
    """A ``datetime-local`` value (or any ISO 8601 time), in the server's time zone if it
    names none; None when empty or malformed."""
    try:
        value = datetime.fromisoformat(raw.strip())
    except ValueError:
        return None
    if timezone.is_naive(value):
        value = timezone.make_aware(value)
    return value


@dataclass(frozen=True)
class AuditFilters:
    """The audit list's query string, parsed; what does not parse is left out."""

    actor: str = ""
    action: str = ""
    effect: str = ""
    start: str = ""
    end: str = ""
    after: str = ""

    @classmethod
    def parse(cls, params) -> AuditFilters:
        start, end = params.get("start", ""), params.get("end", "")
        after = params.get("after", "")
        return cls(
            actor=params.get("actor", "").strip()[:200],
            action=params.get("action", "").strip()[:40],
            effect=params.get("effect", "").strip()[:32],
            start=start[:40] if _when(start) else "",
            end=end[:40] if _when(end) else "",
            after=after if after.isdigit() and len(after) < 19 else "",
        )

    def querystring(self, **changes: str) -> str:
        values = {**self.__dict__, **changes}
        return urlencode([(key, value) for key, value in values.items() if value])

    @property
    def active(self) -> bool:
        return bool(self.actor or self.action or self.effect or self.start or self.end)


def audit_events(*, principal: Principal, filters: AuditFilters) -> QuerySet[EffectEvent]:
    """The tenant's events matching ``filters``, newest first, from the cursor ``after`` on.
    An effect's events are read by the (effect, id) index; the rest walk the primary key
    backwards from the newest, which a page of 50 stops early."""
    if principal.role not in AUDIT_READERS:
        raise NotPermitted(f"A principal with role {principal.role} cannot read the audit list.")
    query = EffectEvent.objects.filter(tenant_id=principal.tenant_id)
    if filters.actor:
        # "operator:oscar" whole, or the name alone ("oscar").
        query = query.filter(Q(actor=filters.actor) | Q(actor__endswith=f":{filters.actor}"))
    if filters.action:
        query = query.filter(kind=filters.action)
    if filters.effect:
        query = query.filter(effect_id=filters.effect)
    if filters.start:
        query = query.filter(created_at__gte=_when(filters.start))
    if filters.end:
        query = query.filter(created_at__lte=_when(filters.end))
    if filters.after:
        query = query.filter(pk__lt=int(filters.after))
    # The effect's type beside its id (a left join: control actions name no effect).
    return query.select_related("effect").only(*EVENT_FIELDS).order_by("-pk")


# What the list and its export read of an event (never its transaction id).
EVENT_FIELDS = (
    "created_at",
    "actor",
    "kind",
    "effect",
    "effect__type",
    "subject",
    "from_status",
    "to_status",
    "reason",
    "data",
)


EXPORT_COLUMNS = (
    "event_id",
    "at",
    "actor",
    "action",
    "effect_id",
    "effect_type",
    "subject",
    "from_status",
    "to_status",
    "reason",
    "data",
)


def export_row(event: EffectEvent) -> dict[str, Any]:
    return {
        "event_id": event.pk,
        "at": event.created_at,
        "actor": event.actor,
        "action": event.kind,
        "effect_id": event.effect_id or "",
        "effect_type": event.effect.type if event.effect is not None else "",
        "subject": event.subject,
        "from_status": event.from_status,
        "to_status": event.to_status,
        "reason": event.reason,
        "data": event.data,
    }


@require_GET
@console_view
def audit(request: ConsoleRequest) -> HttpResponse:
    """``/audit``: one keyset page of the tenant's audit list."""
    filters = AuditFilters.parse(request.GET)
    query = audit_events(principal=request.principal, filters=filters).defer("data")
    page = list(query[: AUDIT_PAGE_SIZE + 1])
    has_next = len(page) > AUDIT_PAGE_SIZE
    page = page[:AUDIT_PAGE_SIZE]
    return render(
        request,
        "gateway/audit_list.html",
        {
            "filters": filters,
            "events": page,
            "next_query": filters.querystring(after=str(page[-1].pk)) if has_next else "",
            "first_query": filters.querystring(after=""),
            "view_name": "audit",
        },
    )
