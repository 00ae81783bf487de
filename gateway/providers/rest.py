"""The declared REST adapter: any REST API, wired from a ``RestSpec`` (gateway.providers.rest_spec)
instead of code, mapped onto the outcome vocabulary of gateway.providers.base.

The rule that matters is SPEC §6's: only a failure to connect proves the provider did not
receive the command (NOT_STARTED); once a byte of the request may have left, a missing or
failed answer is UNKNOWN until a lookup settles it. The transport is urllib3, with redirects
and retries off and one pool per provider origin; its connections note, per thread, the moment
they first write, which is what separates the two.

The answer classes:

* 2xx: the operation (its id, status and digest read by JSON pointer) says what happened.
* ``codes.refused`` (default 400, 409, 422): REJECTED, the provider's message kept.
* ``codes.try_later`` (default 429): NOT_STARTED with the ``Retry-After`` in the reason. Only
  codes the API documents as "not acted on" belong here: a resend follows.
* ``codes.key_conflict``: the provider holds the key for another request (UNKNOWN, mismatch).
* 408, 3xx and every 5xx not declared as ``try_later``: UNKNOWN (it may have acted).
* any other 4xx: REJECTED.

Without an idempotency header the provider cannot recognise a resend: the effect is
at-most-once, and everything uncertain is UNKNOWN, which the gateway never resends before its
lookup has found the operation, or proved it absent.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any
from urllib.parse import quote, urlsplit

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import HTTPError as Urllib3Error

from gateway.choices import Outcome
from gateway.lib import jsonin
from gateway.providers.base import (
    CallResult,
    ExecuteRequest,
    LookupResult,
    LookupStatus,
    ProviderOperation,
)
from gateway.providers.http import retry_after as parse_retry_after
from gateway.providers.rest_spec import (
    BODY_PLACEHOLDER,
    PATH_PLACEHOLDER,
    AnswerSpec,
    LookupSpec,
    RestSpec,
    RestSpecError,
    resolve_pointer,
)

# The status a ProviderOperation carries: SPEC §6's words, which the reconciler judges
# (gateway.providers.http.classify_operation); the provider's own word is in result.
SUCCEEDED, PROCESSING, FAILED, UNRECOGNISED = "succeeded", "processing", "failed", "unrecognised"

_MAX_CONNECTIONS = 16  # per origin, per process; a call waits for one, then NOT_STARTED
_CONNECT_TIMEOUT = 5.0
_TRANSIENT_4XX = frozenset({408})  # the request timed out at the provider: it may have acted


# --- the transport: urllib3, and when a request may have left ---------------------------------

_wire = threading.local()


class _MarkingConnection(HTTPConnection):
    """Notes, for the calling thread, the first write of a request. Connecting happens before
    the note, so a connection that fails to open (refused, DNS, timeout) leaves it unset."""

    def send(self, data: Any) -> None:
        if self.sock is None:
            self.connect()
        _wire.may_have_sent = True
        super().send(data)


class _MarkingTlsConnection(HTTPSConnection):
    """The same for https; the TLS handshake belongs to connecting, before any request byte."""

    def send(self, data: Any) -> None:
        if self.sock is None:
            self.connect()
        _wire.may_have_sent = True
        super().send(data)


class _Pool(HTTPConnectionPool):
    ConnectionCls = _MarkingConnection


class _TlsPool(HTTPSConnectionPool):
    ConnectionCls = _MarkingTlsConnection


@dataclass(frozen=True)
class _Answer:
    status: int
    body: bytes
    retry_after: str


class _NotSent(Exception):
    """No byte of the request left: no connection (refused, DNS, TLS, pool exhausted), or a
    request the adapter would not write (a header with a line break)."""


class _Lost(Exception):
    """The request may have reached the provider, and no complete answer came back."""

    def __init__(self, cause: BaseException, *, timed_out: bool) -> None:
        super().__init__(cause)
        self.cause, self.timed_out = cause, timed_out


_pools: dict[tuple[int, str, str, int, str | None], HTTPConnectionPool] = {}
_pools_lock = threading.Lock()


def _pool(scheme: str, host: str, port: int, ca_certs: str | None) -> HTTPConnectionPool:
    """This process's pool for one origin; a forked child makes its own (the parent's sockets
    are the parent's)."""
    pid = os.getpid()
    key = (pid, scheme, host, port, ca_certs)
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None:
            for inherited in [k for k in _pools if k[0] != pid]:
                del _pools[inherited]  # a parent's: its sockets are the parent's to use
            common: dict[str, Any] = {"maxsize": _MAX_CONNECTIONS, "block": True, "retries": False}
            if scheme == "https":
                pool = _TlsPool(host, port, ca_certs=ca_certs, **common)
            else:
                pool = _Pool(host, port, **common)
            _pools[key] = pool
    return pool


