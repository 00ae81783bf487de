"""The API's fast lane: an agent's two hot requests, served without the browser's stack.

An agent submits a command (``POST /api/v1/commands``) and reads or long-polls its effect
(``GET /api/v1/effects/{id}``) with a bearer token; that is most of the API's traffic. Through
the whole stack each request paid for what only the console uses (sessions, CSRF, logins'
lockout, messages, htmx, static files) and for DRF's request machinery (a Request wrapper,
content negotiation, a serializer's field copies), about a third of the web tier's CPU per
submission (docs/internals/hot-path.md).

:class:`ApiLaneMiddleware`, right after the input guard, serves those requests with the parts
that define them and nothing else: ``BearerTokenAuthentication`` (with the token cache of
gateway.trust), the configured throttles, ``StrictJSONParser`` and its size limit, the same
validation, services and selectors, the effect's JSON and problem+json of gateway.api.problems
rendered by DRF's ``JSONRenderer``, the headers DRF adds (``Allow``) and those of the
middlewares it skips (``X-Frame-Options``, ``Content-Security-Policy``, ``Content-Length``,
the ``ALLOWED_HOSTS`` check); SecurityMiddleware and the input guard still run around it.

Whatever DRF would treat differently goes down the stack to the DRF views, unchanged: no
bearer token (a console session), another method, an ``Accept`` or ``Content-Type`` that DRF
would negotiate, a query string (``?format=``). Those views stay the reference and what the
OpenAPI schema describes: ``tests/gateway/test_api_lane.py`` sends every case through both
and compares status, headers and bytes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

from django.http import HttpRequest, HttpResponse
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.csp import ContentSecurityPolicyMiddleware
from django.urls import reverse
from rest_framework import exceptions
from rest_framework.renderers import JSONRenderer
from rest_framework.views import APIView

from gateway import fastpath, moves, selectors, services
from gateway.api.auth import BearerTokenAuthentication, PrincipalUser
from gateway.api.inputs import idempotency_key_from
from gateway.api.parsers import UTF8_NAMES, StrictJSONParser, charset_of
from gateway.api.problems import problem_exception_handler
from gateway.api.serializers import CommandSubmitSerializer, EffectSerializer
from gateway.api.views import (
    _must_wait,
    _parse_seen,
    _parse_until,
    _parse_wait,
    _wait_for_change,
)
from gateway.api.waits import wait_slot
from gateway.contracts import CONTRACTS
from gateway.errors import NotFound, ValidationProblem
from gateway.models import ApiToken, Effect, Principal

# What DRF's views answer in ``Allow`` (APIView.default_response_headers).
_SUBMIT_ALLOW = "POST, OPTIONS"
_EFFECT_ALLOW = "GET, HEAD, OPTIONS"
# DRF's negotiation picks the one renderer for these; anything else (a list, parameters such
# as ``indent=4``, another type) is left to it.
_PLAIN_ACCEPT = frozenset({"", "*/*", "application/json"})
_OPTIONAL_FIELDS = ("intent", "context", "expires_in")

_renderer = JSONRenderer()
_parser = StrictJSONParser()


@dataclass(frozen=True)
class Caller:
    """What DRF's throttles and the long-poll slots read from a request."""

    user: PrincipalUser
    auth: ApiToken
    META: dict[str, Any]

    @property
    def principal(self) -> Principal:
        return self.user.principal


class _Routes:
    """The lane's two paths, from the URLconf (so the lane moves with it)."""

    def __init__(self) -> None:
        self.submit = reverse("command-submit")
        marker = "EFFECT"
        detail = reverse("effect-detail", kwargs={"pk": marker})
        self.effect = re.compile(re.escape(detail).replace(marker, "(?P<pk>[^/]+)") + r"\Z")


_routes: _Routes | None = None


def _json_response(data: Any, status: int, allow: str, headers=None, content_type=None):
    content = _renderer.render(data)
    response = HttpResponse(content, status=status, content_type=content_type or "application/json")
    response.headers["Allow"] = allow
    for name, value in (headers or {}).items():
        response.headers[name] = value
    response.headers["Content-Length"] = str(len(content))
    return response


