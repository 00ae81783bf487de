"""Reads of the webhooks app, scoped by tenant."""

from __future__ import annotations

from django.db.models import QuerySet

from gateway.choices import OPERATOR_ROLES
from gateway.errors import NotFound
from gateway.models import Principal
from gateway.webhooks.models import WebhookEndpoint, WebhookMessage


def endpoints_for_principal(principal: Principal) -> QuerySet[WebhookEndpoint]:
    """The endpoints the principal manages: its tenant's (operators, admins), or its own (an
    agent; another principal's does not exist for it). Deleted ones are gone for everyone."""
    query = WebhookEndpoint.objects.filter(
        tenant_id=principal.tenant_id, deleted_at__isnull=True
    ).select_related("owner")
    if principal.role not in OPERATOR_ROLES:
        query = query.filter(owner=principal)
    return query.order_by("-created_at")


def endpoint_get(*, principal: Principal, endpoint_id: str) -> WebhookEndpoint:
    endpoint = endpoints_for_principal(principal).filter(pk=endpoint_id).first()
    if endpoint is None:
        raise NotFound(f"No webhook endpoint {endpoint_id}.")
    return endpoint


def endpoint_messages(endpoint: WebhookEndpoint, *, limit: int = 100) -> QuerySet[WebhookMessage]:
    return endpoint.messages.order_by("-created_at")[:limit]
