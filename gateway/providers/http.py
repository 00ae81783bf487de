"""The HTTP adapter for the provider protocol of SPEC §6, and the classification of its answers.

The rule that matters: once a byte of the request may have left, a missing answer is UNKNOWN,
never NOT_STARTED. Only a failure to connect proves the provider did not receive the command.

The transport is urllib3 (v2): kept-alive pools per origin with a cap, proxies from the
environment (``HTTPS_PROXY``, ``HTTP_PROXY``, ``NO_PROXY``), TLS verified against the system
store or ``GATEWAY_PROVIDER_CA_BUNDLE``, a client certificate when one is configured, and
never a retry or a redirect of its own. Its connection classes add two things the rule needs:
a failure while connecting (DNS, refused, connect timeout, a proxy's tunnel, the TLS
handshake) is raised as its own exception, and the request's bytes are counted as the kernel
accepts them, so that a kept-alive connection the provider had closed says whether any of
the request left on it.
"""

from __future__ import annotations

import email.utils
import functools
import json
import os
import ssl
import threading
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import urllib3
from django.conf import settings
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import EmptyPoolError, HTTPError, ReadTimeoutError

from gateway.choices import Outcome
from gateway.lib import jsonin
from gateway.providers.base import (
    CallResult,
    ExecuteRequest,
    LookupResult,
    LookupStatus,
    ProviderConfig,
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

_CONNECT_TIMEOUT = 5.0
_DEFAULT_PORTS = {"http": 80, "https": 443}
# Origins a process keeps pools for (providers and their proxies); past it the least recently
# used pool is closed.
_MAX_POOLS = 64


@dataclass(frozen=True, slots=True)
class ProviderResponse:
    """A provider's answer, read in full: what classification needs and nothing more."""

    status_code: int
    content: bytes
    headers: Mapping[str, str] = field(default_factory=dict)

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
    DNS, proxy tunnel, TLS handshake), or the request could not be written at all. Not a byte
    of the request was written."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(cause)
        self.cause = cause


class _ExchangeFailed(Exception):
    """Writing the request or reading its answer failed, after ``sent`` bytes of the request had
    been accepted by the kernel: the evidence that separates "nothing left this machine" from
    "it may have been received"."""

    def __init__(self, cause: BaseException, *, sent: int) -> None:
        super().__init__(cause)
        self.cause, self.sent = cause, sent


class _ConnectFailed(Exception):
    """Raised by the connection classes instead of what connecting raised. It is none of the
    exceptions urllib3 maps or retries, so it reaches the client as it is, after the pool
    discarded the connection."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(cause)
        self.cause = cause


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _timed_out(exc: BaseException) -> bool:
    """A read timeout, or a write that timed out (urllib3 wraps that one in ProtocolError)."""
    if isinstance(exc, ReadTimeoutError | TimeoutError):
        return True
    return any(isinstance(arg, TimeoutError) for arg in exc.args)


class _Exchange(threading.local):
    """This thread's request in flight: the bytes of it the kernel accepted so far. A thread
    sends one request at a time, and urllib3 does not say how far a failed write got."""

    sent = 0


_exchange = _Exchange()


class _Counting:
    """What the gateway's connections add to urllib3's (a mixin for both schemes)."""

    keepalive: float = 5.0
    _answered_at: float = 0.0

    def connect(self) -> None:
        try:
            super().connect()  # type: ignore[misc]
        except (OSError, HTTPError, ValueError) as exc:  # ValueError: IDNA, a bad certificate
            # urllib3 wraps the socket's error (refused, DNS, timed out): that one says it.
            cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
            raise _ConnectFailed(cause) from exc
        _exchange.sent = 0  # a proxy's CONNECT is not the request
        self._answered_at = time.monotonic()

    _held: bytes | None = None

    def request(
        self, method: str, url: str, body: Any = None, headers: Any = None, **options: Any
    ) -> None:
        """A body of bytes leaves in one write with the head (urllib3 writes them apart: a
        second system call and packet per request)."""
        if not isinstance(body, bytes) or not body:
            super().request(method, url, body=body, headers=headers, **options)  # type: ignore[misc]
            return
        self._held = b""
        try:
            headers = {**(headers or {}), "Content-Length": str(len(body))}
            super().request(method, url, body=None, headers=headers, **options)  # type: ignore[misc]
            head = self._held
        finally:
            self._held = None
        self.send(head + body)

    def send(self, data: Any) -> None:
        sock = self.sock  # type: ignore[attr-defined]
        if sock is None:  # http.client opens a plain connection at the first write
            self.connect()
            sock = self.sock  # type: ignore[attr-defined]
        if not isinstance(data, bytes | bytearray | memoryview):
            super().send(data)  # type: ignore[misc]
            return
        if self._held is not None:
            self._held += data
            return
        view = memoryview(data)
        while view:
            written = sock.send(view)
            _exchange.sent += written
            view = view[written:]

    def getresponse(self) -> Any:
        response = super().getresponse()  # type: ignore[misc]
        self._answered_at = time.monotonic()
        return response

    @property
    def is_connected(self) -> bool:
        """False for a connection idle past the keep-alive: the pool opens a new one. The
        liveness check below (a readable idle socket: the provider closed it) can still miss
        a close that lands just after it; the byte count tells what that write proved."""
        if time.monotonic() - self._answered_at > self.keepalive:
            return False
        return bool(super().is_connected)  # type: ignore[misc]


class _Connection(_Counting, HTTPConnection):
    pass


class _TLSConnection(_Counting, HTTPSConnection):
    pass


class _Pool(HTTPConnectionPool):
    ConnectionCls = _Connection


class _TLSPool(HTTPSConnectionPool):
    ConnectionCls = _TLSConnection


@dataclass(frozen=True, slots=True)
class _Route:
    """How one provider base URL is reached: a pool of direct connections (``pool``), or a
    proxy's manager that is handed absolute URLs."""

    url: _Url
    pool: HTTPConnectionPool | None
    manager: urllib3.PoolManager | None


