"""``/api/v1/signing-keys``: the keys that sign approvals (gateway.signing).

Everyone lists their own keys, admins those of their tenant. An admin registers a machine
approver's Ed25519 public key (``POST``); passkeys are registered in the console, where the
browser's authenticator is, and confirmed there or here (``/confirm``) by another approver
or an admin."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from gateway import signing
from gateway.api.auth import principal_of
from gateway.api.inputs import valid_body
from gateway.choices import Role
from gateway.errors import NotFound
from gateway.models import Principal, SigningKey


class SigningKeySerializer(serializers.ModelSerializer):
    principal = serializers.CharField(source="principal.name", read_only=True)
    confirmed_by = serializers.CharField(source="confirmed_by.name", default=None)

    class Meta:
        model = SigningKey
        fields = [
            "id",
            "principal",
            "kind",
            "name",
            "credential_id",
            "created_at",
            "confirmed_by",
            "confirmed_at",
            "revoked_at",
        ]
        read_only_fields = fields


class MachineKeySerializer(serializers.Serializer):
    principal = serializers.CharField(max_length=150, help_text="The approver's name.")
    public_key = serializers.CharField(
        max_length=4000, help_text="The Ed25519 public key: 32 bytes base64(url), or PEM."
    )
    name = serializers.CharField(max_length=100, required=False, allow_blank=True)


class KeyRevokeSerializer(serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, max_length=500)


def signed_decision(data: dict[str, Any] | None, request: Request) -> signing.SignedDecision | None:
    """The ``signature`` of an approve body as gateway.signing reads it. A passkey assertion
    sent through the API is checked against the configured origins (or this request's)."""
    if not data:
        return None
    host = request.get_host()
    return signing.SignedDecision(
        nonce=data["nonce"],
        key_id=data["key_id"],
        signature=data["signature"],
        authenticator_data=data.get("authenticator_data", ""),
        client_data_json=data.get("client_data_json", ""),
        user_handle=data.get("user_handle") or None,
        rp_id=settings.GATEWAY_WEBAUTHN_RP_ID or host.rsplit(":", 1)[0].strip("[]"),
        origin=f"{request.scheme}://{host}",
    )


class SigningKeyViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = SigningKeySerializer
    pagination_class = None
    lookup_value_regex = "[0-9]{1,18}"

    def get_queryset(self):
        principal = principal_of(self.request)
        query = SigningKey.objects.filter(principal__tenant_id=principal.tenant_id)
        if principal.role != Role.ADMIN:
            query = query.filter(principal=principal)
        return query.select_related("principal", "confirmed_by").order_by("-created_at")

    def get_object(self) -> SigningKey:
        principal = principal_of(self.request)
        key = (
            SigningKey.objects.select_related("principal")
            .filter(pk=int(self.kwargs["pk"]), principal__tenant_id=principal.tenant_id)
            .first()
        )
        if key is None:
            raise NotFound(f"No key {self.kwargs['pk']}.")
        return key

    @extend_schema(request=MachineKeySerializer, responses={201: SigningKeySerializer})
    def create(self, request: Request) -> Response:
        """An admin registers a machine approver's Ed25519 key (confirmed by that act)."""
        actor = principal_of(request)
        body = valid_body(MachineKeySerializer, request)
        owner = Principal.objects.filter(tenant_id=actor.tenant_id, name=body["principal"]).first()
        if owner is None:
            raise NotFound(f"No principal {body['principal']} in this tenant.")
        key = signing.machine_key_register(
            principal=owner, public_key=body["public_key"], actor=actor, name=body.get("name", "")
        )
        return Response(SigningKeySerializer(key).data, status=201)

    @extend_schema(request=None, responses=SigningKeySerializer)
    @action(detail=True, methods=["post"])
    def confirm(self, request: Request, pk=None) -> Response:
        key = signing.signing_key_confirm(key=self.get_object(), actor=principal_of(request))
        return Response(SigningKeySerializer(key).data)

    @extend_schema(request=KeyRevokeSerializer, responses=SigningKeySerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk=None) -> Response:
        body = valid_body(KeyRevokeSerializer, request)
        key = signing.signing_key_revoke(
            key=self.get_object(), actor=principal_of(request), reason=body.get("reason", "")
        )
        return Response(SigningKeySerializer(key).data)