def _send(
    pool: HTTPConnectionPool,
    method: str,
    url: str,
    *,
    headers: Mapping[str, str],
    body: bytes | None,
    timeout: float,
) -> _Answer:
    for name, value in headers.items():
        if any(c in value for c in "\r\n\0") or not value.isascii():
            raise _NotSent(f"header {name} holds a line break, NUL or non-ASCII character")
    _wire.may_have_sent = False
    connect = min(timeout, _CONNECT_TIMEOUT)
    try:
        response = pool.urlopen(
            method,
            url,
            body=body,
            headers=dict(headers),
            retries=False,
            redirect=False,
            assert_same_host=False,
            timeout=urllib3.Timeout(connect=connect, read=timeout),
            pool_timeout=max(1, round(connect)),  # typed int; whole seconds are enough
            preload_content=True,
        )
    except (Urllib3Error, OSError, http.client.HTTPException) as exc:
        if not getattr(_wire, "may_have_sent", False):
            raise _NotSent(_describe(exc)) from exc
        timed_out = isinstance(exc, (urllib3.exceptions.ReadTimeoutError, TimeoutError))
        raise _Lost(exc, timed_out=timed_out) from exc
    return _Answer(response.status, response.data, response.headers.get("Retry-After", ""))


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _user_agent() -> str:
    try:
        return f"effect-gateway/{metadata.version('effect-gateway')}"
    except metadata.PackageNotFoundError:
        return "effect-gateway"


# --- templates ---------------------------------------------------------------------------------


class _Missing(Exception):
    """A template names a value the effect does not have (or one that cannot go there)."""


def _value(context: Mapping[str, Any], name: str) -> Any:
    value: Any = context
    for part in name.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise _Missing(f"the effect has no {name}")
    return value


def _text(value: Any, name: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float) or value is None:
        return json.dumps(value)
    raise _Missing(f"{name} is a {type(value).__name__}, which cannot be put inside a string")


def render_path(template: str, context: Mapping[str, Any]) -> str:
    """A URL path with each ``{name}`` replaced by its value, percent-encoded."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1).strip()
        return quote(_text(_value(context, name), name), safe="")

    return PATH_PLACEHOLDER.sub(one, template)


def render_text(template: str, context: Mapping[str, Any]) -> str:
    """A header value with each ``{name}`` replaced by its value as text."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1).strip()
        return _text(_value(context, name), name)

    return PATH_PLACEHOLDER.sub(one, template)


_ABSENT = object()


def render_body(template: Any, context: Mapping[str, Any]) -> Any:
    """The JSON body: a leaf that is exactly one ``{{name}}`` becomes the value with its JSON
    type (and its member is left out when the effect has no such value); a placeholder inside
    longer text becomes text, and must exist."""
    if isinstance(template, str):
        whole = BODY_PLACEHOLDER.fullmatch(template.strip())
        if whole is not None:
            try:
                return _value(context, whole.group(1).strip())
            except _Missing:
                return _ABSENT

        def one(match: re.Match[str]) -> str:
            name = match.group(1).strip()
            return _text(_value(context, name), name)

        return BODY_PLACEHOLDER.sub(one, template)
    if isinstance(template, dict):
        rendered = {key: render_body(value, context) for key, value in template.items()}
        return {key: value for key, value in rendered.items() if value is not _ABSENT}
    if isinstance(template, list):
        return [None if v is _ABSENT else v for v in (render_body(t, context) for t in template)]
    return template


# --- reading answers -----------------------------------------------------------------------------


def _json(body: bytes) -> Any:
    try:
        return jsonin.loads(body)
    except ValueError:
        return None


def _scalar_text(value: Any) -> str | None:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


