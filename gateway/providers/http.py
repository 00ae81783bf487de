"""The HTTP adapter for the provider protocol of SPEC §6, and the classification of its answers.

The rule that matters: once a byte of the request may have left, a missing answer is UNKNOWN,
never NOT_STARTED. Only a failure to connect proves the provider did not receive the command.
"""

from __future__ import annotations

from typing import Any

import httpx

from gateway.choices import Outcome
from gateway.providers.base import (
    CallResult,
    ExecuteRequest,
    LookupResult,
    LookupStatus,
    ProviderOperation,
)

# Provider statuses (SPEC §6) and what they prove about the command.
_STATUS_OUTCOME = {
    "succeeded": Outcome.CONFIRMED,
    "processing": Outcome.IN_PROGRESS,
    "failed": Outcome.REJECTED,
}


# 4xx answers that are transient, not refusals: timeout, too early, rate limited.
_COME_BACK_LATER = frozenset({408, 425, 429})


def _client(timeout: float) -> httpx.Client:
    # No keep-alive: a reused connection that the server already closed would fail after the
    # request was written, turning a clean "not sent" into an UNKNOWN.
    return httpx.Client(
        timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0)),
        limits=httpx.Limits(max_keepalive_connections=0),
        follow_redirects=False,
    )


def parse_operation(body: Any) -> ProviderOperation | None:
    if not isinstance(body, dict):
        return None
    op_id, status = body.get("id"), body.get("status")
    if not isinstance(op_id, str) or not isinstance(status, str):
        return None
    result = body.get("result")
    return ProviderOperation(
        id=op_id,
        status=status,
        payload_digest=str(body.get("payload_digest") or ""),
        result=result if isinstance(result, dict) else {},
    )


def classify_operation(
    operation: ProviderOperation,
    *,
    expected_digest: str,
    completion_statuses: frozenset[str] = frozenset({"succeeded"}),
    http_status: int | None = None,
) -> CallResult:
    """What a provider's operation record proves about our command."""
    if operation.payload_digest != expected_digest:
        return CallResult(
            Outcome.UNKNOWN,
            f"the provider recorded digest {operation.payload_digest or '(none)'}, "
            f"not the command's {expected_digest}",
            operation=operation,
            http_status=http_status,
            mismatch=True,
        )
    if operation.status in completion_statuses:
        return CallResult(
            Outcome.CONFIRMED,
            f"provider status {operation.status}",
            operation=operation,
            http_status=http_status,
        )
    outcome = _STATUS_OUTCOME.get(operation.status, Outcome.UNKNOWN)
    if outcome == Outcome.CONFIRMED:  # succeeded, but not this contract's completion state
        outcome = Outcome.IN_PROGRESS
    return CallResult(
        outcome, f"provider status {operation.status}", operation=operation, http_status=http_status
    )


def classify_response(
    response: httpx.Response, *, expected_digest: str, completion_statuses: frozenset[str]
) -> CallResult:
    code = response.status_code
    try:
        body = response.json()
    except ValueError:
        body = None
    if 200 <= code < 300:
        operation = parse_operation(body)
        if operation is None:
            return CallResult(
                Outcome.UNKNOWN,
                f"HTTP {code} with a body that is not an operation",
                http_status=code,
                error=response.text[:500],
            )
        return classify_operation(
            operation,
            expected_digest=expected_digest,
            completion_statuses=completion_statuses,
            http_status=code,
        )
    error = body.get("error", "") if isinstance(body, dict) else response.text[:500]
    if code == 409:
        return CallResult(
            Outcome.REJECTED,
            "precondition failed: the resource version is stale",
            http_status=code,
            error=str(error),
        )
    if code == 422:
        # The provider holds this key for another body: someone else used our key, or the
        # command changed after it was sent. Neither is safe to retry or to confirm.
        return CallResult(
            Outcome.UNKNOWN,
            "the provider holds this idempotency key for another request",
            http_status=code,
            error=str(error),
            mismatch=True,
        )
    if code in _COME_BACK_LATER:
        # Not a business decision: the provider (or a proxy) turned the request away for now.
        # Whether anything was committed is asked by key before anything is sent again.
        return CallResult(
            Outcome.UNKNOWN,
            f"HTTP {code}: the provider asked to come back later",
            http_status=code,
            error=str(error),
        )
    if 400 <= code < 500:
        return CallResult(
            Outcome.REJECTED,
            f"the provider refused it (HTTP {code})",
            http_status=code,
            error=str(error),
        )
    return CallResult(
        Outcome.UNKNOWN,
        f"HTTP {code} after the request was sent",
        http_status=code,
        error=str(error),
    )


class HttpProviderAdapter:
    """Speaks SPEC §6 to one provider base URL."""

    def __init__(
        self, base_url: str, *, completion_statuses: frozenset[str] = frozenset({"succeeded"})
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.completion_statuses = completion_statuses

    def execute(self, request: ExecuteRequest) -> CallResult:
        body = {
            "type": request.type,
            "resource": request.resource,
            "payload": request.payload,
            "payload_digest": request.payload_digest,
        }
        headers = {"Idempotency-Key": request.idempotency_key, "X-Effect-Id": request.effect_id}
        try:
            with _client(request.timeout) as client:
                response = client.post(f"{self.base_url}/operations", json=body, headers=headers)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            return CallResult(
                Outcome.NOT_STARTED,
                "could not connect: nothing was sent",
                error=f"{type(exc).__name__}: {exc}",
            )
        except httpx.TimeoutException as exc:
            return CallResult(
                Outcome.UNKNOWN,
                "timed out after the request was sent",
                error=f"{type(exc).__name__}: {exc}",
            )
        except httpx.TransportError as exc:
            # Reset, closed without an answer, broken pipe mid-body: it may have been received.
            return CallResult(
                Outcome.UNKNOWN,
                "the connection failed after the request was sent",
                error=f"{type(exc).__name__}: {exc}",
            )
        return classify_response(
            response,
            expected_digest=request.payload_digest,
            completion_statuses=self.completion_statuses,
        )

    def lookup(
        self, *, idempotency_key: str, provider_operation_id: str = "", timeout: float
    ) -> LookupResult:
        if provider_operation_id:
            url, params = f"{self.base_url}/operations/{provider_operation_id}", None
        else:
            url, params = f"{self.base_url}/operations", {"idempotency_key": idempotency_key}
        try:
            with _client(timeout) as client:
                response = client.get(url, params=params)
        except httpx.HTTPError as exc:
            return LookupResult(LookupStatus.UNREACHABLE, error=f"{type(exc).__name__}: {exc}")
        if response.status_code == 404:
            return LookupResult(LookupStatus.NOT_FOUND, http_status=404)
        if response.status_code == 200:
            try:
                operation = parse_operation(response.json())
            except ValueError:
                operation = None
            if operation is not None:
                return LookupResult(LookupStatus.FOUND, operation=operation, http_status=200)
        return LookupResult(
            LookupStatus.UNREACHABLE,
            http_status=response.status_code,
            error=response.text[:500],
        )