def _problem(exc: Exception, allow: str) -> HttpResponse:
    """The problem+json DRF's exception handler gives for ``exc``; anything it does not map
    (a bug) is raised, for Django's 500 handler, as it is under DRF."""
    answer = problem_exception_handler(exc, {})
    if answer is None:
        raise exc
    headers = {k: v for k, v in answer.headers.items() if k.lower() != "content-type"}
    return _json_response(answer.data, answer.status_code, allow, headers, answer.content_type)


def _plain_json_request(request: HttpRequest) -> bool:
    if request.META.get("QUERY_STRING"):
        return False
    return request.META.get("HTTP_ACCEPT", "").strip() in _PLAIN_ACCEPT


def _caller(request: HttpRequest) -> Caller:
    """Authenticate and throttle as DRF's APIView.initial does, in its order."""
    authenticated = BearerTokenAuthentication().authenticate(request)
    assert authenticated is not None  # the route only takes requests with a bearer token
    user, token = authenticated
    caller = Caller(user=user, auth=token, META=request.META)
    waits = []
    for throttle in (cls() for cls in APIView.throttle_classes):  # DRF's own list
        if not throttle.allow_request(cast(Any, caller), cast(Any, None)):
            waits.append(throttle.wait())
    if waits:
        raise exceptions.Throttled(max((w for w in waits if w is not None), default=None))
    return caller


def _effect_body(principal: Principal, effect: Effect) -> dict[str, Any]:
    """A submission's effect: the general path answers with a model it did not read back
    whole (the fast path's carries its receipt, ``_latest_receipt``)."""
    if not hasattr(effect, "_latest_receipt"):
        effect = selectors.effect_get(principal=principal, effect_id=effect.pk)
    return _represented(principal, effect)


def _represented(principal: Principal, effect: Effect) -> dict[str, Any]:
    return EffectSerializer(context={"principal": principal}).to_representation(effect)


# --- POST /api/v1/commands ---------------------------------------------------------------------


def _body(request: HttpRequest) -> Any:
    """The body as DRF's Request.data reads it with the one parser: empty is ``{}``."""
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length == 0:
        return {}
    return _parser.parse(request, request.META.get("CONTENT_TYPE", ""))


