"""The agents' and operators' HTTP API (SPEC §5). Views validate, call one service, and
answer with the output serializer; errors leave through gateway.api.problems."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from functools import partial

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status as http
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gateway import capabilities, fastpath, moves, selectors, services, signing
from gateway.agent_hooks import selectors as agent_hooks_selectors
from gateway.api.auth import principal_of
from gateway.api.inputs import idempotency_key_from, idempotency_key_parameter, valid_body
from gateway.api.serializers import (
    ApprovalChallengeRequestSerializer,
    ApprovalChallengeSerializer,
    ApproveSerializer,
    AttemptSerializer,
    CapabilityGrantSerializer,
    CapabilitySerializer,
    CommandSubmitSerializer,
    EffectEventSerializer,
    EffectSerializer,
    ReasonSerializer,
    ToolUseSerializer,
)
from gateway.api.signing_keys import signed_decision
from gateway.api.waits import wait_slot
from gateway.choices import ADMIN_ROLES, OPERATOR_ROLES, SETTLED, EffectStatus
from gateway.contracts import CONTRACTS
from gateway.errors import NotFound, NotPermitted, ValidationProblem
from gateway.models import ApiToken, Capability, Effect, Principal


class NewestFirst(CursorPagination):
    """Cursor pagination on the time-ordered primary key: constant cost at any depth."""

    ordering = "-command_id"
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500


class NewestFirstCapability(CursorPagination):
    ordering = "-created_at"
    page_size = 100


def _effect_response(request: Request, effect: Effect, code: int = 200, **headers) -> Response:
    if hasattr(effect, "_latest_receipt"):
        # Built from what the submission statement wrote or found (gateway.fastpath): the
        # row as committed, with its receipt; reading it again would only cost a round trip.
        body = EffectSerializer(effect, context={"principal": principal_of(request)}).data
        return Response(body, status=code, headers=headers or None)
    fresh = selectors.effect_get(principal=principal_of(request), effect_id=effect.pk)
    body = EffectSerializer(fresh, context={"principal": principal_of(request)}).data
    return Response(body, status=code, headers=headers or None)


class CommandSubmitView(APIView):
    """POST /api/v1/commands — freeze a command; replay-safe by Idempotency-Key."""

    @extend_schema(
        request=CommandSubmitSerializer,
        responses={201: EffectSerializer, 200: EffectSerializer},
        parameters=[idempotency_key_parameter("command")],
    )
    def post(self, request: Request) -> Response:
        key = idempotency_key_from(
            request, what="command", example="refund:ord_881:incident_120:v1"
        )
        if not isinstance(request.data, dict):
            raise ValidationProblem(
                "The body must be a JSON object.", errors={"body": ["must be an object"]}
            )
        serializer = CommandSubmitSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        submission = services.command_submit(
            principal=principal_of(request),
            idempotency_key=key,
            type=data["type"],
            resource=data["resource"],
            payload=data["payload"],
            intent=data.get("intent"),
            context=data.get("context"),
            expires_in=data.get("expires_in"),
            token=request.auth if isinstance(request.auth, ApiToken) else None,
        )
        if submission.created:
            return _effect_response(request, submission.effect, http.HTTP_201_CREATED)
        return _effect_response(
            request, submission.effect, http.HTTP_200_OK, **{"Idempotent-Replayed": "true"}
        )


class EffectViewSet(viewsets.ReadOnlyModelViewSet):
    """Effects of the caller's tenant; state changes only through the actions below."""

    serializer_class = EffectSerializer
    pagination_class = NewestFirst
    lookup_field = "pk"
    lookup_value_regex = "[^/]+"

    def get_queryset(self):
        params = self.request.query_params
        statuses = [s for s in params.getlist("status") for s in s.split(",") if s]
        unknown = sorted(set(statuses) - set(EffectStatus.values))
        if unknown:
            raise ValidationProblem(
                "Unknown status filter.",
                errors={"status": [f"{', '.join(unknown)} is not one of {EffectStatus.values}"]},
            )
        return selectors.effects_filtered(
            principal=principal_of(self.request),
            status=statuses,
            type=params.get("type"),
            owner=params.get("owner"),
            context={
                name: params[f"context.{name}"]
                for name in selectors.CONTEXT_FILTERS
                if params.get(f"context.{name}")
            },
        )

    def get_serializer_context(self):
        return {**super().get_serializer_context(), "principal": principal_of(self.request)}

    def get_object(self) -> Effect:
        return selectors.effect_get(
            principal=principal_of(self.request), effect_id=self.kwargs["pk"]
        )

    @extend_schema(
        parameters=[
            OpenApiParameter("status", OpenApiTypes.STR, many=True),
            OpenApiParameter("type", OpenApiTypes.STR),
            OpenApiParameter("owner", OpenApiTypes.STR),
            OpenApiParameter("limit", OpenApiTypes.INT),
        ]
    )
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "wait",
                OpenApiTypes.NUMBER,
                description="Long poll: answer when the status changes, or after this many "
                "seconds (at most GATEWAY_MAX_WAIT).",
            ),
            OpenApiParameter(
                "seen",
                OpenApiTypes.STR,
                enum=EffectStatus.values,
                description="With wait: the status the caller last saw. The long poll answers "
                "at once when the effect's status is already another, and otherwise when it "
                "leaves this one. Without it, the status when the request arrives, which may "
                "already be past the one the caller saw.",
            ),
            OpenApiParameter(
                "until",
                OpenApiTypes.STR,
                description="With wait: the statuses to wait for, comma-separated (settled: "
                "CONFIRMED, REJECTED, EXPIRED, CANCELLED, COMPENSATED, COMPENSATION_FAILED). The "
                "long poll answers at once when the effect is already in one, and otherwise "
                "when it reaches one, past any status in between; seen is then not needed.",
            ),
        ]
    )
    def retrieve(self, request, *args, **kwargs):
        # Listening before the read: a change committed after it is news to the wait.
        with moves.news_of(self.kwargs["pk"] if "wait" in request.query_params else None) as moved:
            effect = self.get_object()
            wait = _parse_wait(request.query_params.get("wait"))
            seen = _parse_seen(request.query_params.get("seen"))
            until = _parse_until(request.query_params.get("until"))
            if _must_wait(effect.status, wait, seen, until):
                with wait_slot(request):  # 429 when the caller or this node has too many open
                    look = partial(
                        fastpath.effect_status, principal=principal_of(request), effect_id=effect.pk
                    )
                    effect = _wait_for_change(
                        effect.status, wait, moved, read=self.get_object, look=look, until=until
                    )
        return Response(self.get_serializer(effect).data)

    @extend_schema(responses=EffectEventSerializer(many=True))
    @action(detail=True, methods=["get"])
    def events(self, request, pk=None):
        effect = self.get_object()
        events = selectors.effect_events(effect)
        return Response(EffectEventSerializer(events, many=True).data)

    @extend_schema(
        responses=ToolUseSerializer(many=True),
        description="The Claude Code tool calls that returned this effect (PostToolUse "
        "records): session, tool-use id, when, and the effect's status then.",
    )
    @action(detail=True, methods=["get"], url_path="tool-uses", pagination_class=None)
    def tool_uses(self, request, pk=None):
        effect = self.get_object()
        uses = agent_hooks_selectors.effect_tool_uses(effect)
        return Response(ToolUseSerializer(uses, many=True).data)

    @extend_schema(responses=AttemptSerializer(many=True))
    @action(detail=True, methods=["get"])
    def attempts(self, request, pk=None):
        """The effect's dispatch attempts, oldest first, each with the adapter and the
        credential fingerprint that sent it."""
        effect = self.get_object()
        return Response(AttemptSerializer(selectors.effect_attempts(effect), many=True).data)

    @extend_schema(
        request=ApproveSerializer,
        responses=EffectSerializer,
        description="Approve the digest you read. Where policy says so (financial and "
        "irreversible types by default), only with ``signature``: your registered key's "
        "signature over a challenge from ``approval-challenge``.",
    )
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        effect = self.get_object()
        body = valid_body(ApproveSerializer, request)
        services.effect_approve(
            effect=effect,
            principal=principal_of(request),
            payload_digest=body["payload_digest"],
            comment=body.get("comment", ""),
            signed=signed_decision(body.get("signature"), request),
        )
        return _effect_response(request, effect)

    @extend_schema(
        request=ApprovalChallengeRequestSerializer,
        responses=ApprovalChallengeSerializer,
        description="A one-use challenge for your key to sign: SHA-256 of the RFC 8785 JSON "
        "of tenant, effect id, payload digest, decision and nonce (docs/guides/passkeys.md).",
    )
    @action(detail=True, methods=["post"], url_path="approval-challenge")
    def approval_challenge(self, request, pk=None):
        effect = self.get_object()
        body = valid_body(ApprovalChallengeRequestSerializer, request)
        issued = signing.approval_challenge_issue(
            principal=principal_of(request), effect=effect, decision=body.get("decision", "approve")
        )
        return Response(issued.as_data())

    @extend_schema(request=ReasonSerializer, responses=EffectSerializer)
    @action(detail=True, methods=["post"])
    def reject(self, request, pk=None):
        effect = self.get_object()
        body = valid_body(ReasonSerializer, request)
        services.effect_reject(
            effect=effect, principal=principal_of(request), reason=body.get("reason", "")
        )
        return _effect_response(request, effect)

    @extend_schema(request=ReasonSerializer, responses=EffectSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        effect = self.get_object()
        body = valid_body(ReasonSerializer, request)
        services.effect_cancel(
            effect=effect, principal=principal_of(request), reason=body.get("reason", "")
        )
        return _effect_response(request, effect)

    @extend_schema(
        request=ReasonSerializer,
        responses={201: EffectSerializer, 200: EffectSerializer},
        description="Issue the contract's compensator as a new command (its own key and "
        "approval); answers with the compensating effect. Asking again replays it.",
    )
    @action(detail=True, methods=["post"])
    def compensate(self, request, pk=None):
        effect = self.get_object()
        body = valid_body(ReasonSerializer, request)
        reason = body.get("reason", "").strip()
        if not reason:
            raise ValidationProblem(
                "Say why the effect is compensated.", errors={"reason": ["required"]}
            )
        submission = services.effect_compensate(
            effect=effect, principal=principal_of(request), reason=reason
        )
        if submission.created:
            return _effect_response(request, submission.effect, http.HTTP_201_CREATED)
        return _effect_response(
            request, submission.effect, http.HTTP_200_OK, **{"Idempotent-Replayed": "true"}
        )

    @extend_schema(request=ReasonSerializer, responses=EffectSerializer)
    @action(detail=True, methods=["post"])
    def freeze(self, request, pk=None):
        effect = self.get_object()
        body = valid_body(ReasonSerializer, request)
        services.effect_set_frozen(
            effect=effect,
            principal=principal_of(request),
            frozen=True,
            reason=body.get("reason", ""),
        )
        return _effect_response(request, effect)

    @extend_schema(request=ReasonSerializer, responses=EffectSerializer)
    @action(detail=True, methods=["post"])
    def unfreeze(self, request, pk=None):
        effect = self.get_object()
        body = valid_body(ReasonSerializer, request)
        services.effect_set_frozen(
            effect=effect,
            principal=principal_of(request),
            frozen=False,
            reason=body.get("reason", ""),
        )
        return _effect_response(request, effect)


def _parse_wait(raw: str | None) -> float:
    if raw in (None, ""):
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise ValidationProblem(
            "wait must be a number of seconds.", errors={"wait": ["must be a number"]}
        ) from None
    if not math.isfinite(value) or value < 0:
        raise ValidationProblem(
            "wait must be a finite number of seconds, at least 0.", errors={"wait": [">= 0"]}
        )
    return min(value, settings.GATEWAY_MAX_WAIT)


def _parse_until(raw: str | None) -> frozenset[str] | None:
    """The ``until`` of a long poll: effect statuses, comma-separated, where ``settled`` names
    the settled ones (choices.SETTLED); None when not given."""
    if raw in (None, ""):
        return None
    statuses: set[str] = set()
    for name in (part.strip() for part in raw.split(",")):
        if name == "settled":
            statuses |= SETTLED
        elif name in EffectStatus.values:
            statuses.add(name)
        else:
            raise ValidationProblem(
                "until must name effect statuses (comma-separated), or settled.",
                errors={"until": [f"settled, or any of {', '.join(EffectStatus.values)}"]},
            )
    return frozenset(statuses)


def _parse_seen(raw: str | None) -> str | None:
    """The ``seen`` of a long poll: one of the effect statuses, or None when not given."""
    if raw in (None, ""):
        return None
    if raw not in EffectStatus.values:
        raise ValidationProblem(
            "seen must be one of the effect statuses.",
            errors={"seen": [f"one of {', '.join(EffectStatus.values)}"]},
        )
    return raw


# A long poll's pauses between looks at the status while nothing tells it of changes (the
# listener of gateway.moves not subscribed): the first short, because an effect the provider
# answers at once is CONFIRMED a few milliseconds after its submission (a first look after
# 50 ms made an agent's wait for such an effect ten times as long as the effect took); then
# doubling, so that a long wait costs about two looks a second.
FIRST_PAUSE = 0.005
LONGEST_PAUSE = 0.5


def _must_wait(
    status: str, wait: float, seen: str | None, until: frozenset[str] | None = None
) -> bool:
    """Whether a request for an effect in ``status`` long-polls: it asked to wait, and the
    effect is not yet in one of the statuses it waits for (``until``), or, without ``until``,
    still in the status the caller last saw (``seen``, when it names one).

    An effect that moved on between the caller's last look and this request answers at once,
    without a long-poll slot: an agent that read DISPATCHING and then asked to wait used to be
    held for the whole wait by an effect CONFIRMED in between (a few milliseconds, for a
    provider that answers at once), and one at its cap of open waits was answered 429."""
    if not wait:
        return False
    if until:
        return status not in until
    return seen is None or status == seen


def _wait_for_change(
    status: str,
    seconds: float,
    moved: threading.Event | None,
    *,
    read: Callable[[], Effect],
    look: Callable[[], str | None],
    until: frozenset[str] | None = None,
) -> Effect:
    """Until the effect's status differs from ``status``, the one it was read with (or, with
    ``until``, is one of those), or for ``seconds``; the effect as it is then.

    ``moved``: set by the news of a change (gateway.moves), registered before ``status`` was
    read. News makes it read the effect at once; without news it looks at the one status
    column after ``moves.FALLBACK_PAUSE``, or, while the news cannot arrive (the listener not
    subscribed), after growing pauses. ``read``: how the answer reads the effect (as the
    request read it: the caller's view of it); ``look``: how the wait reads its status alone.
    Both are the caller's, scoped to its tenant: there is no default by id, which would read
    another tenant's effect (tools and tests pass their own)."""
    moved = moved or threading.Event()
    deadline = time.monotonic() + seconds
    seen = status

    def done(status: str | None) -> bool:
        return status in until if until else status != seen

    pause = FIRST_PAUSE
    while (remaining := deadline - time.monotonic()) > 0:
        if moves.listener.subscribed:
            woken = moved.wait(min(moves.FALLBACK_PAUSE, remaining))
        else:
            woken = moved.wait(min(pause, remaining))
            pause = min(pause * 2, LONGEST_PAUSE)
        moved.clear()  # before the read: news of a later change wakes the next wait
        if woken:
            fresh = read()
            if done(fresh.status):
                return fresh
        elif time.monotonic() >= deadline:
            break  # the answer's read is the last look
        elif done(look()):
            break
    return read()


class EffectTypesView(APIView):
    """GET /api/v1/effect-types — every contract, with its schema and an example."""

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "permitted",
                OpenApiTypes.BOOL,
                description="true: only the types the caller may submit (an agent's live "
                "grants; operators and admins see every type: under a grant, or waiting for an "
                "approver). MCP "
                "servers list these as tools.",
            )
        ],
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request: Request) -> Response:
        contracts = list(CONTRACTS.values())
        if request.query_params.get("permitted", "").lower() in {"1", "true", "yes"}:
            allowed = capabilities.effect_types_permitted(principal_of(request))
            contracts = [c for c in contracts if allowed is None or c.type in allowed]
        return Response({"results": [contract.as_data() for contract in contracts]})


