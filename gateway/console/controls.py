"""``/controls``: freezes of effect types and principals, and capabilities (operators and
admins), each form the call of the service the API calls."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django import forms
from django.db.models import Count, Q
from django.http import HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from gateway import audit, capabilities, checkpoints, tokens
from gateway.choices import ADMIN_ROLES, OPERATOR_ROLES, SUBMITTER_ROLES
from gateway.console.base import ConsoleRequest, console_view, error_response, is_partial, perform
from gateway.console.forms import GRANT_EXPIRIES, GrantForm, ReasonForm, RequiredReasonForm
from gateway.console.selectors import capabilities_for_principal, type_freezes
from gateway.contracts import CONTRACTS, EffectContract
from gateway.errors import GatewayError, NotFound, NotPermitted
from gateway.models import ApiToken, Capability, EffectTypeFreeze, Principal
from gateway.templatetags.console import money

GRANTS_SHOWN = 100
TOKENS_SHOWN = 100


def _require_controls(principal: Principal) -> None:
    """The controls are the freezers' (the roles the capabilities services accept)."""
    if principal.role not in OPERATOR_ROLES:
        raise NotPermitted(
            f"The controls are for operators and admins; you are signed in as "
            f"{principal.role}. Ask an operator to freeze or unfreeze, or an admin for a grant."
        )


@dataclass(frozen=True)
class TypeRow:
    contract: EffectContract
    freeze: EffectTypeFreeze | None


@dataclass(frozen=True)
class GrantRow:
    grant: Capability
    state: str  # live, expired, revoked
    count: str
    amount: str


def _budget_amount(amount: int, currency: str) -> str:
    return money({"amount": amount, "currency": currency}) or f"{amount:,} (minor units)"


def _grant_row(grant: Capability, now: datetime) -> GrantRow:
    if grant.revoked_at is not None:
        state = "revoked"
    elif grant.expires_at is not None and grant.expires_at <= now:
        state = "expired"
    else:
        state = "live"
    count = (
        f"{grant.spent_count} of {grant.budget_count}"
        if grant.budget_count is not None
        else "no limit"
    )
    amount = "—"
    if grant.budget_amount is not None:
        currency = grant.budget_currency
        amount = (
            f"{_budget_amount(grant.spent_amount, currency)} of "
            f"{_budget_amount(grant.budget_amount, currency)}"
        )
    return GrantRow(grant=grant, state=state, count=count, amount=amount)


@dataclass(frozen=True)
class TokenRow:
    token: ApiToken
    state: str  # live, expired, revoked


def _token_row(token: ApiToken, now: datetime) -> TokenRow:
    if token.revoked_at is not None:
        state = "revoked"
    elif token.expires_at is not None and token.expires_at <= now:
        state = "expired"
    else:
        state = "live"
    return TokenRow(token=token, state=state)


def _controls_context(request: ConsoleRequest) -> dict[str, Any]:
    principal = request.principal
    _require_controls(principal)
    now = timezone.now()
    freezes = type_freezes(principal)
    people = list(
        Principal.objects.filter(tenant_id=principal.tenant_id)
        .annotate(
            live_grants=Count(
                "capabilities",
                filter=Q(capabilities__revoked_at__isnull=True)
                & (Q(capabilities__expires_at__isnull=True) | Q(capabilities__expires_at__gt=now)),
            )
        )
        .order_by("role", "name")
    )
    grants = list(capabilities_for_principal(principal)[:GRANTS_SHOWN])
    # Admins see the tenant's tokens, an operator its own (the API's rule, gateway.tokens).
    visible = list(
        tokens.tokens_visible_to(principal).select_related("rotated_from")[:TOKENS_SHOWN]
    )
    latest = checkpoints.checkpoints_read(principal.tenant.slug, limit=1)
    return {
        "tokens": [_token_row(token, now) for token in visible],
        "tokens_capped": len(visible) == TOKENS_SHOWN,
        "checkpoint": latest[0] if latest else None,
        "checkpoint_key": checkpoints.fingerprint(),
        "types": [
            TypeRow(contract, freezes.get(name)) for name, contract in sorted(CONTRACTS.items())
        ],
        "frozen_types": len(freezes),
        "people": people,
        # Who may hold a grant: those who submit, but never the admin granting (no self-grant).
        "grantees": [p for p in people if p.role in SUBMITTER_ROLES and p.pk != principal.pk],
        "grants": [_grant_row(grant, now) for grant in grants],
        "grants_capped": len(grants) == GRANTS_SHOWN,
        "may_grant": principal.role in ADMIN_ROLES,
        "expiries": GRANT_EXPIRIES,
        "now": now,
        "view_name": "controls",
        "chain": audit.seal_state(principal.tenant_id),
    }