class _Client:
    """This process's outbound HTTP: urllib3 pools, one per origin, at most ``pool_size``
    connections each (a call beyond waits for one, then gives up without sending)."""

    def __init__(
        self,
        *,
        keepalive: float,
        pool_size: int = 16,
        ca_bundle: str = "",
        client_cert: str = "",
        client_key: str = "",
    ) -> None:
        self.keepalive, self.pool_size = keepalive, pool_size
        self.ca_bundle, self.client_cert, self.client_key = ca_bundle, client_cert, client_key
        self.proxies = urllib.request.getproxies()
        self._managers: dict[tuple[str, str], urllib3.PoolManager] = {}
        self._routes: dict[str, _Route] = {}
        self._ssl_context: ssl.SSLContext | None = None
        self._lock = threading.Lock()
        self._fixed_headers = {"User-Agent": _user_agent()}
        # One client per process (``_client``): its connections read the keep-alive here.
        _Counting.keepalive = keepalive
        if keepalive <= 0:
            self._fixed_headers["Connection"] = "close"

    def tls(self) -> ssl.SSLContext:
        """The TLS context of every provider connection, made once (loading the CA store
        costs tens of milliseconds of CPU): the system store, or the configured CA bundle
        alone; the client certificate and key when configured."""
        if self._ssl_context is None:
            context = ssl.create_default_context(cafile=self.ca_bundle or None)
            if self.client_cert:
                context.load_cert_chain(self.client_cert, self.client_key or None)
            self._ssl_context = context
        return self._ssl_context

    def proxy_for(self, url: _Url) -> str:
        """The proxy of this URL from the environment, or "" when none or NO_PROXY says so."""
        proxy = self.proxies.get(url.scheme, "")
        if not proxy or urllib.request.proxy_bypass(url.host_header):  # reads NO_PROXY
            return ""
        return str(proxy)

    def close(self) -> None:
        with self._lock:
            managers = list(self._managers.values())
            self._managers.clear()
            self._routes.clear()
        for manager in managers:
            manager.clear()

    def request(
        self,
        base_url: str,
        method: str,
        path: str,
        *,
        headers: dict[str, str],
        body: bytes | None = None,
        timeout: float,
    ) -> ProviderResponse:
        """One exchange. Raises _NotSent (nothing was written) or _ExchangeFailed."""
        for name, value in headers.items():
            if "\r" in value or "\n" in value or "\0" in value:
                raise _NotSent(ValueError(f"{name} contains a line break or NUL"))
            if not value.isascii():  # a key accepted before keys were held to ASCII
                raise _NotSent(ValueError(f"{name} is not ASCII: it cannot be sent as a header"))
        route = self._route(base_url)
        target = route.url.path + path
        wait = min(timeout, _CONNECT_TIMEOUT)
        options: dict[str, Any] = {
            "body": body,
            "headers": {**self._fixed_headers, **headers},
            "retries": False,  # the gateway decides what is sent again, after a lookup
            "redirect": False,  # see classify_response: a 3xx is an answer, never followed
            "timeout": urllib3.Timeout(connect=wait, read=timeout),
            "pool_timeout": wait,
        }
        _exchange.sent = 0
        try:
            if route.pool is not None:
                answer = route.pool.urlopen(method, target, **options)
            else:
                assert route.manager is not None
                answer = route.manager.urlopen(method, route.url.origin + target, **options)
        except EmptyPoolError as exc:
            raise _NotSent(
                PoolTimeout(f"no connection to {route.url.host_header} free within {wait:g}s")
            ) from exc
        except _ConnectFailed as exc:
            raise _NotSent(exc.cause) from exc
        except (HTTPError, OSError) as exc:
            raise _ExchangeFailed(exc, sent=_exchange.sent) from exc
        return ProviderResponse(answer.status, answer.data, answer.headers)

    def _route(self, base_url: str) -> _Route:
        route = self._routes.get(base_url)
        if route is not None:
            return route
        try:
            url = _split(base_url)
            proxy = self.proxy_for(url)
            with self._lock:
                manager = self._manager(url.scheme, proxy)
            if proxy:
                route = _Route(url, None, manager)
            else:
                route = _Route(url, manager.connection_from_url(url.origin), None)
        except (OSError, ValueError, HTTPError) as exc:  # a bad URL, CA bundle, proxy
            raise _NotSent(exc) from exc
        self._routes[base_url] = route
        return route

    def _manager(self, scheme: str, proxy: str) -> urllib3.PoolManager:
        """The manager of direct (``proxy`` "") or proxied connections of one scheme; https
        ones carry the TLS context, so an http-only deployment never loads a CA store."""
        manager = self._managers.get((scheme, proxy))
        if manager is not None:
            return manager
        options: dict[str, Any] = {
            "num_pools": _MAX_POOLS,
            "maxsize": self.pool_size,
            "block": True,  # never more than pool_size connections to one origin
        }
        if scheme == "https":
            options["ssl_context"] = self.tls()
        if proxy:
            auth = urlsplit(proxy)
            if auth.username:
                options["proxy_headers"] = urllib3.make_headers(
                    proxy_basic_auth=f"{auth.username}:{auth.password or ''}"
                )
            manager = urllib3.ProxyManager(proxy, **options)
        else:
            manager = urllib3.PoolManager(**options)
        manager.pool_classes_by_scheme = {"http": _Pool, "https": _TLSPool}
        self._managers[(scheme, proxy)] = manager
        return manager


