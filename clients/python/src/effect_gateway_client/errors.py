"""The gateway's RFC 9457 problems as Python exceptions.

Each problem answer becomes one typed exception, chosen by the problem ``type`` slug first
and the HTTP status second, so an agent author writes ``except IdempotencyKeyMismatch`` rather
than comparing status codes. Every exception keeps the whole problem document in ``problem``.
"""

from __future__ import annotations

from typing import Any


class GatewayError(Exception):
    """Any answer of the gateway that is not a success."""

    status: int | None = None

    def __init__(
        self,
        detail: str,
        *,
        status: int | None = None,
        problem: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        if status is not None:
            self.status = status
        self.problem: dict[str, Any] = problem or {}

    @property
    def type(self) -> str:
        return str(self.problem.get("type", ""))

    @property
    def title(self) -> str:
        return str(self.problem.get("title", ""))


class ValidationFailed(GatewayError):
    """400: the command is not valid; ``errors`` maps each field to what is wrong with it."""

    status = 400

    @property
    def errors(self) -> dict[str, list[str]]:
        return dict(self.problem.get("errors") or {})

    def __str__(self) -> str:
        fields = "; ".join(f"{name}: {', '.join(msgs)}" for name, msgs in self.errors.items())
        return f"{self.detail} ({fields})" if fields else self.detail


class AuthenticationFailed(GatewayError):
    """401: the token is missing, wrong or revoked. Not retried: a new token is needed."""

    status = 401


class NotPermitted(GatewayError):
    """403: this principal may not do this (role, frozen principal, requester approving)."""

    status = 403


class NotFound(GatewayError):
    """404: no such effect for this tenant (another tenant's effects do not exist for you)."""

    status = 404


class Conflict(GatewayError):
    """409: the effect is not in a state that allows this, or a digest is not the command's."""

    status = 409


class IdempotencyKeyMismatch(GatewayError):
    """422: the key already names another command (a different payload digest)."""

    status = 422

    def __str__(self) -> str:
        # The gateway's detail names the command and both digests, then the fix; say the fix
        # once, in the client's words.
        facts = self.detail.split(" Send the identical")[0].rstrip()
        return (
            f"{facts} The key names one command forever: send the identical payload to "
            "replay it, or use a new key for a new command."
        )

    @property
    def effect_id(self) -> str | None:
        return self.problem.get("effect_id")


class RateLimited(GatewayError):
    """429 after the client's own retries: slow down; ``retry_after`` says for how long."""

    status = 429

    def __init__(self, detail: str, *, retry_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(detail, **kwargs)
        self.retry_after = retry_after


class GatewayUnavailable(GatewayError):
    """The gateway could not be reached or kept failing (connect errors, 5xx) after retries.

    For a submission this does not say whether the command was recorded: submit again with
    the same key later, which is safe because the key makes the submission idempotent.
    """


_BY_SLUG: dict[str, type[GatewayError]] = {
    "validation-error": ValidationFailed,
    "malformed-request": ValidationFailed,
    "body-too-large": ValidationFailed,
    "unsupported-media-type": ValidationFailed,
    "not-authenticated": AuthenticationFailed,
    "authentication-failed": AuthenticationFailed,
    "not-permitted": NotPermitted,
    "not-found": NotFound,
    "invalid-transition": Conflict,
    "digest-mismatch": Conflict,
    "idempotency-key-mismatch": IdempotencyKeyMismatch,
    "rate-limited": RateLimited,
}

_BY_STATUS: dict[int, type[GatewayError]] = {
    400: ValidationFailed,
    401: AuthenticationFailed,
    403: NotPermitted,
    404: NotFound,
    409: Conflict,
    422: IdempotencyKeyMismatch,
    429: RateLimited,
}


def error_for(
    status: int, problem: dict[str, Any], retry_after: float | None = None
) -> GatewayError:
    """The exception for one problem answer."""
    slug = str(problem.get("type", "")).rsplit("/", 1)[-1]
    cls = _BY_SLUG.get(slug) or _BY_STATUS.get(status)
    if cls is None:
        cls = GatewayUnavailable if status >= 500 else GatewayError
    detail = str(problem.get("detail") or problem.get("title") or f"HTTP {status}")
    if cls is RateLimited:
        return RateLimited(detail, retry_after=retry_after, status=status, problem=problem)
    return cls(detail, status=status, problem=problem)
