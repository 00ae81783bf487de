"""Remote MCP clients through OAuth 2.1: the gateway is their authorization server.

django-oauth-toolkit speaks the protocol (metadata, dynamic client registration, the
authorization code with PKCE, refresh, revocation, RFC 8707 resource indicators); this module
holds what is the gateway's own:

- which MCP endpoints tokens may be issued for (``GATEWAY_OAUTH_RESOURCES``);
- the connection an admin approves: the client acts as one principal of the admin's tenant,
  under that principal's grants (``connection_approve``), until revoked (``connection_revoke``);
- how an access token becomes that principal on the API (``principal_for_access_token``): only
  when the MCP endpoint presenting it names itself (``RESOURCE_HEADER``) and the token was
  issued for exactly that endpoint. A token for another audience is refused.

Nothing is cached: a revoked connection or token is refused from the next request on.
"""

from __future__ import annotations

import hashlib

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone
from oauth2_provider.models import AccessToken, Application, Grant, RefreshToken

from gateway import audit
from gateway.choices import Role
from gateway.errors import InvalidTransition, NotPermitted, ValidationProblem
from gateway.models import Capability, OAuthConnection, Principal

# The header in which the MCP server names the endpoint (its resource URL) a token reached it
# at; the same name is in effect_gateway_client.mcp_server.
RESOURCE_HEADER = "X-Gateway-Resource"


class TokenRefused(Exception):
    """The access token is unknown, expired, revoked, or not for this audience."""


def allowed_resources() -> list[str]:
    return list(settings.GATEWAY_OAUTH_RESOURCES)


def resource_allowed(uri: str) -> bool:
    return uri in settings.GATEWAY_OAUTH_RESOURCES


def live_grants(principal: Principal) -> list[Capability]:
    """What a client acting as ``principal`` may submit: its live capabilities."""
    now = timezone.now()
    return list(
        Capability.objects.filter(principal=principal, revoked_at__isnull=True)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
        .order_by("created_at")
    )


def principals_to_act_as(admin: Principal):
    """The principals an admin may let a client act as: the tenant's agents, not frozen."""
    return Principal.objects.filter(
        tenant_id=admin.tenant_id, role=Role.AGENT, frozen=False
    ).order_by("name")


def connection_approve(
    *, application: Application, principal: Principal, actor: Principal
) -> OAuthConnection:
    """Let ``application`` act as ``principal``; a new approval replaces an earlier one."""
    if actor.role != Role.ADMIN:
        raise NotPermitted("Only a tenant admin approves an MCP client.")
    if principal.tenant_id != actor.tenant_id or principal.role != Role.AGENT:
        raise ValidationProblem(
            "A client acts as one of this tenant's agents.", errors={"principal": ["not an agent"]}
        )
    if principal.frozen:
        raise ValidationProblem(
            f"Principal {principal.name} is frozen.", errors={"principal": ["frozen"]}
        )
    with transaction.atomic():
        # The row of the application, locked: two admins approving the same client at once
        # leave one connection, the later one's.
        Application.objects.select_for_update().get(pk=application.pk)
        connection = OAuthConnection.objects.filter(application=application).first()
        if connection is not None and connection.tenant_id != actor.tenant_id:
            raise NotPermitted("This client is connected to another tenant.")
        connection, _ = OAuthConnection.objects.update_or_create(
            application=application,
            defaults={
                "tenant_id": actor.tenant_id,
                "principal": principal,
                "approved_by": actor.label,
                "approved_at": timezone.now(),
                "revoked_at": None,
                "revoked_by": "",
            },
        )
        audit.record_control(
            tenant_id=actor.tenant_id,
            kind="oauth_client_approved",
            subject=f"oauth-client:{application.client_id}",
            actor=actor.label,
            principal=actor,
            data={
                "client_name": application.name,
                "redirect_uris": application.redirect_uris.split(),
                "acts_as": principal.name,
            },
        )
    return connection


def connection_revoke(*, connection: OAuthConnection, actor: Principal) -> OAuthConnection:
    """End the connection and every token of its client, at once."""
    if actor.role != Role.ADMIN or actor.tenant_id != connection.tenant_id:
        raise NotPermitted("Only an admin of its tenant revokes an MCP client.")
    with transaction.atomic():
        # Compare-and-set against a second admin revoking the same connection.
        changed = OAuthConnection.objects.filter(pk=connection.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now(), revoked_by=actor.label
        )
        if not changed:
            raise InvalidTransition("This MCP client is already revoked.")
        application_id = connection.application_id
        AccessToken.objects.filter(application_id=application_id).delete()
        RefreshToken.objects.filter(application_id=application_id, revoked__isnull=True).update(
            revoked=timezone.now()
        )
        Grant.objects.filter(application_id=application_id).delete()
        audit.record_control(
            tenant_id=connection.tenant_id,
            kind="oauth_client_revoked",
            subject=f"oauth-client:{connection.application.client_id}",
            actor=actor.label,
            principal=actor,
            data={"acts_as": connection.principal.name},
        )
    connection.refresh_from_db()
    return connection


def connections_of(tenant_id: int):
    """The tenant's MCP clients: connected ones first, newest approval first."""
    return (
        OAuthConnection.objects.filter(tenant_id=tenant_id)
        .select_related("application", "principal")
        .order_by("revoked_at", "-approved_at")
    )


def live_token_counts(application_ids: list[int]) -> dict[int, int]:
    """Unexpired access tokens per application."""
    rows = (
        AccessToken.objects.filter(application_id__in=application_ids, expires__gt=timezone.now())
        .values("application_id")
        .annotate(n=Count("id"))
    )
    return {row["application_id"]: row["n"] for row in rows}


def principal_for_access_token(
    token: str, *, resource: str | None
) -> tuple[Principal, AccessToken]:
    """The principal an OAuth access token acts as, presented at the MCP endpoint
    ``resource``. Raises TokenRefused."""
    if not resource:
        raise TokenRefused(
            "An OAuth access token is accepted only from the MCP endpoint it was issued for."
        )
    checksum = hashlib.sha256(token.encode()).hexdigest()
    record = (
        AccessToken.objects.select_related("application").filter(token_checksum=checksum).first()
    )
    if record is None or record.is_expired():
        raise TokenRefused("The token is not valid, expired or was revoked.")
    if resource not in (record.resource or []) or not resource_allowed(resource):
        raise TokenRefused(f"The token was not issued for {resource}.")
    connection = (
        OAuthConnection.objects.select_related("principal__tenant")
        .filter(application_id=record.application_id, revoked_at__isnull=True)
        .first()
    )
    if connection is None:
        raise TokenRefused("This MCP client's connection was revoked.")
    return connection.principal, record