def _user_agent() -> str:
    try:
        version = metadata.version("effect-gateway")
    except metadata.PackageNotFoundError:
        version = "0"
    return f"effect-gateway/{version}"


_clients: dict[int, _Client] = {}
_clients_lock = threading.Lock()


def _client() -> _Client:
    """This process's provider client: one TLS context and kept-alive pools, created after a
    fork, never inherited from a parent's sockets."""
    pid = os.getpid()
    client = _clients.get(pid)
    if client is None:
        with _clients_lock:
            client = _clients.get(pid)
            if client is None:
                _clients.clear()  # a parent's client: its sockets belong to the parent
                client = _Client(
                    keepalive=float(getattr(settings, "GATEWAY_PROVIDER_KEEPALIVE", 5.0)),
                    pool_size=int(getattr(settings, "GATEWAY_PROVIDER_POOL_SIZE", 16)),
                    ca_bundle=getattr(settings, "GATEWAY_PROVIDER_CA_BUNDLE", ""),
                    client_cert=getattr(settings, "GATEWAY_PROVIDER_CLIENT_CERT", ""),
                    client_key=getattr(settings, "GATEWAY_PROVIDER_CLIENT_KEY", ""),
                )
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

    @property
    def origin(self) -> str:
        return f"{self.scheme}://{self.host_header}"


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
            retry_after=retry_after(response.headers.get("Retry-After")),
        )
    if 300 <= code < 400:
        return _redirected(response, error=str(error))
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
        retry_after=retry_after(response.headers.get("Retry-After")) if code == 503 else None,
    )


def _redirected(response: ProviderResponse, *, error: str) -> CallResult:
    """A 3xx: never followed, never a refusal. A 303 is how a server says "done, see there"
    after a POST; a 307/308 asks for the same POST elsewhere (a place the configuration does
    not name, which would get the key and the body). Neither says whether the effect
    happened: a lookup by key does."""
    code = response.status_code
    where = response.headers.get("Location", "") or "(no Location)"
    return CallResult(
        Outcome.UNKNOWN,
        f"HTTP {code}: the provider redirected to {where}; a redirect is never followed "
        "and proves nothing about the effect",
        http_status=code,
        error=error,
    )


def retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds from a ``Retry-After`` header (a number of seconds or an HTTP date), or None
    when there is none or it cannot be read."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


class HttpProviderAdapter:
    """Speaks SPEC §6 to one provider base URL."""

    def __init__(
        self,
        base_url: str,
        *,
        completion_statuses: frozenset[str] = frozenset({"succeeded"}),
        credential: str = "",
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.completion_statuses = completion_statuses
        # Sent as a bearer token on every call when configured (GATEWAY_PROVIDERS).
        self._auth = {"Authorization": f"Bearer {credential}"} if credential else {}

    def __repr__(self) -> str:
        return f"HttpProviderAdapter({self.base_url!r})"  # never the credential

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
            **self._auth,
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
            if _timed_out(exc.cause):
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
        self,
        *,
        idempotency_key: str,
        provider_operation_id: str = "",
        timeout: float,
        payload_digest: str = "",
    ) -> LookupResult:
        if provider_operation_id:
            path = f"/operations/{quote(provider_operation_id, safe='')}"
        else:
            path = "/operations?" + urlencode({"idempotency_key": idempotency_key})
        try:
            response = _client().request(
                self.base_url, "GET", path, headers=dict(self._auth), timeout=timeout
            )
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


def from_config(config: ProviderConfig) -> HttpProviderAdapter:
    """The SPEC §6 adapter of a ``GATEWAY_PROVIDERS`` entry (``"adapter": "http"``); its
    credential, if any, goes as a bearer token."""
    if not config.base_url:
        raise ValueError(f"provider {config.name!r} has no base URL")
    return HttpProviderAdapter(
        config.base_url,
        completion_statuses=config.contract.completion_statuses,
        credential=config.credential,
    )
