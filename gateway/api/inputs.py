"""Reading what a request sends, shared by every API module: a small input serializer's
validated body, and the Idempotency-Key header."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework.request import Request

from gateway.errors import ValidationProblem


def valid_body(serializer_class, request: Request) -> dict:
    """The body validated by ``serializer_class`` (an empty body is ``{}``), or a 400."""
    if request.data and not isinstance(request.data, dict):
        raise ValidationProblem(
            "The body must be a JSON object.", errors={"body": ["must be an object"]}
        )
    serializer = serializer_class(data=request.data if request.data else {})
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def idempotency_key_parameter(what: str) -> OpenApiParameter:
    return OpenApiParameter(
        "Idempotency-Key",
        OpenApiTypes.STR,
        OpenApiParameter.HEADER,
        required=True,
        description=f"A stable business key: the same key always means the same {what}.",
    )


def idempotency_key_from(request: Request, *, what: str, example: str) -> str:
    """The Idempotency-Key header, or a 400 that says how to make a good one."""
    key = request.headers.get("Idempotency-Key")
    if not key:
        raise ValidationProblem(
            f"The Idempotency-Key header is required: a stable business key for this {what} "
            f"(e.g. {example}), never a random id per attempt.",
            errors={"Idempotency-Key": ["required"]},
        )
    if "," in key:
        # Proxies and WSGI servers join repeated headers with commas: two keys for one request
        # would make the replay protection guess which one was meant.
        raise ValidationProblem(
            "Send exactly one Idempotency-Key header (a key must not contain commas).",
            errors={"Idempotency-Key": ["exactly one key, without commas"]},
        )
    return key
