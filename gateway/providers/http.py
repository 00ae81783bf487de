"""The HTTP adapter for the provider protocol of SPEC §6, and the classification of its answers.

The rule that matters: once a byte of the request may have left, a missing answer is UNKNOWN,
never NOT_STARTED. Only a failure to connect proves the provider did not receive the command.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import httpcore
import httpx
from django.conf import settings

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


class _Progress(threading.local):
    """Bytes of the current request the kernel accepted, per thread: the evidence that
    separates "nothing left this machine" from "it may have been received"."""

    sent = 0


_progress = _Progress()


class _CountingStream(httpcore.NetworkStream):
    """A network stream that writes with ``send`` and counts what each call accepted.

    httpcore swallows a write error and goes on to read the answer (a server may refuse a
    request early with a well-formed response), so the exception that reaches us does not say
    whether the write failed or the read did. The count does.
    """

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        sock = self._inner.get_extra_info("socket")
        if sock is None:  # not a plain or TLS socket: count the whole buffer once written
            self._inner.write(buffer, timeout)
            _progress.sent += len(buffer)
            return
        try:
            while buffer:
                sock.settimeout(timeout)
                accepted = sock.send(buffer)
                _progress.sent += accepted
                buffer = buffer[accepted:]
        except TimeoutError as exc:
            raise httpcore.WriteTimeout(exc) from exc
        except OSError as exc:
            raise httpcore.WriteError(exc) from exc

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None):
        return _CountingStream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str):
        return self._inner.get_extra_info(info)


class _CountingBackend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        stream = self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return _CountingStream(stream)

    def connect_unix_socket(self, path, timeout=None, socket_options=None):  # pragma: no cover
        return _CountingStream(self._inner.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:  # pragma: no cover
        self._inner.sleep(seconds)


class _Transport(httpx.HTTPTransport):
    """httpx's transport with one SSL context, a keep-alive pool and the counting backend."""

    def __init__(self, *, keepalive: float) -> None:
        super().__init__()
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=_MAX_CONNECTIONS,
            max_keepalive_connections=_MAX_CONNECTIONS if keepalive > 0 else 0,
            keepalive_expiry=keepalive,
            network_backend=_CountingBackend(),
        )


# Per host, per worker process; a prefork worker runs one task at a time, a threaded web
# process a few. Beyond this many, a call waits for a connection (PoolTimeout: not sent).
_MAX_CONNECTIONS = 16
_clients: dict[int, httpx.Client] = {}
_clients_lock = threading.Lock()


def _client() -> httpx.Client:
    """This process's provider client: one SSL context (loading the CA bundle costs tens of
    milliseconds of CPU) and a pool of kept-alive connections, created after a fork, never
    inherited from a parent's sockets."""
    pid = os.getpid()
    client = _clients.get(pid)
    if client is None:
        with _clients_lock:
            client = _clients.get(pid)
            if client is None:
                _clients.clear()  # a parent's client: its sockets belong to the parent
                keepalive = float(getattr(settings, "GATEWAY_PROVIDER_KEEPALIVE", 5.0))
                # trust_env off: a proxy from the environment would bypass the counting
                # transport, and a failure through it could not be told apart.
                client = httpx.Client(
                    transport=_Transport(keepalive=keepalive),
                    follow_redirects=False,
                    trust_env=False,
                )
                _clients[pid] = client
    return client


def _timeout(seconds: float) -> httpx.Timeout:
    return httpx.Timeout(seconds, connect=min(seconds, 5.0), pool=min(seconds, 5.0))


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
        _progress.sent = 0
        try:
            response = _client().post(
                f"{self.base_url}/operations",
                json=body,
                headers=headers,
                timeout=_timeout(request.timeout),
            )
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            return CallResult(
                Outcome.NOT_STARTED,
                "could not connect: nothing was sent",
                error=f"{type(exc).__name__}: {exc}",
            )
        except httpx.TransportError as exc:
            if _progress.sent == 0:
                # A kept-alive connection the provider had closed: the write failed before
                # the kernel accepted a single byte, so the provider cannot have received it.
                return CallResult(
                    Outcome.NOT_STARTED,
                    "the connection failed before any byte of the request was written",
                    error=f"{type(exc).__name__}: {exc}",
                )
            if isinstance(exc, httpx.TimeoutException):
                return CallResult(
                    Outcome.UNKNOWN,
                    "timed out after the request was sent",
                    error=f"{type(exc).__name__}: {exc}",
                )
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
            response = _client().get(url, params=params, timeout=_timeout(timeout))
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
