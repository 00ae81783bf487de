"""RFC 9457 problem details: the one place API errors are shaped.

Domain errors (gateway.errors) and DRF's own exceptions all leave as
``application/problem+json`` with ``type``, ``title``, ``status`` and ``detail``; field errors
go in ``errors``. The mapping is glue, so it is written here rather than pulled in.

A database that cannot be reached (``OperationalError``, ``InterfaceError``) is a 503 with
``Retry-After``, here for the API views and in ``gateway.health.handler500`` for everything
else (middleware, the console).
"""

from __future__ import annotations

import logging
from typing import Any, cast

from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import Http404, JsonResponse
from rest_framework import exceptions
from rest_framework.response import Response

from gateway.errors import GatewayError

PROBLEM_BASE = "https://effect-gateway.dev/problems/"
PROBLEM_CONTENT_TYPE = "application/problem+json"
# Seconds a client waits before retrying while the database is unreachable: long enough for
# a failover or a restart to make progress, short enough for an agent's turn.
DATABASE_RETRY_AFTER = 5

logger = logging.getLogger(__name__)

_DRF_SLUGS: list[tuple[type[exceptions.APIException], str, str]] = [
    (exceptions.ParseError, "malformed-request", "The request body is not valid JSON"),
    (exceptions.UnsupportedMediaType, "unsupported-media-type", "Send application/json"),
    (exceptions.NotAuthenticated, "not-authenticated", "Authentication required"),
    (exceptions.AuthenticationFailed, "authentication-failed", "Authentication failed"),
    (exceptions.PermissionDenied, "not-permitted", "Not permitted"),
    (exceptions.NotFound, "not-found", "Not found"),
    (exceptions.MethodNotAllowed, "method-not-allowed", "Method not allowed"),
    (exceptions.Throttled, "rate-limited", "Too many requests"),
    (exceptions.ValidationError, "validation-error", "The request is not valid"),
]


def problem(*, status: int, slug: str, title: str, detail: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": PROBLEM_BASE + slug,
        "title": title,
        "status": status,
        "detail": detail,
        **extra,
    }


def database_unavailable(exc: BaseException | None) -> bool:
    """Whether ``exc`` says the database cannot be reached or used right now (refused, gone
    mid-request, a closed connection): Django's wrappers of the driver's errors."""
    return isinstance(exc, OperationalError | InterfaceError)


def database_unavailable_problem() -> dict[str, Any]:
    return problem(
        status=503,
        slug="database-unavailable",
        title="The database is unavailable",
        detail="The gateway cannot reach its database. Retry after Retry-After seconds; a "
        "submission retried with the same Idempotency-Key is recorded at most once.",
    )


def _flatten(errors: Any, prefix: str = "") -> dict[str, list[str]]:
    """DRF's nested error dict as {"field.sub": ["message", …]}."""
    flat: dict[str, list[str]] = {}
    if isinstance(errors, dict):
        for key, value in errors.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            flat.update(_flatten(value, name))
    elif isinstance(errors, list) and all(not isinstance(v, dict | list) for v in errors):
        flat[prefix or "non_field_errors"] = [str(v) for v in errors]
    elif isinstance(errors, list):
        for index, value in enumerate(errors):
            flat.update(_flatten(value, f"{prefix}.{index}" if prefix else str(index)))
    else:
        flat[prefix or "non_field_errors"] = [str(errors)]
    return flat


def problem_response(body: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    response = Response(body, status=body["status"], headers=headers)
    response.content_type = PROBLEM_CONTENT_TYPE
    return response


def problem_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if database_unavailable(exc):
        logger.warning("database unavailable: %s", exc)
        return problem_response(
            database_unavailable_problem(), {"Retry-After": str(DATABASE_RETRY_AFTER)}
        )
    if isinstance(exc, GatewayError):
        return problem_response(
            problem(
                status=exc.status, slug=exc.slug, title=exc.title, detail=exc.detail, **exc.extra
            )
        )
    if isinstance(exc, RequestDataTooBig):
        return problem_response(
            problem(
                status=400,
                slug="body-too-large",
                title="The request body is too large",
                detail=str(exc) or "The request body exceeds the gateway's limit.",
            )
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    if not isinstance(exc, exceptions.APIException):
        return None  # a bug: let Django log it and answer 500
    slug, title = "error", "Error"
    for cls, cls_slug, cls_title in _DRF_SLUGS:
        if isinstance(exc, cls):
            slug, title = cls_slug, cls_title
            break
    extra: dict[str, Any] = {}
    if isinstance(exc, exceptions.ValidationError):
        extra["errors"] = _flatten(exc.detail)
        detail = "The request is not valid: see errors."
    else:
        detail = str(exc.detail)
    headers = {}
    # DRF sets Throttled.wait in __init__; its stubs do not declare it.
    wait = cast(Any, exc).wait if isinstance(exc, exceptions.Throttled) else None
    if wait is not None:
        headers["Retry-After"] = str(int(wait) + 1)
    if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
        headers["WWW-Authenticate"] = "Bearer"
    return problem_response(
        problem(status=exc.status_code, slug=slug, title=title, detail=detail, **extra),
        headers,
    )


def json_problem_view(status: int, slug: str, title: str, detail: str) -> JsonResponse:
    return JsonResponse(
        problem(status=status, slug=slug, title=title, detail=detail),
        status=status,
        content_type=PROBLEM_CONTENT_TYPE,
    )
