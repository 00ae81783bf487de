"""The conformance kit's fault proxy: a small HTTP proxy that sits in front of any provider
server and makes the faults a server cannot make of itself.

It is a test device, not a gateway component: the adapter under test is pointed at it
(:meth:`FaultProxy.front` turns the server's base URL into the proxy's), and it forwards
each request to the server on a connection of its own, unless a rule says otherwise. Rules
(:meth:`FaultProxy.add`), each for ``times`` requests of one method (optionally whose path
matches a regular expression, and whose headers carry the values of ``header``, e.g. one
credential's ``Authorization``):

- ``reset``: read the whole request, then reset the connection; never forwarded.
- ``drop_after_forward``: forward, read the server's answer, close without a byte.
- ``error_after_forward``: forward, read the answer, answer ``status`` (502) instead.
- ``delay_after_forward``: forward, read the answer, send it ``seconds`` later.
- ``answer``: answer ``status`` with ``body`` and ``headers`` (a 429 with Retry-After, a
  409); never forwarded.

A refused connection needs no rule: :attr:`FaultProxy.refused_url` names a bound port
where nothing listens. What the proxy did is in :attr:`FaultProxy.events`, with the request
headers named in ``record_headers`` as they arrived (e.g. which credential each request
carried to the server: a test's oracle of credential scoping).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ACTIONS = frozenset(
    {"reset", "drop_after_forward", "error_after_forward", "delay_after_forward", "answer"}
)
# Not passed on between the client and the server (RFC 9110 §7.6.1), and the framing the
# proxy sets itself.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "host",
    }
)


@dataclass
class Rule:
    action: str
    method: str = "POST"
    path: str | None = None  # a regular expression searched in the request target
    times: int | None = 1  # None: until cleared
    params: dict[str, Any] = field(default_factory=dict)
    header: dict[str, str] = field(default_factory=dict)  # lower-case name -> exact value

    def matches(self, method: str, target: str, headers: Any = None) -> bool:
        if self.method != method or (self.path is not None and not re.search(self.path, target)):
            return False
        return all((headers or {}).get(name) == value for name, value in self.header.items())


@dataclass(frozen=True)
class _Answer:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes


class FaultProxy:
    """An HTTP fault proxy in front of one server (``upstream``: its base URL or origin)."""

    def __init__(
        self, upstream: str, *, host: str = "127.0.0.1", record_headers: tuple[str, ...] = ()
    ) -> None:
        self.record_headers = record_headers
        parts = urlsplit(upstream)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {upstream!r}")
        self.upstream_scheme = parts.scheme
        self.upstream_host = parts.hostname
        self.upstream_port = parts.port or (443 if parts.scheme == "https" else 80)
        self.events: list[dict[str, Any]] = []
        self._rules: list[Rule] = []
        self._lock = threading.Lock()
        self._server = _Server((host, 0), self)
        self.url = f"http://{host}:{self._server.server_address[1]}"
        # Bound and never listening: the kernel refuses every connection to it.
        self._closed_port = socket.socket()
        self._closed_port.bind((host, 0))
        self.refused_url = f"http://{host}:{self._closed_port.getsockname()[1]}"
        self._thread: threading.Thread | None = None

    # -- set-up ------------------------------------------------------------------------------

    def front(self, base_url: str, *, refused: bool = False) -> str:
        """``base_url`` (the server's) with the proxy's origin, or the refusing one."""
        origin = urlsplit(self.refused_url if refused else self.url)
        parts = urlsplit(base_url)
        return urlunsplit((origin.scheme, origin.netloc, parts.path, parts.query, ""))

    def add(
        self,
        action: str,
        *,
        method: str = "POST",
        path: str | None = None,
        times: int | None = 1,
        header: dict[str, str] | None = None,
        **params: Any,
    ) -> Rule:
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}; known: {', '.join(sorted(ACTIONS))}")
        wanted = {name.lower(): value for name, value in (header or {}).items()}
        rule = Rule(action, method.upper(), path, times, params, wanted)
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def start(self) -> FaultProxy:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name=f"fault-proxy-{self.url}",
                daemon=True,
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        self._server.stopping.set()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()
        self._server.close_connections()
        self._closed_port.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- used by the handler -----------------------------------------------------------------

    def take_rule(self, method: str, target: str, headers: Any = None) -> Rule | None:
        """The oldest rule for this request, counted as applied."""
        with self._lock:
            for rule in self._rules:
                if rule.matches(method, target, headers):
                    if rule.times is not None:
                        rule.times -= 1
                        if rule.times <= 0:
                            self._rules.remove(rule)
                    return rule
        return None

    def record(self, **event: Any) -> None:
        with self._lock:
            self.events.append(event)

    def upstream(self) -> http.client.HTTPConnection:
        if self.upstream_scheme == "https":
            return http.client.HTTPSConnection(self.upstream_host, self.upstream_port, timeout=60)
        return http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=60)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], proxy: FaultProxy) -> None:
        self.proxy = proxy
        self.stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def track(self, connection: socket.socket, *, open: bool) -> None:
        with self._connections_lock:
            if open:
                self._connections.add(connection)
            else:
                self._connections.discard(connection)

    def close_connections(self) -> None:
        with self._connections_lock:
            connections = list(self._connections)
            self._connections.clear()
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away mid-answer is what faults are made of


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ConformanceFaultProxy/1"
    disable_nagle_algorithm = True
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, open=True)

    def finish(self) -> None:
        self.server.track(self.connection, open=False)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._relay("GET")

    def do_POST(self) -> None:
        self._relay("POST")

    def do_PUT(self) -> None:
        self._relay("PUT")

    def do_PATCH(self) -> None:
        self._relay("PATCH")

    def do_DELETE(self) -> None:
        self._relay("DELETE")

    def _relay(self, method: str) -> None:
        proxy = self.server.proxy
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        rule = proxy.take_rule(method, self.path, self.headers)
        action = rule.action if rule is not None else "forward"
        params = rule.params if rule is not None else {}
        event: dict[str, Any] = {
            "method": method,
            "path": self.path,
            "action": action,
            "at": time.time(),
        }
        if proxy.record_headers:
            event["headers"] = {
                name.lower(): self.headers.get(name)
                for name in proxy.record_headers
                if self.headers.get(name) is not None
            }
        if action == "reset":
            proxy.record(**event, forwarded=False)
            self._cut(reset=True)
            return
        if action == "answer":
            proxy.record(**event, forwarded=False, status=params.get("status", 429))
            self._answer(_made_answer(params))
            return
        answer = self._forward(method, body)
        event.update(forwarded=True, upstream_status=answer.status if answer else None)
        proxy.record(**event)
        if answer is None or action == "drop_after_forward":
            self._cut(reset=False)
        elif action == "error_after_forward":
            status = int(params.get("status", 502))
            self._answer(_made_answer({"status": status, "body": {"error": "injected"}}))
        elif action == "delay_after_forward":
            if self.server.stopping.wait(float(params.get("seconds", 5.0))):
                self._cut(reset=False)
                return
            self._answer(answer)
        else:
            self._answer(answer)

    def _forward(self, method: str, body: bytes) -> _Answer | None:
        """The server's answer, or None when it closed without one. A connection of its own
        per request: a request is never written twice, whatever the server did."""
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        if body or method in ("POST", "PUT", "PATCH"):
            headers["Content-Length"] = str(len(body))
        upstream = self.server.proxy.upstream()
        try:
            upstream.request(method, self.path, body=body or None, headers=headers)
            response = upstream.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException):
            return None
        finally:
            upstream.close()
        kept = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP]
        return _Answer(response.status, response.reason, kept, data)

    def _answer(self, answer: _Answer) -> None:
        try:
            self.send_response(answer.status, answer.reason)
            for name, value in answer.headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(answer.body)))
            self.end_headers()
            self.wfile.write(answer.body)
        except OSError:
            self.close_connection = True

    def _cut(self, *, reset: bool) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            if reset:  # SO_LINGER 0: close() sends RST instead of FIN
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
                self.connection.close()
            else:
                self.connection.shutdown(socket.SHUT_RDWR)


def _made_answer(params: dict[str, Any]) -> _Answer:
    body = json.dumps(params.get("body", {"error": "injected"})).encode()
    headers = [("Content-Type", "application/json")]
    headers += [(str(k), str(v)) for k, v in dict(params.get("headers", {})).items()]
    status = int(params.get("status", 429))
    return _Answer(status, http.client.responses.get(status, ""), headers, body)
