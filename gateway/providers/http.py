"""The HTTP adapter for the provider protocol of SPEC §6, and the classification of its answers.

The rule that matters: once a byte of the request may have left, a missing answer is UNKNOWN,
never NOT_STARTED. Only a failure to connect proves the provider did not receive the command.

The transport is the standard library's (``socket``, ``ssl``, ``http.client``'s parser): it
writes with ``send`` and counts what the kernel accepted, so that a failure on a kept-alive
connection says which of the two it was. httpx cost three times the CPU per call.
"""

from __future__ import annotations

import functools
import http.client
import json
import os
import select
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from importlib import metadata
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from django.conf import settings

from gateway.choices import Outcome
from gateway.lib import jsonin
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


# Per host, per worker process; a prefork worker runs one task at a time, a threaded web
# process a few. Beyond this many, a call waits for a connection (PoolTimeout: not sent).
_MAX_CONNECTIONS = 16
_CONNECT_TIMEOUT = 5.0
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True)
class ProviderResponse:
    """A provider's answer, read in full: what classification needs and nothing more."""

    status_code: int
    content: bytes

    def json(self) -> Any:
        """The body, read by the gateway's strict reader (gateway.lib.jsonin): a value the
        ledger could not store (``\\u0000``, NaN, a lone surrogate) or digest (an integer
        past 2^53) is a ValueError here, so the answer counts as one that is not an operation
        (UNKNOWN: asked again by the reconciler, then a human), instead of an error in the
        statement that records it, which would fail every effect of that drain with it."""
        return jsonin.loads(self.content)

    @property
    def text(self) -> str:
        """The body as text for an attempt's error: undecodable bytes and NUL (which
        PostgreSQL's text refuses) replaced by U+FFFD."""
        return self.content.decode("utf-8", errors="replace").replace("\x00", "\ufffd")


class PoolTimeout(Exception):
    """Every connection to the host stayed busy for the pool timeout."""


class _NotSent(Exception):
    """No connection to write on: none free in time, or connecting failed (refused, timed out,
    DNS, TLS handshake). Not a byte of the request was written."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(cause)
        self.cause = cause


class _ExchangeFailed(Exception):
    """Writing the request or reading its answer failed, after ``sent`` bytes of the request had
    been accepted by the kernel: the evidence that separates "nothing left this machine" from
    "it may have been received"."""

    def __init__(self, cause: Exception, *, sent: int) -> None:
        super().__init__(cause)
        self.cause, self.sent = cause, sent


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _readable(sock: socket.socket) -> bool:
    """Whether an idle connection has something to read. A server that closed it left an EOF
    (or a reset) there, and it answers no request of ours: either way it is done with it."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


@dataclass(slots=True)
class _Idle:
    sock: socket.socket
    since: float


class _Pool:
    """Kept-alive connections to one origin (scheme, host, port), at most _MAX_CONNECTIONS open.

    A slot is held from taking a connection to giving it back; an idle connection holds none,
    and a new one is opened only when no idle one is left, so idle and busy together stay
    within the limit.
    """

    def __init__(self, client: _Client, scheme: str, host: str, port: int) -> None:
        self._client = client
        self.scheme, self.host, self.port = scheme, host, port
        self._slots = threading.BoundedSemaphore(_MAX_CONNECTIONS)
        self._idle: list[_Idle] = []  # the most recently used last
        self._lock = threading.Lock()

    def take(self, timeout: float) -> socket.socket:
        wait = min(timeout, _CONNECT_TIMEOUT)
        if not self._slots.acquire(timeout=wait):
            raise _NotSent(
                PoolTimeout(f"no connection to {self.host}:{self.port} free within {wait:g}s")
            )
        try:
            return self._take_idle() or self._connect(timeout)
        except BaseException:
            self._slots.release()
            raise

    def give_back(self, sock: socket.socket, *, reusable: bool) -> None:
        if reusable and self._client.keepalive > 0:
            with self._lock:
                self._idle.append(_Idle(sock, time.monotonic()))
        else:
            sock.close()
        self._slots.release()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.sock.close()

    def _take_idle(self) -> socket.socket | None:
        expired_before = time.monotonic() - self._client.keepalive
        while True:
            with self._lock:
                while self._idle and self._idle[0].since <= expired_before:
                    self._idle.pop(0).sock.close()
                if not self._idle:
                    return None
                sock = self._idle.pop().sock
            # The server may have closed it while it sat here (its own idle timeout). The
            # close can still land between this check and the write: the byte count tells.
            if not _readable(sock):
                return sock
            sock.close()

    def _connect(self, timeout: float) -> socket.socket:
        sock: socket.socket | None = None
        try:
            sock = socket.create_connection(
                (self.host, self.port), timeout=min(timeout, _CONNECT_TIMEOUT)
            )
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.scheme == "https":
                sock = self._client.tls().wrap_socket(sock, server_hostname=self.host)
        except (OSError, UnicodeError) as exc:  # refused, timed out, DNS, TLS handshake
            if sock is not None:
                sock.close()
            raise _NotSent(exc) from exc
        return sock