@require_GET
@console_view
def controls(request: ConsoleRequest) -> HttpResponse:
    """``/controls``: frozen effect types, principals, capabilities (operators and admins)."""
    context = _controls_context(request)
    return render(request, "gateway/tenant_controls.html", context)


def _controls_answer(request: ConsoleRequest, section: str) -> Callable[[], str]:
    def answer() -> str:
        return render_to_string(
            f"gateway/tenant_controls.html#{section}", _controls_context(request), request=request
        )

    return answer


def _controls_perform(
    request: ConsoleRequest,
    *,
    form: forms.Form,
    run: Callable[[dict[str, Any]], str],
    section: str,
    target: str = "#flash",
) -> HttpResponse:
    return perform(
        request,
        form=form,
        run=run,
        back=reverse("console:controls") + f"#{section}",
        target=target,
        answer=_controls_answer(request, section),
    )


@require_POST
@console_view
def effect_type_freeze(request: ConsoleRequest, effect_type: str, verb: str) -> HttpResponse:
    """POST ``/controls/types/<type>/freeze|unfreeze``: ``effect_type_set_frozen``."""
    principal = request.principal
    _require_controls(principal)
    if verb not in ("freeze", "unfreeze"):
        raise NotFound(f"No action {verb!r}.")
    if effect_type not in CONTRACTS:
        raise NotFound(f"No effect type {effect_type}.")
    freeze = verb == "freeze"

    def run(data: dict[str, Any]) -> str:
        changed = capabilities.effect_type_set_frozen(
            tenant_id=principal.tenant_id,
            effect_type=effect_type,
            principal=principal,
            frozen=freeze,
            reason=data["reason"],
        )
        if freeze:
            if not changed:
                return f"{effect_type} was already frozen."
            return (
                f"Froze {effect_type}: no command of this type is dispatched in "
                f"{principal.tenant.slug} until it is unfrozen."
            )
        if not changed:
            return f"{effect_type} was not frozen."
        return f"Unfroze {effect_type}: its commands may be dispatched again."

    return _controls_perform(
        request,
        form=(RequiredReasonForm if freeze else ReasonForm)(request.POST),
        run=run,
        section="types",
    )


@require_POST
@console_view
def principal_freeze(request: ConsoleRequest, name: str, verb: str) -> HttpResponse:
    """POST ``/controls/principals/<name>/freeze|unfreeze``: ``principal_set_frozen``."""
    principal = request.principal
    _require_controls(principal)
    if verb not in ("freeze", "unfreeze"):
        raise NotFound(f"No action {verb!r}.")
    target = Principal.objects.filter(tenant_id=principal.tenant_id, name=name).first()
    if target is None:
        raise NotFound(f"No principal {name}.")
    freeze = verb == "freeze"

    def run(data: dict[str, Any]) -> str:
        capabilities.principal_set_frozen(
            target=target, principal=principal, frozen=freeze, reason=data.get("reason", "")
        )
        if freeze:
            return (
                f"Froze {target.name}: it may submit, approve or operate nothing, and none of "
                "its commands is dispatched, until it is unfrozen."
            )
        return f"Unfroze {target.name}."

    # Every freeze gives a reason (the same form as a type's); unfreezing needs none.
    form = RequiredReasonForm(request.POST) if freeze else forms.Form(request.POST)
    return _controls_perform(request, form=form, run=run, section="principals")


