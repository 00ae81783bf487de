"""The reconciliation API (SPEC §5 reconcile / resolve, and the human queue). Views validate,
call one service and answer with the output serializer; errors leave as problem+json."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gateway import selectors as ledger_selectors
from gateway.api.auth import principal_of
from gateway.api.inputs import valid_body
from gateway.api.serializers import EffectSerializer
from gateway.errors import ValidationProblem
from reconciliation import selectors, services
from reconciliation.api.serializers import (
    AcknowledgeSerializer,
    CaseSerializer,
    ReconciliationRecordSerializer,
    ResolveSerializer,
)
from reconciliation.choices import CaseReason, CaseState


def _effect_response(request: Request, effect_id: str) -> Response:
    principal = principal_of(request)
    fresh = ledger_selectors.effect_get(principal=principal, effect_id=effect_id)
    return Response(EffectSerializer(fresh, context={"principal": principal}).data)


class EffectReconcileView(APIView):
    """POST /api/v1/effects/{id}/reconcile — ask the provider now (operator)."""

    @extend_schema(request=None, responses=EffectSerializer)
    def post(self, request: Request, effect_id: str) -> Response:
        principal = principal_of(request)
        effect = ledger_selectors.effect_get(principal=principal, effect_id=effect_id)
        services.effect_reconcile(effect_id=effect.pk, actor=principal.label, principal=principal)
        return _effect_response(request, effect.pk)


class EffectResolveView(APIView):
    """POST /api/v1/effects/{id}/resolve — an operator settles an uncertain effect."""

    @extend_schema(request=ResolveSerializer, responses=EffectSerializer)
    def post(self, request: Request, effect_id: str) -> Response:
        principal = principal_of(request)
        effect = ledger_selectors.effect_get(principal=principal, effect_id=effect_id)
        body = valid_body(ResolveSerializer, request)
        services.effect_resolve(
            effect=effect,
            principal=principal,
            outcome=body["outcome"],
            evidence=body["evidence"],
            operation_id=body.get("operation_id", ""),
            fields=body.get("result") or {},
        )
        return _effect_response(request, effect.pk)


class EffectReconciliationsView(APIView):
    """GET /api/v1/effects/{id}/reconciliations — every lookup and resolution, oldest first."""

    @extend_schema(responses=ReconciliationRecordSerializer(many=True))
    def get(self, request: Request, effect_id: str) -> Response:
        effect = ledger_selectors.effect_get(principal=principal_of(request), effect_id=effect_id)
        records = selectors.effect_records(effect)
        return Response(ReconciliationRecordSerializer(records, many=True).data)


class OldestFirst(CursorPagination):
    ordering = ("opened_at", "id")
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500


class CaseViewSet(viewsets.ReadOnlyModelViewSet):
    """The human queue of the caller's tenant; acknowledging is the one action."""

    serializer_class = CaseSerializer
    pagination_class = OldestFirst
    lookup_field = "pk"
    lookup_value_regex = "[^/]+"

    def get_queryset(self):
        params = self.request.query_params
        states = [s for raw in params.getlist("state") for s in raw.split(",") if s]
        unknown = sorted(set(states) - set(CaseState.values))
        if unknown:
            raise ValidationProblem(
                "Unknown state filter.",
                errors={"state": [f"{', '.join(unknown)} is not one of {CaseState.values}"]},
            )
        reason = params.get("reason")
        if reason and reason not in CaseReason.values:
            raise ValidationProblem(
                "Unknown reason filter.",
                errors={"reason": [f"{reason} is not one of {CaseReason.values}"]},
            )
        return selectors.cases_queue(
            principal=principal_of(self.request),
            states=states or None,
            owner=params.get("owner"),
            reason=reason,
        )

    def get_object(self):
        return selectors.case_get(principal=principal_of(self.request), case_id=self.kwargs["pk"])

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "state",
                OpenApiTypes.STR,
                many=True,
                description="open, acknowledged, resolved (default: open and acknowledged).",
            ),
            OpenApiParameter("owner", OpenApiTypes.STR),
            OpenApiParameter("reason", OpenApiTypes.STR),
            OpenApiParameter("limit", OpenApiTypes.INT),
        ]
    )
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(request=AcknowledgeSerializer, responses=CaseSerializer)
    @action(detail=True, methods=["post"])
    def acknowledge(self, request, pk=None):
        case = self.get_object()
        body = valid_body(AcknowledgeSerializer, request)
        services.case_acknowledge(
            case=case, principal=principal_of(request), note=body.get("note", "")
        )
        return Response(CaseSerializer(self.get_object()).data)