class _Client:
    """Keep-alive HTTP/1.1 over the standard library: ``socket`` and ``ssl`` to connect,
    ``http.client``'s parser for the answer (Content-Length or chunked).

    The request is written with ``send``, counting what each call accepted, so that a failure
    says whether any of it left. No proxy, no redirect, no content encoding.
    """

    def __init__(self, *, keepalive: float) -> None:
        self.keepalive = keepalive
        # Made on the first https connection; a test may set one that trusts its own CA.
        self.ssl_context: ssl.SSLContext | None = None
        self._pools: dict[tuple[str, str, int], _Pool] = {}
        self._lock = threading.Lock()
        self._fixed_headers = f"User-Agent: {_user_agent()}\r\n" + (
            "" if keepalive > 0 else "Connection: close\r\n"
        )

    def tls(self) -> ssl.SSLContext:
        with self._lock:
            if self.ssl_context is None:
                self.ssl_context = ssl.create_default_context()
            return self.ssl_context

    def close(self) -> None:
        with self._lock:
            pools = list(self._pools.values())
        for pool in pools:
            pool.close()

    def request(
        self,
        base_url: str,
        method: str,
        path: str,
        *,
        headers: dict[str, str],
        body: bytes = b"",
        timeout: float,
    ) -> ProviderResponse:
        """One exchange. Raises _NotSent (nothing was written) or _ExchangeFailed."""
        try:
            url = _split(base_url)
        except ValueError as exc:
            raise _NotSent(exc) from exc
        head = f"{method} {url.path}{path} HTTP/1.1\r\nHost: {url.host_header}\r\n"
        head += self._fixed_headers
        for name, value in headers.items():
            if "\r" in value or "\n" in value or "\0" in value:
                raise _NotSent(ValueError(f"{name} contains a line break or NUL"))
            if not value.isascii():  # a key accepted before keys were held to ASCII
                raise _NotSent(ValueError(f"{name} is not ASCII: it cannot be sent as a header"))
            head += f"{name}: {value}\r\n"
        if method == "POST":
            head += f"Content-Length: {len(body)}\r\n"
        data = memoryview((head + "\r\n").encode("ascii") + body)

        pool = self._pool(url)
        sock = pool.take(timeout)
        sent, reusable = 0, False
        response: http.client.HTTPResponse | None = None
        try:
            sock.settimeout(timeout)
            while sent < len(data):
                sent += sock.send(data[sent:])
            response = http.client.HTTPResponse(sock, method=method)
            response.begin()
            status, content = response.status, response.read()  # all of it, or it raises
            reusable = not response.will_close  # Connection: close, HTTP/1.0, no length
        except (OSError, http.client.HTTPException) as exc:
            raise _ExchangeFailed(exc, sent=sent) from exc
        finally:
            if response is not None:
                response.close()  # its file holds the socket open until it is closed
            pool.give_back(sock, reusable=reusable)
        return ProviderResponse(status, content)

    def _pool(self, url: _Url) -> _Pool:
        key = (url.scheme, url.host, url.port)
        pool = self._pools.get(key)
        if pool is None:
            with self._lock:
                pool = self._pools.setdefault(key, _Pool(self, *key))
        return pool


def _user_agent() -> str:
    try:
        version = metadata.version("effect-gateway")
    except metadata.PackageNotFoundError:
        version = "0"
    return f"effect-gateway/{version}"


_clients: dict[int, _Client] = {}
_clients_lock = threading.Lock()


def _client() -> _Client:
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
                client = _Client(keepalive=keepalive)
                _clients[pid] = client
    return client


@dataclass(frozen=True, slots=True)
class _Url:
    """A provider base URL, split once."""

    scheme: str
    host: str
    port: int
    host_header: str
    path: str


@functools.lru_cache(maxsize=256)
def _split(base_url: str) -> _Url:
    parts = urlsplit(base_url)
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise ValueError(f"not an http or https URL: {base_url!r}")
    host = parts.hostname.encode("idna").decode("ascii")
    port = parts.port or _DEFAULT_PORTS[parts.scheme]
    host_header = f"[{host}]" if ":" in host else host
    if port != _DEFAULT_PORTS[parts.scheme]:
        host_header += f":{port}"
    return _Url(parts.scheme, host, port, host_header, quote(parts.path.rstrip("/"), safe="/%"))


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
    response: ProviderResponse, *, expected_digest: str, completion_statuses: frozenset[str]
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
        headers = {
            "Content-Type": "application/json",
            "Idempotency-Key": request.idempotency_key,
            "X-Effect-Id": request.effect_id,
        }
        try:
            response = _client().request(
                self.base_url,
                "POST",
                "/operations",
                headers=headers,
                body=_json_body(body),
                timeout=request.timeout,
            )
        except _NotSent as exc:
            return CallResult(
                Outcome.NOT_STARTED,
                "could not connect: nothing was sent",
                error=_describe(exc.cause),
            )
        except _ExchangeFailed as exc:
            if exc.sent == 0:
                # A kept-alive connection the provider had closed: the write failed before
                # the kernel accepted a single byte, so the provider cannot have received it.
                return CallResult(
                    Outcome.NOT_STARTED,
                    "the connection failed before any byte of the request was written",
                    error=_describe(exc.cause),
                )
            if isinstance(exc.cause, TimeoutError):
                return CallResult(
                    Outcome.UNKNOWN,
                    "timed out after the request was sent",
                    error=_describe(exc.cause),
                )
            # Reset, closed without an answer, broken pipe mid-body: it may have been received.
            return CallResult(
                Outcome.UNKNOWN,
                "the connection failed after the request was sent",
                error=_describe(exc.cause),
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
            path = f"/operations/{quote(provider_operation_id, safe='')}"
        else:
            path = "/operations?" + urlencode({"idempotency_key": idempotency_key})
        try:
            response = _client().request(self.base_url, "GET", path, headers={}, timeout=timeout)
        except _NotSent as exc:
            return LookupResult(LookupStatus.UNREACHABLE, error=_describe(exc.cause))
        except _ExchangeFailed as exc:
            return LookupResult(LookupStatus.UNREACHABLE, error=_describe(exc.cause))
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


def _json_body(body: dict[str, Any]) -> bytes:
    # Compact, UTF-8 and without NaN, byte for byte what httpx's ``json=`` sent.
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
