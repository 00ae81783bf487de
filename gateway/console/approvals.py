"""``/approvals``: commands waiting for an approver, in plain words, with their digest."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.db.models import Count, Max
from django.http import HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET

from gateway import selectors, services
from gateway.choices import APPROVER_ROLES, EffectStatus
from gateway.console.base import ConsoleRequest, console_view, poll_token, render_polled, role_may
from gateway.contracts import EffectContract, get_contract
from gateway.models import Effect, Principal
from gateway.templatetags.console import money, since, until

S = EffectStatus


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


def approval_card(principal: Principal, effect: Effect) -> ApprovalCard:
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
        can_decide=effect.status == S.AWAITING_APPROVAL and role_may(principal, APPROVER_ROLES),
    )


def _approvals_context(request: ConsoleRequest) -> dict[str, Any]:
    principal = request.principal
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
    cards = [approval_card(principal, effect) for effect in page]
    return {
        "cards": cards,
        "count": summary["count"],
        "after": after,
        "next_query": urlencode({"after": page[-1].pk}) if has_next else "",
        # The cards and their "… ago" / "expires in …" labels: the poll redraws when they move.
        "token": poll_token(
            after,
            summary["count"],
            summary["latest"],
            [
                (c.effect.pk, since(c.effect.created_at), until(c.effect.command.expires_at))
                for c in cards
            ],
        ),
        "may_approve": role_may(principal, APPROVER_ROLES),
        "now": timezone.now(),
        "view_name": "approvals",
    }


@require_GET
@console_view
def approvals(request: ConsoleRequest) -> HttpResponse:
    """``/approvals``: commands waiting for an approver, in plain words, with their digest."""
    return render_polled(
        request, "gateway/effect_approvals.html", "inbox", _approvals_context(request)
    )