@require_POST
@console_view
def capability_revoke(request: ConsoleRequest, capability_id: str) -> HttpResponse:
    """POST ``/controls/capabilities/<id>/revoke``: ``capability_revoke``."""
    principal = request.principal
    _require_controls(principal)
    grant = capabilities_for_principal(principal).filter(pk=capability_id).first()
    if grant is None:
        raise NotFound(f"No capability {capability_id}.")

    def run(data: dict[str, Any]) -> str:
        capabilities.capability_revoke(capability=grant, principal=principal, reason=data["reason"])
        return (
            f"Revoked {grant.pk} of {grant.principal.name}: commands submitted under it and not "
            "yet sent will not be sent."
        )

    return _controls_perform(
        request, form=RequiredReasonForm(request.POST), run=run, section="grants"
    )


@require_POST
@console_view
def capability_grant(request: ConsoleRequest) -> HttpResponse:
    """POST ``/controls/capabilities``: ``capability_grant`` (admins)."""
    principal = request.principal
    _require_controls(principal)
    if principal.role not in ADMIN_ROLES:
        raise NotPermitted("Only an admin grants capabilities.")

    def run(data: dict[str, Any]) -> str:
        target = Principal.objects.filter(
            tenant_id=principal.tenant_id, name=data["principal"]
        ).first()
        if target is None:
            raise NotFound(f"No principal {data['principal']}.")
        grant = capabilities.capability_grant(
            granted_by=principal.label,
            principal=target,
            effect_types=data["effect_types"],
            resource_selector=data["resource_selector"] or "*",
            budget_count=data["budget_count"],
            budget_amount=data["budget_amount"],
            budget_currency=data["budget_currency"],
            expires_in=data["expires_in"],
        )
        return (
            f"Granted {grant.pk} to {target.name}: {' '.join(grant.effect_types)} on "
            f"{grant.resource_selector}."
        )

    return _controls_perform(
        request, form=GrantForm(request.POST), run=run, section="grants", target="#grant-error"
    )


def _visible_token(principal: Principal, token_id: int) -> ApiToken:
    token = tokens.tokens_visible_to(principal).filter(pk=token_id).first()
    if token is None:
        raise NotFound(f"No token {token_id}.")
    return token


@require_POST
@console_view
def token_revoke(request: ConsoleRequest, token_id: int) -> HttpResponse:
    """POST ``/controls/tokens/<id>/revoke``: ``token_revoke``."""
    principal = request.principal
    _require_controls(principal)
    token = _visible_token(principal, token_id)

    def run(data: dict[str, Any]) -> str:
        tokens.token_revoke(token=token, actor=principal, reason=data["reason"])
        return f"Revoked {token.prefix}… of {token.principal.name}: it is refused from now on."

    return _controls_perform(
        request, form=RequiredReasonForm(request.POST), run=run, section="tokens"
    )


@require_POST
@console_view
def token_rotate(request: ConsoleRequest, token_id: int) -> HttpResponse:
    """POST ``/controls/tokens/<id>/rotate``: ``token_rotate``. The new token is shown once,
    in this answer only (never in a flash message, which may travel in a cookie), so there is
    no redirect: without JavaScript the whole page comes back with it."""
    principal = request.principal
    _require_controls(principal)
    token = _visible_token(principal, token_id)
    try:
        new, clear = tokens.token_rotate(token=token, actor=principal)
    except GatewayError as exc:
        return error_response(request, exc, target="#flash", back=reverse("console:controls"))
    context = {
        **_controls_context(request),
        "new_token": {"clear": clear, "prefix": new.prefix, "principal": new.principal.name},
    }
    if is_partial(request):
        return render(request, "gateway/tenant_controls.html#tokens", context)
    return render(request, "gateway/tenant_controls.html", context)