class CapabilityViewSet(viewsets.ReadOnlyModelViewSet):
    """Grants of the caller's tenant: admins grant, operators and admins read and revoke."""

    serializer_class = CapabilitySerializer
    pagination_class = NewestFirstCapability

    def get_queryset(self):
        principal = principal_of(self.request)
        if principal.role not in OPERATOR_ROLES:
            raise NotPermitted(f"A principal with role {principal.role} cannot list grants.")
        return Capability.objects.filter(tenant_id=principal.tenant_id).select_related("principal")

    def get_object(self) -> Capability:
        found = self.get_queryset().filter(pk=self.kwargs["pk"]).first()
        if found is None:
            raise NotFound(f"No capability {self.kwargs['pk']}.")
        return found

    @extend_schema(request=CapabilityGrantSerializer, responses={201: CapabilitySerializer})
    def create(self, request):
        principal = principal_of(request)
        if principal.role not in ADMIN_ROLES:
            raise NotPermitted("Only an admin grants capabilities.")
        body = valid_body(CapabilityGrantSerializer, request)
        target = Principal.objects.filter(
            tenant_id=principal.tenant_id, name=body["principal"]
        ).first()
        if target is None:
            raise NotFound(f"No principal {body['principal']}.")
        grant = capabilities.capability_grant(
            granted_by=principal.label,
            principal=target,
            effect_types=body["effect_types"],
            resource_selector=body["resource_selector"],
            budget_count=body.get("budget_count"),
            budget_amount=body.get("budget_amount"),
            budget_currency=body["budget_currency"],
            expires_in=body.get("expires_in"),
        )
        return Response(CapabilitySerializer(grant).data, status=http.HTTP_201_CREATED)

    @extend_schema(request=ReasonSerializer, responses=CapabilitySerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        grant = self.get_object()
        body = valid_body(ReasonSerializer, request)
        grant = capabilities.capability_revoke(
            capability=grant, principal=principal_of(request), reason=body.get("reason", "")
        )
        return Response(CapabilitySerializer(grant).data)


class EffectTypeFreezeView(APIView):
    """POST /api/v1/effect-types/{type}/freeze|unfreeze — stop or restart a whole type."""

    @extend_schema(request=ReasonSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request, effect_type: str, verb: str) -> Response:
        if effect_type not in CONTRACTS:
            raise NotFound(f"No effect type {effect_type}.")
        principal = principal_of(request)
        body = valid_body(ReasonSerializer, request)
        changed = capabilities.effect_type_set_frozen(
            tenant_id=principal.tenant_id,
            effect_type=effect_type,
            principal=principal,
            frozen=verb == "freeze",
            reason=body.get("reason", ""),
        )
        return Response({"type": effect_type, "frozen": verb == "freeze", "changed": changed})


class PrincipalFreezeView(APIView):
    """POST /api/v1/principals/{name}/freeze|unfreeze — stop everything a principal does."""

    @extend_schema(request=ReasonSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request, name: str, verb: str) -> Response:
        principal = principal_of(request)
        target = Principal.objects.filter(tenant_id=principal.tenant_id, name=name).first()
        if target is None:
            raise NotFound(f"No principal {name}.")
        body = valid_body(ReasonSerializer, request)
        capabilities.principal_set_frozen(
            target=target,
            principal=principal,
            frozen=verb == "freeze",
            reason=body.get("reason", ""),
        )
        return Response({"principal": name, "frozen": target.frozen})