class RestProviderAdapter:
    """Sends effects to one REST provider as its ``RestSpec`` declares, and finds them again.

    ``headers`` go on every request (credentials such as ``Authorization``); they are never
    put in a reason, an error or this object's repr. ``timeout``, when set, caps each call's
    own timeout. ``ca_certs`` is a CA bundle for https (the system's store otherwise).
    """

    def __init__(
        self,
        spec: RestSpec,
        base_url: str,
        *,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        ca_certs: str | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http or https base URL: {base_url!r}")
        for name, value in (headers or {}).items():
            if any(c in value for c in "\r\n\0"):
                raise ValueError(f"header {name} holds a line break or NUL")
        self.spec = spec
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._origin = (parts.scheme, parts.hostname, parts.port or _default_port(parts.scheme))
        self._prefix = parts.path.rstrip("/")
        self._ca_certs = ca_certs
        self._headers = {
            "Accept": "application/json",
            "User-Agent": _user_agent(),
            **dict(headers or {}),
        }

    def __repr__(self) -> str:
        return f"RestProviderAdapter({self.base_url!r})"

    def _exchange(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes | None, timeout: float
    ) -> _Answer:
        if self.timeout is not None:
            timeout = min(timeout, self.timeout)
        pool = _pool(*self._origin, self._ca_certs)
        return _send(pool, method, self._prefix + path, headers=headers, body=body, timeout=timeout)

    # --- execute -------------------------------------------------------------------------------

    def execute(self, request: ExecuteRequest) -> CallResult:
        spec = self.spec
        try:
            path, headers, body = self._write_request(request)
        except _Missing as exc:
            # Before any connection: nothing was sent, and sending again would fail the same
            # way, so this is a refusal of the command as declared, not a transient state.
            return CallResult(
                Outcome.REJECTED, f"not sent: the declared request cannot be built ({exc})"
            )
        try:
            answer = self._exchange(spec.method, path, headers, body, request.timeout)
        except _NotSent as exc:
            return CallResult(
                Outcome.NOT_STARTED, "could not connect: nothing was sent", error=str(exc)
            )
        except _Lost as exc:
            reason = (
                "timed out after the request was sent"
                if exc.timed_out
                else "the connection failed after the request was sent"
            )
            return CallResult(Outcome.UNKNOWN, reason, error=_describe(exc.cause))
        return self.classify(answer.status, answer.body, answer.retry_after, request)

    def _write_request(self, request: ExecuteRequest) -> tuple[str, dict[str, str], bytes | None]:
        spec = self.spec
        context = {
            "payload": request.payload,
            "resource": request.resource,
            "effect": {
                "id": request.effect_id,
                "type": request.type,
                "idempotency_key": request.idempotency_key,
                "payload_digest": request.payload_digest,
            },
        }
        headers = dict(self._headers)
        for name, template in spec.headers.items():
            headers[name] = render_text(template, context)
        if spec.effect_headers:
            headers["X-Effect-Id"] = request.effect_id
            headers["X-Payload-Digest"] = request.payload_digest
        if spec.idempotency_header:
            headers[spec.idempotency_header] = request.idempotency_key
        for name, value in headers.items():
            if any(c in value for c in "\r\n\0") or not value.isascii():
                raise _Missing(f"header {name} would hold a line break, NUL or non-ASCII text")
        body: bytes | None = None
        if spec.body is not None:
            rendered = render_body(spec.body, context)
            text = json.dumps(rendered, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
            body = text.encode()
            headers["Content-Type"] = "application/json"
        return render_path(spec.path, context), headers, body

    def classify(
        self, code: int, content: bytes, retry_after: str, request: ExecuteRequest
    ) -> CallResult:
        """What the answer to a write proves, by the declaration's codes and pointers."""
        spec = self.spec
        error = content.decode("utf-8", errors="replace").replace("\x00", "\ufffd")[:500]
        if 200 <= code < 300:
            operation = read_operation(_json(content), spec.answer, spec, request.payload_digest)
            if operation is None:
                return CallResult(
                    Outcome.UNKNOWN,
                    f"HTTP {code}, but no operation id at {spec.answer.operation_id or '(root)'}",
                    http_status=code,
                    error=error,
                )
            return outcome_of(operation, expected_digest=request.payload_digest, http_status=code)
        if code in spec.try_later:
            later = f" (Retry-After: {retry_after})" if retry_after else ""
            return CallResult(
                Outcome.NOT_STARTED,
                f"HTTP {code}: the provider declines to act now; try later{later}",
                http_status=code,
                error=error,
                retry_after=parse_retry_after(retry_after or None),
            )
        if code in spec.key_conflict:
            return CallResult(
                Outcome.UNKNOWN,
                f"HTTP {code}: the provider holds this idempotency key for another request",
                http_status=code,
                error=error,
                mismatch=True,
            )
        if code in spec.refused or (400 <= code < 500 and code not in _TRANSIENT_4XX):
            return CallResult(
                Outcome.REJECTED,
                f"the provider refused it (HTTP {code})",
                http_status=code,
                error=error,
            )
        return CallResult(
            Outcome.UNKNOWN,
            f"HTTP {code} after the request was sent",
            http_status=code,
            error=error,
        )

    # --- lookup --------------------------------------------------------------------------------

    def lookup(
        self,
        *,
        idempotency_key: str,
        provider_operation_id: str = "",
        timeout: float,
        payload_digest: str = "",
    ) -> LookupResult:
        """Find the operation by its id when one is given (and declared), else by the key.

        ``payload_digest`` is the command's: when the declaration has no ``answer.digest``
        (the provider keeps no digest), a match by id or key is the evidence, and the found
        operation carries this digest. Without it, such an operation carries none, which the
        reconciler treats as a mismatch (a human decides), never as a confirmation.
        """
        spec = self.spec
        if provider_operation_id and spec.by_operation_id is not None:
            how, value = spec.by_operation_id, {"operation_id": provider_operation_id}
        elif spec.by_key is not None:
            how, value = spec.by_key, {"idempotency_key": idempotency_key}
        else:
            return LookupResult(LookupStatus.UNREACHABLE, error="no lookup declared for this")
        path = render_path(how.path, value)
        try:
            answer = self._exchange("GET", path, self._headers, None, timeout)
        except _NotSent as exc:
            return LookupResult(LookupStatus.UNREACHABLE, error=str(exc))
        except _Lost as exc:
            return LookupResult(LookupStatus.UNREACHABLE, error=_describe(exc.cause))
        if answer.status == 404 and how.items is None:
            return LookupResult(LookupStatus.NOT_FOUND, http_status=404)
        body = _json(answer.body) if 200 <= answer.status < 300 else None
        if body is None:
            return LookupResult(
                LookupStatus.UNREACHABLE,
                http_status=answer.status,
                error=answer.body.decode("utf-8", errors="replace")[:500],
            )
        return self._found(how, body, idempotency_key, payload_digest)

    def _found(self, how: LookupSpec, body: Any, key: str, payload_digest: str) -> LookupResult:
        if how.items is not None and how.key is not None:
            try:
                items = resolve_pointer(body, how.items)
            except KeyError:
                items = None
            if not isinstance(items, list):
                return LookupResult(
                    LookupStatus.UNREACHABLE, http_status=200, error=f"no list at {how.items}"
                )
            matching = [item for item in items if _key_of(item, how.key) == key]
            if not matching:
                return LookupResult(LookupStatus.NOT_FOUND, http_status=200)
            if len(matching) > 1:
                # Two operations for one key: the provider did it twice. Neither is "the"
                # answer; a human decides.
                return LookupResult(
                    LookupStatus.UNREACHABLE,
                    http_status=200,
                    error=f"{len(matching)} operations hold the key {key}: a human decides",
                )
            body = matching[0]
        operation = read_operation(body, how.answer, self.spec, payload_digest)
        if operation is None:
            return LookupResult(
                LookupStatus.UNREACHABLE,
                http_status=200,
                error=f"the answer has no operation id at {how.answer.operation_id or '(root)'}",
            )
        return LookupResult(LookupStatus.FOUND, operation=operation, http_status=200)


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


def _key_of(item: Any, pointer: str) -> Any:
    try:
        return resolve_pointer(item, pointer)
    except KeyError:
        return None


def read_operation(
    body: Any, answer: AnswerSpec, spec: RestSpec, known_digest: str
) -> ProviderOperation | None:
    """The operation in an answer, its status in SPEC §6's words (the provider's own in
    ``result["provider_status"]``); None when the answer has no operation id."""
    try:
        op_id = _scalar_text(resolve_pointer(body, answer.operation_id))
    except KeyError:
        op_id = None
    if op_id is None:
        return None
    result: dict[str, Any] = {}
    status = SUCCEEDED  # no status declared: an operation that exists is done
    if answer.status is not None:
        raw = _pointed(body, answer.status)
        result["provider_status"] = raw
        status = _status_word(raw, spec)
    digest = known_digest
    if answer.digest is not None:
        found = _pointed(body, answer.digest)
        digest = found if isinstance(found, str) else ""
    for name, pointer in answer.result.items():
        result[name] = _pointed(body, pointer)
    return ProviderOperation(id=op_id[:200], status=status, payload_digest=digest, result=result)


def _pointed(body: Any, pointer: str) -> Any:
    try:
        return resolve_pointer(body, pointer)
    except KeyError:
        return None


def _status_word(raw: Any, spec: RestSpec) -> str:
    for values, word in (
        (spec.done, SUCCEEDED),
        (spec.in_progress, PROCESSING),
        (spec.failed, FAILED),
    ):
        if any(raw == v and type(raw) is type(v) for v in values):
            return word
    return UNRECOGNISED


_WORD_OUTCOME = {
    SUCCEEDED: Outcome.CONFIRMED,
    PROCESSING: Outcome.IN_PROGRESS,
    FAILED: Outcome.REJECTED,
    UNRECOGNISED: Outcome.UNKNOWN,
}


def outcome_of(
    operation: ProviderOperation, *, expected_digest: str, http_status: int | None
) -> CallResult:
    """What an operation read from a write's answer proves about the command."""
    if operation.payload_digest != expected_digest:
        return CallResult(
            Outcome.UNKNOWN,
            f"the provider recorded digest {operation.payload_digest or '(none)'}, "
            f"not the command's {expected_digest}",
            operation=operation,
            http_status=http_status,
            mismatch=True,
        )
    raw = operation.result.get("provider_status", operation.status)
    return CallResult(
        _WORD_OUTCOME[operation.status],
        f"provider status {raw!r} ({operation.status})",
        operation=operation,
        http_status=http_status,
    )


# --- configuration: one provider's settings entry -----------------------------------------------

_CONFIG_FIELDS = frozenset({"base_url", "spec", "spec_file", "timeout", "headers", "ca_certs"})


def adapter_from_config(name: str, config: Mapping[str, Any]) -> RestProviderAdapter:
    """A provider's adapter from its configuration entry: ``base_url``, the declaration inline
    (``spec``) or in a JSON file (``spec_file``), and optionally ``timeout`` (seconds),
    ``headers`` (credentials) and ``ca_certs``. A ValueError names the provider and the field;
    a bad declaration is a RestSpecError naming the field inside it."""
    unknown = sorted(set(config) - _CONFIG_FIELDS)
    if unknown:
        raise ValueError(f"provider {name}: unknown field(s) {', '.join(unknown)}")
    if ("spec" in config) == ("spec_file" in config):
        raise ValueError(f"provider {name}: give exactly one of spec and spec_file")
    base_url = config.get("base_url")
    if not isinstance(base_url, str):
        raise ValueError(f"provider {name}: base_url must be a URL string")
    timeout = config.get("timeout")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
    ):
        raise ValueError(f"provider {name}: timeout must be a positive number of seconds")
    headers = config.get("headers", {})
    if not isinstance(headers, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise ValueError(f"provider {name}: headers must map header names to strings")
    if "spec_file" in config:
        spec = _spec_file(str(config["spec_file"]))
    else:
        spec = RestSpec.from_dict(config["spec"], source=f"provider {name}")
    return RestProviderAdapter(
        spec, base_url, timeout=timeout, headers=headers, ca_certs=config.get("ca_certs")
    )


_spec_files: dict[tuple[str, int], RestSpec] = {}


def _spec_file(path: str) -> RestSpec:
    """A declaration file, read again only when it changed (an adapter is built per call)."""
    try:
        key = (path, os.stat(path).st_mtime_ns)
    except OSError as exc:
        raise RestSpecError([f"cannot read it: {exc}"], source=path) from exc
    spec = _spec_files.get(key)
    if spec is None:
        spec = _spec_files[key] = RestSpec.from_file(path)
    return spec
