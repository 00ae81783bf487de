"""Domain errors: raised by services, mapped once to problem+json (API) and once to a message
(console). Each carries the HTTP status and the problem type slug it maps to."""

from __future__ import annotations

from typing import Any


class GatewayError(Exception):
    status = 400
    slug = "bad-request"
    title = "Bad request"

    def __init__(self, detail: str, *, extra: dict[str, Any] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra or {}


class ValidationProblem(GatewayError):
    """The request is malformed; ``errors`` says which fields and why."""

    slug = "validation-error"
    title = "The request is not valid"

    def __init__(self, detail: str, *, errors: dict[str, list[str]]) -> None:
        super().__init__(detail, extra={"errors": errors})
        self.errors = errors


class IdempotencyKeyMismatch(GatewayError):
    status = 422
    slug = "idempotency-key-mismatch"
    title = "Idempotency key already used for another command"


class NotPermitted(GatewayError):
    status = 403
    slug = "not-permitted"
    title = "Not permitted"


class NotFound(GatewayError):
    status = 404
    slug = "not-found"
    title = "Not found"


class InvalidTransition(GatewayError):
    status = 409
    slug = "invalid-transition"
    title = "The effect is not in a state that allows this"


class CompensationNotBuildable(GatewayError):
    """The compensating command lacks a field the receipt did not give (``missing``)."""

    status = 409
    slug = "compensation-not-buildable"
    title = "The compensating command cannot be built"

    def __init__(self, detail: str, *, missing: list[str]) -> None:
        super().__init__(detail, extra={"missing": missing})
        self.missing = missing


class TokenRevoked(GatewayError):
    status = 409
    slug = "token-revoked"
    title = "The token is revoked"


class CredentialConflict(GatewayError):
    """A provider credential cannot change so now (one is active, none is, it is retired, or
    effects it sent are not settled)."""

    status = 409
    slug = "credential-conflict"
    title = "The provider credential cannot change so now"


class DigestMismatch(GatewayError):
    status = 409
    slug = "digest-mismatch"
    title = "The digest is not the command's digest"
