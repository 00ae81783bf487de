"""GET /api/v1/tokens, POST /api/v1/tokens/{id}/revoke and /rotate: a token's lifecycle.

Everyone sees and manages their own tokens; admins those of their tenant. The clear value of
a rotated token is in the rotate answer only, once."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response

from gateway import tokens
from gateway.api.auth import principal_of
from gateway.api.inputs import valid_body
from gateway.errors import NotFound
from gateway.models import ApiToken


class TokenSerializer(serializers.ModelSerializer):
    principal = serializers.CharField(source="principal.name", read_only=True)
    rotated_from = serializers.CharField(source="rotated_from.prefix", default=None)

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "prefix",
            "principal",
            "created_at",
            "last_used_at",
            "expires_at",
            "revoked_at",
            "rotated_from",
        ]
        read_only_fields = fields


class NewTokenSerializer(TokenSerializer):
    token = serializers.CharField(read_only=True, help_text="The clear token, shown only once.")

    class Meta(TokenSerializer.Meta):
        fields = [*TokenSerializer.Meta.fields, "token"]
        read_only_fields = fields


class RevokeSerializer(serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, max_length=500)


class RotateSerializer(serializers.Serializer):
    expires_in = serializers.IntegerField(
        required=False, min_value=1, max_value=tokens.MAX_EXPIRES_IN
    )


class NewestTokensFirst(CursorPagination):
    ordering = "-created_at"
    page_size = 100


class TokenViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = TokenSerializer
    pagination_class = NewestTokensFirst
    lookup_value_regex = "[0-9]{1,18}"

    def get_queryset(self):
        return tokens.tokens_visible_to(principal_of(self.request)).select_related("rotated_from")

    def get_object(self) -> ApiToken:
        token = self.get_queryset().filter(pk=int(self.kwargs["pk"])).first()
        if token is None:
            raise NotFound(f"No token {self.kwargs['pk']}.")
        return token

    @extend_schema(request=RevokeSerializer, responses=TokenSerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk=None) -> Response:
        body = valid_body(RevokeSerializer, request)
        token = tokens.token_revoke(
            token=self.get_object(), actor=principal_of(request), reason=body.get("reason", "")
        )
        return Response(TokenSerializer(token).data)

    @extend_schema(request=RotateSerializer, responses={201: NewTokenSerializer})
    @action(detail=True, methods=["post"])
    def rotate(self, request: Request, pk=None) -> Response:
        body = valid_body(RotateSerializer, request)
        token, clear = tokens.token_rotate(
            token=self.get_object(), actor=principal_of(request), expires_in=body.get("expires_in")
        )
        data = TokenSerializer(token).data
        return Response({**data, "token": clear}, status=201)
