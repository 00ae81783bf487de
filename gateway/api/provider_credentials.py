"""``/api/v1/providers/{name}/credentials``: a tenant's own credentials for one provider.

GET lists them (operators and admins); POST sets the first one, ``…/rotate`` replaces the
active one (each with an optional ``rate_limit`` of its own), ``…/{id}/retire`` stops one
(admins). Answers carry a credential's fingerprint
and last 4 characters, never the secret (gateway.provider_credentials)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gateway import provider_credentials as credentials
from gateway.api.auth import principal_of
from gateway.api.inputs import valid_body
from gateway.models import ProviderCredential


class ProviderCredentialSerializer(serializers.ModelSerializer):
    replaces = serializers.CharField(source="replaces.fingerprint", default=None)

    class Meta:
        model = ProviderCredential
        fields = [
            "id",
            "provider",
            "fingerprint",
            "last4",
            "state",
            "created_by",
            "created_at",
            "rotated_at",
            "retired_at",
            "retired_by",
            "replaces",
            "rate_limit",
        ]
        read_only_fields = fields


class SecretSerializer(serializers.Serializer):
    # Checked by the service (gateway.provider_credentials), whose messages never repeat it.
    secret = serializers.CharField(trim_whitespace=False, write_only=True)
    # The credential's own rate limit ("25/s"), shared by every worker; "" or absent: the
    # provider's configured one.
    rate_limit = serializers.CharField(required=False, allow_blank=True, max_length=32)


class RetireSerializer(serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, max_length=500)
    force = serializers.BooleanField(required=False, default=False)


CredentialList = inline_serializer(
    "ProviderCredentialList",
    {
        "provider": serializers.CharField(),
        "sends_with": serializers.ChoiceField(choices=["tenant", "deployment"]),
        "deployment_fingerprint": serializers.CharField(),
        "results": ProviderCredentialSerializer(many=True),
    },
)


def _shown(row: ProviderCredential) -> dict:
    return dict(ProviderCredentialSerializer(row).data)


class ProviderCredentialsView(APIView):
    """GET the tenant's credentials for a provider; POST ``{"secret": …}`` sets the first."""

    @extend_schema(responses=CredentialList)
    def get(self, request: Request, name: str) -> Response:
        rows = list(
            credentials.credentials_visible_to(principal_of(request), name).select_related(
                "replaces"
            )
        )
        active = any(row.state == "active" for row in rows)
        return Response(
            {
                "provider": name,
                "sends_with": "tenant" if active else "deployment",
                "deployment_fingerprint": credentials.deployment_fingerprint(name),
                "results": [_shown(row) for row in rows],
            }
        )

    @extend_schema(request=SecretSerializer, responses={201: ProviderCredentialSerializer})
    def post(self, request: Request, name: str) -> Response:
        body = valid_body(SecretSerializer, request)
        row = credentials.credential_set(
            actor=principal_of(request),
            provider=name,
            secret=body["secret"],
            rate_limit=body.get("rate_limit", ""),
        )
        return Response(_shown(row), status=201)


class ProviderCredentialRotateView(APIView):
    """POST ``{"secret": …}``: a new active credential in place of the active one."""

    @extend_schema(request=SecretSerializer, responses={201: ProviderCredentialSerializer})
    def post(self, request: Request, name: str) -> Response:
        body = valid_body(SecretSerializer, request)
        row = credentials.credential_rotate(
            actor=principal_of(request),
            provider=name,
            secret=body["secret"],
            rate_limit=body.get("rate_limit", ""),
        )
        return Response(_shown(row), status=201)


class ProviderCredentialRetireView(APIView):
    """POST ``{"reason": …, "force": false}``: the credential serves nothing any more."""

    @extend_schema(request=RetireSerializer, responses=ProviderCredentialSerializer)
    def post(self, request: Request, name: str, credential_id: int) -> Response:
        body = valid_body(RetireSerializer, request)
        row = credentials.credential_retire(
            actor=principal_of(request),
            provider=name,
            credential_id=credential_id,
            reason=body.get("reason", ""),
            force=body.get("force", False),
        )
        return Response(_shown(row))
