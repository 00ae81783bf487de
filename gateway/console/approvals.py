"""``/approvals``: commands waiting for an approver, in plain words, with their digest."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.db.models import Count, Max
from django.http import HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET

from gateway import selectors, services, signing
from gateway.choices import APPROVER_ROLES, EffectStatus
from gateway.console import extensions
from gateway.console.base import ConsoleRequest, console_view, poll_token, render_polled, role_may
from gateway.contracts import EffectContract, get_contract
from gateway.integrity import payload_to_show
from gateway.models import Effect, EffectTypeFreeze, Principal, SigningKey
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
    # Why approving it would not dispatch it now (frozen: the effect, its type, its saga).
    blocked: str = ""
    # A deploy promotion: what is live now in that environment (sha, release, when).
    live: Effect | None = None
    # Other effects of the tenant with the same digest that already happened.
    look_alikes: tuple[Effect, ...] = ()
    # Why the record failed verification (gateway.integrity), or "": nothing to decide then.
    unverified: str = ""
    # Approving needs the approver's passkey (gateway.signing's policy), and whether the
    # approver has a confirmed one to sign with.
    passkey_required: bool = False
    has_passkey: bool = False


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


PROMOTION = "deployment.release.promote"
# What "already happened" means for a look-alike.
HAPPENED = (S.CONFIRMED, S.COMPENSATING, S.COMPENSATED, S.COMPENSATION_FAILED)


def blocked_reasons(principal: Principal, effects: list[Effect]) -> dict[str, str]:
    """Why each effect would not be dispatched right after an approval: frozen itself, its
    type frozen in the tenant, or (through ``extensions.dispatch_blockers``) its saga."""
    frozen_types = set(
        EffectTypeFreeze.objects.filter(
            tenant_id=principal.tenant_id, type__in={e.type for e in effects}
        ).values_list("type", flat=True)
    )
    reasons: dict[str, str] = {}
    for blockers in extensions.dispatch_blockers:
        reasons.update(blockers(principal, effects))
    for effect in effects:
        if effect.frozen:
            reasons[effect.pk] = "the effect is frozen"
        elif effect.type in frozen_types:
            reasons[effect.pk] = f"{effect.type} is frozen in this tenant"
    return reasons


def live_promotion(principal: Principal, effect: Effect) -> Effect | None:
    """For a deploy promotion: the latest promotion of the same service to the same
    environment that happened (what is live now, as far as the gateway knows)."""
    if effect.type != PROMOTION:
        return None
    command = effect.command
    return (
        Effect.objects.filter(
            tenant_id=principal.tenant_id,
            type=PROMOTION,
            status=S.CONFIRMED,
            # The resource's columns, not its JSON: the command index on (tenant, resource
            # type, resource id) finds the service's commands; by the JSON, every poll of
            # the inbox read the whole command table.
            command__tenant_id=principal.tenant_id,
            command__resource_type=command.resource_type,
            command__resource_id=command.resource_id,
            command__payload_redacted__environment=(command.payload_redacted or {}).get(
                "environment"
            ),
        )
        .select_related("command")
        .order_by("-confirmed_at")
        .first()
    )


def look_alikes(principal: Principal, effects: list[Effect]) -> dict[str, list[Effect]]:
    """Effects of the tenant that already happened with the digest of one of ``effects``
    under another key: the same thing asked twice, perhaps by mistake. One query, served by
    the hash index ``command_digest`` (without it, a scan of every command at each poll)."""
    digests = {e.command.payload_digest: e for e in effects}
    found: dict[str, list[Effect]] = {}
    for other in (
        Effect.objects.filter(
            tenant_id=principal.tenant_id,
            command__payload_digest__in=list(digests),
            status__in=HAPPENED,
        )
        .exclude(pk__in=[e.pk for e in effects])
        .select_related("command")
        .order_by("command")[:100]
    ):
        mine = digests[other.command.payload_digest]
        if other.command.idempotency_key != mine.command.idempotency_key:
            found.setdefault(mine.pk, []).append(other)
    return found


def has_passkey(principal: Principal) -> bool:
    """Whether ``principal`` has a confirmed, unrevoked passkey to sign approvals with."""
    return signing.usable_keys(principal, SigningKey.Kind.PASSKEY).exists()


def approval_card(
    principal: Principal,
    effect: Effect,
    *,
    blocked: dict[str, str] | None = None,
    alikes: dict[str, list[Effect]] | None = None,
    with_passkey: bool | None = None,
) -> ApprovalCard:
    contract = get_contract(effect.type)
    # What the approver reads is the redaction of the sealed payload whose digest they sign,
    # not the stored copy alone (a writer of that column would show them another amount).
    shown = payload_to_show(effect.command, clear=False)
    payload = shown.payload if shown.verified and shown.payload is not None else {}
    mine = effect.command.requested_by_id == principal.pk
    if blocked is None:
        blocked = blocked_reasons(principal, [effect])
    if alikes is None:
        alikes = look_alikes(principal, [effect])
    return ApprovalCard(
        effect=effect,
        contract=contract,
        headline=plain_words(effect, contract, payload),
        cost=money(payload),
        payload=payload,
        mine=mine,
        can_decide=shown.verified
        and effect.status == S.AWAITING_APPROVAL
        and role_may(principal, APPROVER_ROLES),
        blocked=blocked.get(effect.pk, ""),
        live=live_promotion(principal, effect),
        look_alikes=tuple(alikes.get(effect.pk, ())),
        unverified=shown.problem,
        passkey_required=signing.signature_required(
            tenant=principal.tenant.slug, contract=contract
        ),
        has_passkey=has_passkey(principal) if with_passkey is None else with_passkey,
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
    blocked = blocked_reasons(principal, page)
    alikes = look_alikes(principal, page)
    mine = has_passkey(principal)
    cards = [
        approval_card(principal, effect, blocked=blocked, alikes=alikes, with_passkey=mine)
        for effect in page
    ]
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
