"""POST ``/triage/bulk/<action>``: one action on a group of the triage queue (its provider,
type and cause), confirmed with the count the engineer saw.

The group is re-read when the post arrives; when it no longer has the count the button said,
nothing is done and the queue is redrawn (a 409): an engineer never acts on effects they
did not see. Each action calls, per effect, the service a single effect gets (reconciliation
registers its own: look up now, as a background job, re-arm, take); freezing the type or the
requester is the controls' service, and asks for a reason and a confirmation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django import forms
from django.http import HttpResponse, QueryDict
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from gateway.capabilities import effect_type_set_frozen, principal_set_frozen
from gateway.choices import OPERATOR_ROLES
from gateway.console import extensions
from gateway.console.base import (
    ConsoleRequest,
    badges_oob,
    console_view,
    is_partial,
    perform,
    role_may,
)
from gateway.console.selectors import (
    CAUSES,
    TriageFilters,
    TriageGroup,
    apply_triage_filters,
    effects_for_triage,
)
from gateway.errors import InvalidTransition, NotFound, ValidationProblem
from gateway.models import Effect, Principal

# At most this many effects per click (reconciliation.bulk.BULK_LIMIT is the same bound).
BULK_LIMIT = 500


@dataclass(frozen=True)
class MenuItem:
    name: str
    label: str
    tone: str
    # A freeze: the form asks for a reason, and the button for a confirmation (``confirm``).
    confirm: str = ""
    # Where its form posts (set by gateway.console.triage.bulk_menu, reversed once a page).
    url: str = ""


class BulkForm(forms.Form):
    provider = forms.CharField(max_length=64)
    type = forms.CharField(max_length=200)
    cause = forms.ChoiceField(choices=[(c, c) for c in CAUSES])
    expected = forms.IntegerField(min_value=1, max_value=BULK_LIMIT)
    # The triage queue's query string the form was on, to redraw (and go back to) it.
    query = forms.CharField(max_length=2000, required=False)
    # Why (the freezes require one; it goes into the freeze's event).
    reason = forms.CharField(max_length=500, required=False, strip=True)


def _reason(request: ConsoleRequest, ids: list[str], group: TriageGroup) -> str:
    said = request.POST.get("reason", "").strip()[:500]
    return f"{said} (incident: {len(ids)} effects {group.cause_label} at {group.provider})"


def _freeze_type(request: ConsoleRequest, ids: list[str], group: TriageGroup) -> str:
    changed = effect_type_set_frozen(
        tenant_id=request.principal.tenant_id,
        effect_type=group.type,
        principal=request.principal,
        frozen=True,
        reason=_reason(request, ids, group),
    )
    if not changed:
        return f"{group.type} was frozen already: nothing of it is dispatched."
    return f"Froze {group.type}: no new effect of this type is dispatched until it is unfrozen."


def _freeze_principal(request: ConsoleRequest, ids: list[str], group: TriageGroup) -> str:
    requesters = list(
        Principal.objects.filter(
            tenant_id=request.principal.tenant_id,
            pk__in=Effect.objects.filter(pk__in=ids).values("command__requested_by"),
        )
    )
    if len(requesters) != 1:
        raise InvalidTransition(
            f"The group's effects were asked for by {len(requesters)} principals: freeze them "
            "one by one on the controls page."
        )
    target = requesters[0]
    principal_set_frozen(
        target=target,
        principal=request.principal,
        frozen=True,
        reason=_reason(request, ids, group),
    )
    return f"Froze {target.name}: it submits nothing and nothing of it is dispatched."


GATEWAY_ACTIONS: dict[str, extensions.BulkAction] = {
    "freeze-type": extensions.BulkAction(
        label="Freeze the type", causes=frozenset(), run=_freeze_type, tone="quiet", reason=True
    ),
    "freeze-principal": extensions.BulkAction(
        label="Freeze the requester",
        causes=frozenset(),
        run=_freeze_principal,
        tone="quiet",
        reason=True,
    ),
}


def available_bulk_actions(principal: Principal, group: TriageGroup) -> list[MenuItem]:
    if group.count > BULK_LIMIT:
        return []
    items = []
    if role_may(principal, OPERATOR_ROLES):
        for name, action in extensions.bulk_actions.items():
            if not action.causes or group.cause in action.causes:
                items.append(MenuItem(name, action.label.format(count=group.count), action.tone))
        # The freezes come last and quiet, each with a reason and one confirmation prompt.
        items.append(
            MenuItem(
                "freeze-type",
                f"Freeze {group.type}",
                "quiet",
                confirm=f"Freeze {group.type}? No new effect of this type is dispatched "
                "until someone unfreezes it.",
            )
        )
        # Offered on every group (who asked is on the commands, not read for the menu); a
        # group asked for by several principals is refused with a 409 that says so.
        items.append(
            MenuItem(
                "freeze-principal",
                "Freeze the requester",
                "quiet",
                confirm="Freeze the principal who asked for these effects? It submits nothing "
                "and nothing of it is dispatched until someone unfreezes it.",
            )
        )
    return items


def _group_ids(request: ConsoleRequest, data: dict[str, Any]) -> tuple[TriageGroup, list[str]]:
    now = timezone.now()
    filters = TriageFilters.parse(
        {"provider": data["provider"], "type": data["type"], "cause": data["cause"]}
    )
    if (filters.provider, filters.type, filters.cause) != (
        data["provider"],
        data["type"],
        data["cause"],
    ):
        raise ValidationProblem("No such group.", errors={"group": ["unknown provider or type"]})
    ids = list(
        apply_triage_filters(effects_for_triage(principal=request.principal, now=now), filters, now)
        .order_by("command")
        .values_list("pk", flat=True)[: BULK_LIMIT + 1]
    )
    group = TriageGroup(data["provider"], data["type"], data["cause"], len(ids), now)
    if len(ids) != data["expected"]:
        raise InvalidTransition(
            f"The group changed: it has {len(ids)} effect{'s' if len(ids) != 1 else ''} now, "
            f"you saw {data['expected']}. Nothing was done; look at it again."
        )
    return group, ids


@require_POST
@console_view
def triage_bulk(request: ConsoleRequest, action: str) -> HttpResponse:
    """One bulk action on one group of the queue; answered with the redrawn queue."""
    spec = GATEWAY_ACTIONS.get(action) or extensions.bulk_actions.get(action)
    if spec is None:
        raise NotFound(f"No bulk action {action!r}.")
    form = BulkForm(request.POST)
    query = QueryDict(request.POST.get("query", ""))
    back = reverse("console:triage") + (f"?{query.urlencode()}" if query else "")

    def answer(oob: bool = False) -> str:
        from gateway.console.triage import _triage_context

        context = _triage_context(request, query) | {"oob": oob}
        html = render_to_string("gateway/effect_triage.html#queue", context, request=request)
        more = spec.answer(request) if spec.answer is not None and not oob else ""
        return html + badges_oob(request) + more

    def run(data: dict[str, Any]) -> str:
        if not role_may(request.principal, OPERATOR_ROLES):
            raise InvalidTransition(
                f"A principal with role {request.principal.role} cannot act on groups."
            )
        if spec.reason and not data["reason"]:
            raise ValidationProblem(
                "Say why: a freeze is kept with its reason.", errors={"reason": ["required"]}
            )
        group, ids = _group_ids(request, data)
        return spec.run(request, ids, group)

    response = perform(request, form=form, run=run, back=back, answer=answer)
    if response.status_code == 409 and is_partial(request):
        # The group changed under the engineer: the queue is redrawn as well (out of band),
        # so that what they see is what is there now.
        response.content = response.content + answer(oob=True).encode()
    return response
