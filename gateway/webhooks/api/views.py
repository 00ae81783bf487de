"""``/api/v1/webhook-endpoints``: operators and admins register where their tenant's effect
events are sent; an agent registers, lists and deletes its own. Errors leave as problem+json
through the project's exception handler."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status as http
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from gateway.api.auth import principal_of
from gateway.api.inputs import valid_body
from gateway.errors import NotPermitted
from gateway.webhooks import selectors, services
from gateway.webhooks.api.serializers import (
    EndpointCreatedSerializer,
    EndpointCreateSerializer,
    EndpointReasonSerializer,
    EndpointSerializer,
    MessageSerializer,
)


def _operator(request: Request):
    """The caller, if it may manage endpoints: an operator or admin (the tenant's), an agent
    (its own: the selectors show it no other)."""
    principal = principal_of(request)
    if principal.role not in services.MANAGER_ROLES:
        raise NotPermitted(f"A principal with role {principal.role} cannot manage webhooks.")
    return principal


class WebhookEndpointViewSet(viewsets.ViewSet):
    """A tenant's webhook endpoints (operator, admin), or an agent's own (agent)."""

    lookup_value_regex = "[^/]+"

    @extend_schema(responses=EndpointSerializer(many=True))
    def list(self, request: Request) -> Response:
        endpoints = selectors.endpoints_for_principal(_operator(request))
        return Response({"results": EndpointSerializer(endpoints, many=True).data})

    @extend_schema(request=EndpointCreateSerializer, responses={201: EndpointCreatedSerializer})
    def create(self, request: Request) -> Response:
        principal = _operator(request)
        body = valid_body(EndpointCreateSerializer, request)
        endpoint, secret = services.endpoint_create(
            principal=principal,
            url=body["url"],
            event_types=body.get("event_types"),
            description=body.get("description", ""),
            principals=body.get("principals"),
            run_ids=body.get("run_ids"),
        )
        # The plaintext secret is no model field (only its sealed form is stored): it is added
        # to the answer here, once, in EndpointCreatedSerializer's shape.
        created = {**EndpointSerializer(endpoint).data, "secret": secret}
        return Response(created, status=http.HTTP_201_CREATED)

    @extend_schema(responses=EndpointSerializer)
    def retrieve(self, request: Request, pk: str) -> Response:
        endpoint = selectors.endpoint_get(principal=_operator(request), endpoint_id=pk)
        return Response(EndpointSerializer(endpoint).data)

    @extend_schema(responses={204: None})
    def destroy(self, request: Request, pk: str) -> Response:
        principal = _operator(request)
        endpoint = selectors.endpoint_get(principal=principal, endpoint_id=pk)
        services.endpoint_delete(endpoint=endpoint, principal=principal)
        return Response(status=http.HTTP_204_NO_CONTENT)

    @extend_schema(request=EndpointReasonSerializer, responses=EndpointSerializer)
    @action(detail=True, methods=["post"])
    def enable(self, request: Request, pk: str) -> Response:
        return self._set_enabled(request, pk, enabled=True)

    @extend_schema(request=EndpointReasonSerializer, responses=EndpointSerializer)
    @action(detail=True, methods=["post"])
    def disable(self, request: Request, pk: str) -> Response:
        return self._set_enabled(request, pk, enabled=False)

    @extend_schema(responses=MessageSerializer(many=True))
    @action(detail=True, methods=["get"])
    def messages(self, request: Request, pk: str) -> Response:
        endpoint = selectors.endpoint_get(principal=_operator(request), endpoint_id=pk)
        messages = selectors.endpoint_messages(endpoint)
        return Response({"results": MessageSerializer(messages, many=True).data})

    def _set_enabled(self, request: Request, pk: str, *, enabled: bool) -> Response:
        principal = _operator(request)
        endpoint = selectors.endpoint_get(principal=principal, endpoint_id=pk)
        body = valid_body(EndpointReasonSerializer, request)
        endpoint = services.endpoint_set_enabled(
            endpoint=endpoint, principal=principal, enabled=enabled, reason=body.get("reason", "")
        )
        return Response(EndpointSerializer(endpoint).data)
