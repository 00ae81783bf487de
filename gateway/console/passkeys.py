"""``/passkeys``: approvers register passkeys and confirm each other's; the approval inbox asks
for a challenge and sends the assertion with the approval (``static/passkeys.js`` runs the
WebAuthn ceremonies: the console's CSP forbids inline scripts).

The relying party id is ``GATEWAY_WEBAUTHN_RP_ID``, or the request's host name when it is
unset (``localhost`` in development and tests); the origin is the request's own unless
``GATEWAY_WEBAUTHN_ORIGINS`` names the allowed ones.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.http import HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from gateway import selectors, signing
from gateway.choices import APPROVER_ROLES
from gateway.console.base import ConsoleRequest, console_view, role_may
from gateway.errors import GatewayError, NotFound
from gateway.models import SigningKey


def rp_id_for(request: ConsoleRequest) -> str:
    return settings.GATEWAY_WEBAUTHN_RP_ID or request.get_host().rsplit(":", 1)[0].strip("[]")


def origin_for(request: ConsoleRequest) -> str:
    return f"{request.scheme}://{request.get_host()}"


def signed_from_form(
    request: ConsoleRequest, data: dict[str, Any]
) -> signing.SignedDecision | None:
    """The passkey assertion the inbox's script put in the approve form, if any."""
    if not data.get("signature"):
        return None
    return signing.SignedDecision(
        nonce=data.get("signature_nonce", ""),
        key_id=data.get("signature_key_id", ""),
        signature=data["signature"],
        authenticator_data=data.get("signature_authenticator_data", ""),
        client_data_json=data.get("signature_client_data_json", ""),
        user_handle=data.get("signature_user_handle") or None,
        rp_id=rp_id_for(request),
        origin=origin_for(request),
    )


def _json_error(exc: GatewayError) -> JsonResponse:
    return JsonResponse({"title": exc.title, "detail": exc.detail}, status=exc.status)


@require_GET
@console_view
def passkeys(request: ConsoleRequest) -> HttpResponse:
    """Your passkeys, and (approvers, admins) the tenant's passkeys waiting for a confirmation."""
    principal = request.principal
    mine = SigningKey.objects.filter(principal=principal).order_by("-created_at")
    pending = (
        SigningKey.objects.filter(
            principal__tenant_id=principal.tenant_id,
            kind=SigningKey.Kind.PASSKEY,
            confirmed_at__isnull=True,
            revoked_at__isnull=True,
        )
        .exclude(principal=principal)
        .select_related("principal")
        .order_by("created_at")
    )
    return render(
        request,
        "gateway/signing_keys.html",
        {
            "mine": mine,
            "pending": pending if role_may(principal, APPROVER_ROLES) else [],
            "may_register": role_may(principal, APPROVER_ROLES),
            "rp_id": rp_id_for(request),
            "view_name": "approvals",
        },
    )


@require_POST
@console_view
def passkey_options(request: ConsoleRequest) -> HttpResponse:
    """POST: the options of ``navigator.credentials.create`` (JSON), with a fresh challenge."""
    try:
        options = signing.passkey_registration_options(
            principal=request.principal, rp_id=rp_id_for(request)
        )
    except GatewayError as exc:
        return _json_error(exc)
    return JsonResponse(options)


@require_POST
@console_view
def passkey_register(request: ConsoleRequest) -> HttpResponse:
    """POST (JSON ``{credential, name}``): keep the new passkey, pending its confirmation."""
    try:
        body = json.loads(request.body or b"{}")
        if not isinstance(body, dict) or not isinstance(body.get("credential"), dict):
            raise ValueError("credential missing")
    except ValueError:
        return JsonResponse({"title": "Bad request", "detail": "Not a registration."}, status=400)
    try:
        key = signing.passkey_register(
            principal=request.principal,
            credential=body["credential"],
            rp_id=rp_id_for(request),
            origin=origin_for(request),
            name=str(body.get("name") or "")[:100],
        )
    except GatewayError as exc:
        return _json_error(exc)
    return JsonResponse({"id": key.pk, "credential_id": key.credential_id, "confirmed": False})


def _key_of_tenant(request: ConsoleRequest, key_id: int) -> SigningKey:
    key = (
        SigningKey.objects.select_related("principal")
        .filter(pk=key_id, principal__tenant_id=request.principal.tenant_id)
        .first()
    )
    if key is None:
        raise NotFound("No such key.")
    return key


@require_POST
@console_view
def passkey_confirm(request: ConsoleRequest, key_id: int) -> HttpResponse:
    """POST: another approver or an admin vouches for a pending passkey."""
    key = signing.signing_key_confirm(key=_key_of_tenant(request, key_id), actor=request.principal)
    messages.success(request, f"Confirmed the passkey of {key.principal.name}.")
    return redirect(reverse("console:passkeys"))


@require_POST
@console_view
def passkey_revoke(request: ConsoleRequest, key_id: int) -> HttpResponse:
    key = signing.signing_key_revoke(key=_key_of_tenant(request, key_id), actor=request.principal)
    messages.success(request, f"Revoked {key}.")
    return redirect(reverse("console:passkeys"))


@require_POST
@console_view
def approval_challenge(request: ConsoleRequest, effect_id: str) -> HttpResponse:
    """POST: a challenge for the caller's passkey to sign the approval of this effect."""
    try:
        effect = selectors.effect_get(principal=request.principal, effect_id=effect_id)
        issued = signing.approval_challenge_issue(principal=request.principal, effect=effect)
    except GatewayError as exc:
        return _json_error(exc)
    data = issued.as_data()
    data["rp_id"] = rp_id_for(request)
    return JsonResponse(data)