def _submission(data: dict[str, Any]) -> dict[str, Any]:
    """What CommandSubmitSerializer validates. A known type and present fields need none of
    its work (every value the strict parser returns is valid to a JSONField); anything else
    goes through it, for its coercions and its exact messages."""
    kind = data.get("type")
    if (
        isinstance(kind, str)
        and kind in CONTRACTS
        and data.get("resource") is not None
        and data.get("payload") is not None
        and all(data[name] is not None for name in _OPTIONAL_FIELDS if name in data)
    ):
        return data
    serializer = CommandSubmitSerializer(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def submit(request: HttpRequest) -> HttpResponse:
    """``CommandSubmitView.post``, in the lane."""
    try:
        caller = _caller(request)
        key = idempotency_key_from(
            cast(Any, request), what="command", example="refund:ord_881:incident_120:v1"
        )
        data = _body(request)
        if not isinstance(data, dict):
            raise ValidationProblem(
                "The body must be a JSON object.", errors={"body": ["must be an object"]}
            )
        fields = _submission(data)
        submission = services.command_submit(
            principal=caller.principal,
            idempotency_key=key,
            type=fields["type"],
            resource=fields["resource"],
            payload=fields["payload"],
            intent=fields.get("intent"),
            context=fields.get("context"),
            expires_in=fields.get("expires_in"),
            token=caller.auth,
        )
        body = _effect_body(caller.principal, submission.effect)
    except Exception as exc:
        return _problem(exc, _SUBMIT_ALLOW)
    if submission.created:
        return _json_response(body, 201, _SUBMIT_ALLOW)
    return _json_response(body, 200, _SUBMIT_ALLOW, {"Idempotent-Replayed": "true"})


# --- GET /api/v1/effects/{id} ------------------------------------------------------------------


def effect(request: HttpRequest, pk: str) -> HttpResponse:
    """``EffectViewSet.retrieve``, in the lane (with its ``?wait=`` long poll)."""
    try:
        caller = _caller(request)
        read = partial(_effect_read, caller.principal, pk)
        # The route lets only the long poll's keys through: a query is a long poll's.
        found = _long_poll(request, caller, pk, read) if request.GET else read()
        body = _represented(caller.principal, found)  # read whole, with its receipt
    except Exception as exc:
        return _problem(exc, _EFFECT_ALLOW)
    return _json_response(body, 200, _EFFECT_ALLOW)


def _long_poll(request: HttpRequest, caller: Caller, pk: str, read: Callable[[], Effect]) -> Effect:
    """The effect once it has moved on (``?wait=``, ``seen``, ``until``), or when the wait ends.

    Most long polls wait: the effect is read whole only for the answer, and the look before
    the wait reads its status alone (half of such a request's reading, building the models of
    a row that the wait made stale)."""
    # Listening before the look: a change committed after it is news to the wait. A query
    # without ``wait`` (``seen``/``until`` alone) only answers: no listener for it.
    with moves.news_of(pk if "wait" in request.GET else None) as moved:
        status = fastpath.effect_status(principal=caller.principal, effect_id=pk)
        if status is None:
            raise NotFound(f"No effect {pk}.")  # another tenant's does not exist either
        wait = _parse_wait(request.GET.get("wait"))
        seen = _parse_seen(request.GET.get("seen"))
        until = _parse_until(request.GET.get("until"))
        if not _must_wait(status, wait, seen, until):
            return read()
        with wait_slot(cast(Any, caller)):  # 429 when the caller or this node has too many open
            look = partial(fastpath.effect_status, principal=caller.principal, effect_id=pk)
            return _wait_for_change(status, wait, moved, read=read, look=look, until=until)


def _effect_read(principal: Principal, effect_id: str) -> Effect:
    """``selectors.effect_get``, prepared (gateway.fastpath.effect_read)."""
    effect = fastpath.effect_read(principal=principal, effect_id=effect_id)
    if effect is None:
        raise NotFound(f"No effect {effect_id}.")  # another tenant's does not exist either
    return effect


def _route(request: HttpRequest) -> Callable[[], HttpResponse] | None:
    """The lane's view for ``request`` (bound to its arguments), or None for the stack."""
    global _routes
    if request.META.get("HTTP_AUTHORIZATION", "")[:7].lower() != "bearer ":
        return None
    if _routes is None:
        _routes = _Routes()
    path, method = request.path_info, request.method
    if method == "POST" and path == _routes.submit:
        content_type, _, params = request.META.get("CONTENT_TYPE", "").partition(";")
        if content_type.strip().lower() != "application/json" or not _plain_json_request(request):
            return None
        if params and charset_of(request.META["CONTENT_TYPE"]) not in UTF8_NAMES:
            return None
        return lambda: submit(request)
    match = _routes.effect.match(path) if method == "GET" else None
    if match is not None:
        query = request.META.get("QUERY_STRING", "")
        if query and not set(request.GET) <= {"wait", "seen", "until"}:
            return None
        if request.META.get("HTTP_ACCEPT", "").strip() not in _PLAIN_ACCEPT:
            return None
        return lambda: effect(request, match["pk"])
    return None


class ApiLaneMiddleware:
    """Serve the lane's requests (module doc); pass everything else down the stack."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        # Only their response halves run here: the same headers, by Django's own code.
        self.frame_options = XFrameOptionsMiddleware(get_response)
        self.csp = ContentSecurityPolicyMiddleware(get_response)

    def __call__(self, request: HttpRequest) -> HttpResponse:
        view = _route(request)
        if view is None:
            return self.get_response(request)
        request.get_host()  # ALLOWED_HOSTS: CommonMiddleware's check, skipped with it
        response = view()
        response = self.frame_options.process_response(request, response)
        return self.csp.process_response(request, response)
