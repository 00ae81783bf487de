"""``/providers/<name>/credentials``: the tenant's own credentials for one provider (operators
see them, admins set, rotate and retire them), each form the call of the service the API
calls (gateway.provider_credentials).

``credentials_panel`` is what the partial ``gateway/partials/provider_credentials.html``
shows; a page that includes the partial (the providers overview) passes it as ``panel``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django import forms
from django.http import HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.text import slugify
from django.views.decorators.http import require_GET, require_POST

from gateway import provider_credentials as credentials
from gateway.choices import ADMIN_ROLES, CredentialState
from gateway.console.base import ConsoleRequest, console_view, is_partial, perform, role_may
from gateway.models import Principal, ProviderCredential

PARTIAL = "gateway/partials/provider_credentials.html"


class SecretForm(forms.Form):
    # strip=False: the service strips and checks it, with messages that never repeat it.
    secret = forms.CharField(strip=False, max_length=credentials.MAX_LENGTH)
    # Its own rate limit ("25/s"); empty: the provider's (the service checks it).
    rate_limit = forms.CharField(required=False, max_length=32)


class RotateForm(SecretForm):
    confirm = forms.BooleanField(
        required=True, error_messages={"required": "tick the box to confirm the rotation"}
    )


class RetireForm(forms.Form):
    reason = forms.CharField(max_length=500)
    force = forms.BooleanField(required=False)


@dataclass(frozen=True)
class CredentialRow:
    credential: ProviderCredential
    unsettled: int  # effects it sent that are not settled yet (retiring it is refused)


@dataclass(frozen=True)
class CredentialsPanel:
    """One provider's credentials as the partial shows them."""

    provider: str
    anchor: str  # the partial's element id
    rows: list[CredentialRow]
    sends_with: str  # "tenant" or "deployment"
    deployment_fingerprint: str
    may_manage: bool
    provider_rate: str  # the provider's configured rate limit ("" for none)


def credentials_panel(principal: Principal, provider: str) -> CredentialsPanel:
    """The panel of ``provider``'s credentials for ``principal`` (operators and admins)."""
    found = list(credentials.credentials_visible_to(principal, provider).select_related("replaces"))
    rows = [
        CredentialRow(
            row,
            credentials.unsettled_sent_with(row) if row.state != CredentialState.RETIRED else 0,
        )
        for row in found
    ]
    active = any(row.state == CredentialState.ACTIVE for row in found)
    return CredentialsPanel(
        provider=provider,
        anchor=f"credentials-{slugify(provider)}",
        rows=rows,
        sends_with="tenant" if active else "deployment",
        deployment_fingerprint=credentials.deployment_fingerprint(provider),
        may_manage=role_may(principal, ADMIN_ROLES),
        provider_rate=credentials.provider_rate(provider),
    )


def _page(request: ConsoleRequest, provider: str) -> HttpResponse:
    context: dict[str, Any] = {"panel": credentials_panel(request.principal, provider)}
    if is_partial(request):
        return render(request, PARTIAL, context)
    return render(request, "gateway/provider_credentials.html", context)


@require_GET
@console_view
def provider_credentials(request: ConsoleRequest, name: str) -> HttpResponse:
    """GET: the page (or, htmx, the panel)."""
    return _page(request, name)


def _act(request: ConsoleRequest, name: str, form: forms.Form, run) -> HttpResponse:
    credentials_panel(request.principal, name)  # 404 / 403 before the form is read
    back = reverse("console:provider-credentials", args=[name])
    anchor = f"#credentials-{slugify(name)}"
    return perform(
        request,
        form=form,
        run=run,
        back=back,
        answer=lambda: render(
            request, PARTIAL, {"panel": credentials_panel(request.principal, name)}
        ).content.decode(),
        target=f"{anchor}-error",
    )


@require_POST
@console_view
def provider_credential_set(request: ConsoleRequest, name: str) -> HttpResponse:
    """POST: ``credential_set``, the tenant's first credential for the provider."""

    def run(data: dict[str, Any]) -> str:
        row = credentials.credential_set(
            actor=request.principal,
            provider=name,
            secret=data["secret"],
            rate_limit=data.get("rate_limit", ""),
        )
        return f"{name} sends this tenant's effects with {row.fingerprint} from now on."

    return _act(request, name, SecretForm(request.POST), run)


@require_POST
@console_view
def provider_credential_rotate(request: ConsoleRequest, name: str) -> HttpResponse:
    """POST: ``credential_rotate``, after the confirmation box is ticked."""

    def run(data: dict[str, Any]) -> str:
        row = credentials.credential_rotate(
            actor=request.principal,
            provider=name,
            secret=data["secret"],
            rate_limit=data.get("rate_limit", ""),
        )
        replaced = row.replaces.fingerprint if row.replaces else "the old one"
        return (
            f"Rotated: new sends use {row.fingerprint}; {replaced} keeps serving the effects "
            "it sent until you retire it."
        )

    return _act(request, name, RotateForm(request.POST), run)


@require_POST
@console_view
def provider_credential_retire(
    request: ConsoleRequest, name: str, credential_id: int
) -> HttpResponse:
    """POST: ``credential_retire``."""

    def run(data: dict[str, Any]) -> str:
        row = credentials.credential_retire(
            actor=request.principal,
            provider=name,
            credential_id=credential_id,
            reason=data["reason"],
            force=data["force"],
        )
        return f"Retired {row.fingerprint}: it serves nothing any more."

    return _act(request, name, RetireForm(request.POST), run)
