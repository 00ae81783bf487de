"""The sagas API (SPEC §5 "Sagas"). Views validate, call one service, and answer with the
output serializer; errors leave through gateway.api.problems as problem+json."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status as http
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gateway.api.auth import principal_of
from gateway.api.inputs import idempotency_key_from, idempotency_key_parameter, valid_body
from gateway.api.serializers import ReasonSerializer
from gateway.errors import ValidationProblem
from sagas import selectors, services
from sagas.api.serializers import (
    CancelResultSerializer,
    CancelSerializer,
    SagaEventSerializer,
    SagaSerializer,
    SagaStartSerializer,
    SagaSummarySerializer,
    SagaTaskSerializer,
    TaskDoneSerializer,
)
from sagas.choices import SagaState, TaskKind, TaskState
from sagas.definitions import DEFINITIONS
from sagas.models import SagaRun


class NewestFirst(CursorPagination):
    """Cursor pagination on the time-ordered primary key: constant cost at any depth."""

    ordering = "-id"
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500


class OldestFirst(CursorPagination):
    ordering = ("created_at", "id")
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500


def _saga_response(request: Request, run: SagaRun, code: int = 200, **headers: str) -> Response:
    principal = principal_of(request)
    fresh = selectors.saga_get(principal=principal, saga_id=run.pk)
    body = SagaSerializer(fresh, context={"principal": principal}).data
    return Response(body, status=code, headers=headers or None)


class SagaDefinitionsView(APIView):
    """GET /api/v1/saga-definitions — every definition, with its steps, schema and example."""

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request: Request) -> Response:
        return Response({"results": [d.as_data() for d in DEFINITIONS.values()]})


class SagaViewSet(viewsets.ReadOnlyModelViewSet):
    """Saga runs of the caller's tenant; started by POST, changed only through the actions."""

    serializer_class = SagaSerializer
    pagination_class = NewestFirst
    lookup_field = "pk"
    lookup_value_regex = "[^/]+"

    def get_serializer_class(self):
        return SagaSummarySerializer if self.action == "list" else SagaSerializer

    def get_serializer_context(self):
        return {**super().get_serializer_context(), "principal": principal_of(self.request)}

    def get_queryset(self):
        params = self.request.query_params
        states = [s for value in params.getlist("state") for s in value.split(",") if s]
        unknown = sorted(set(states) - set(SagaState.values))
        if unknown:
            raise ValidationProblem(
                "Unknown state filter.",
                errors={"state": [f"{', '.join(unknown)} is not one of {SagaState.values}"]},
            )
        definition = params.get("definition")
        if definition and definition not in DEFINITIONS:
            raise ValidationProblem(
                "Unknown definition filter.",
                errors={"definition": [f"{definition!r} is not one of {sorted(DEFINITIONS)}"]},
            )
        frozen = params.get("frozen")
        return selectors.sagas_filtered(
            principal=principal_of(self.request),
            states=states,
            definition=definition,
            frozen=None if frozen in (None, "") else frozen.lower() in {"1", "true", "yes"},
        )

    def get_object(self) -> SagaRun:
        return selectors.saga_get(principal=principal_of(self.request), saga_id=self.kwargs["pk"])

    @extend_schema(
        parameters=[
            OpenApiParameter("state", OpenApiTypes.STR, many=True),
            OpenApiParameter("definition", OpenApiTypes.STR),
            OpenApiParameter("frozen", OpenApiTypes.BOOL),
            OpenApiParameter("limit", OpenApiTypes.INT),
        ]
    )
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(
        request=SagaStartSerializer,
        responses={201: SagaSerializer, 200: SagaSerializer},
        parameters=[idempotency_key_parameter("run")],
    )
    def create(self, request: Request) -> Response:
        key = idempotency_key_from(request, what="saga", example="fulfil:ord_881:v1")
        body = valid_body(SagaStartSerializer, request)
        start = services.saga_start(
            principal=principal_of(request),
            idempotency_key=key,
            definition=body["definition"],
            inputs=body["inputs"],
        )
        if start.created:
            return _saga_response(request, start.run, http.HTTP_201_CREATED)
        return _saga_response(request, start.run, 200, **{"Idempotent-Replayed": "true"})

    @extend_schema(responses=SagaEventSerializer(many=True))
    @action(detail=True, methods=["get"])
    def events(self, request, pk=None):
        run = self.get_object()
        return Response(SagaEventSerializer(selectors.saga_events(run), many=True).data)

    @extend_schema(request=ReasonSerializer, responses=SagaSerializer)
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        run = self.get_object()
        body = valid_body(ReasonSerializer, request)
        services.saga_resume(
            run=run, principal=principal_of(request), reason=body.get("reason", "")
        )
        return _saga_response(request, run)

    @extend_schema(request=CancelSerializer, responses=CancelResultSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        run = self.get_object()
        body = valid_body(CancelSerializer, request)
        principal = principal_of(request)
        result = services.saga_cancel(
            run=run,
            principal=principal,
            compensate=body.get("compensate", False),
            reason=body.get("reason", ""),
        )
        fresh = selectors.saga_get(principal=principal, saga_id=run.pk)
        return Response(
            {
                "outcome": result.outcome,
                "compensating": result.compensating,
                "inventory": result.inventory,
                "saga": SagaSerializer(fresh, context={"principal": principal}).data,
            }
        )

    @extend_schema(request=ReasonSerializer, responses=SagaSerializer)
    @action(detail=True, methods=["post"])
    def freeze(self, request, pk=None):
        run = self.get_object()
        body = valid_body(ReasonSerializer, request)
        principal = principal_of(request)
        services.saga_freeze(
            saga_id=run.pk,
            actor=principal.label,
            principal=principal,
            reason=body.get("reason", "") or "frozen by an operator",
        )
        return _saga_response(request, run)

    @extend_schema(request=ReasonSerializer, responses=SagaSerializer)
    @action(detail=True, methods=["post"])
    def unfreeze(self, request, pk=None):
        run = self.get_object()
        body = valid_body(ReasonSerializer, request)
        services.saga_unfreeze(
            run=run, principal=principal_of(request), reason=body.get("reason", "")
        )
        return _saga_response(request, run)


class SagaTaskViewSet(viewsets.ReadOnlyModelViewSet):
    """The owners' queue: manual compensations and pages handed out by sagas."""

    serializer_class = SagaTaskSerializer
    pagination_class = OldestFirst
    lookup_field = "pk"
    lookup_value_regex = "[^/]+"

    def get_queryset(self):
        params = self.request.query_params
        state = params.get("state", TaskState.OPEN)
        if state not in (*TaskState.values, "all"):
            raise ValidationProblem(
                "Unknown state filter.",
                errors={"state": [f"{state!r} is not one of {[*TaskState.values, 'all']}"]},
            )
        kind = params.get("kind")
        if kind and kind not in TaskKind.values:
            raise ValidationProblem(
                "Unknown kind filter.",
                errors={"kind": [f"{kind!r} is not one of {TaskKind.values}"]},
            )
        return selectors.saga_tasks(
            principal=principal_of(self.request),
            states=None if state == "all" else [state],
            owner=params.get("owner"),
            kind=kind,
            saga_id=params.get("saga"),
        )

    def get_object(self):
        return selectors.saga_task_get(
            principal=principal_of(self.request), task_id=self.kwargs["pk"]
        )

    @extend_schema(
        parameters=[
            OpenApiParameter("state", OpenApiTypes.STR, description="open (default), done, all"),
            OpenApiParameter("owner", OpenApiTypes.STR),
            OpenApiParameter("kind", OpenApiTypes.STR),
            OpenApiParameter("saga", OpenApiTypes.STR),
            OpenApiParameter("limit", OpenApiTypes.INT),
        ]
    )
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(request=TaskDoneSerializer, responses=SagaTaskSerializer)
    @action(detail=True, methods=["post"])
    def done(self, request, pk=None):
        task = self.get_object()
        body = valid_body(TaskDoneSerializer, request)
        services.saga_task_close(
            task=task, principal=principal_of(request), note=body.get("note", "")
        )
        return Response(
            SagaTaskSerializer(
                selectors.saga_task_get(principal=principal_of(request), task_id=task.pk)
            ).data
        )
