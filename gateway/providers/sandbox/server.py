"""The sandbox provider over HTTP: routes, the threading server, start and stop."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import sys
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from gateway.providers.sandbox.provider import (
    DEFAULT_PROVIDER,
    BadRequest,
    Reply,
    SandboxProvider,
    parse_json,
)

# -- HTTP ------------------------------------------------------------------------------------


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default backlog is 5: a burst of concurrent clients (twenty threads on
    # one key, a worker pool) would see SYNs dropped and stall a second in connect().
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], provider: SandboxProvider, verbose: bool) -> None:
        self.provider = provider
        self.verbose = verbose
        self.stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        # Writes being handled now and the most at once, per provider: the oracle of a
        # gateway's cap on calls in flight.
        self.in_flight: dict[str, int] = {}
        self.peak_in_flight: dict[str, int] = {}
        super().__init__(address, _Handler)

    def count_write(self, provider: str, step: int) -> None:
        with self._connections_lock:
            now = self.in_flight[provider] = self.in_flight.get(provider, 0) + step
            self.peak_in_flight[provider] = max(self.peak_in_flight.get(provider, 0), now)

    def track(self, connection: socket.socket, *, open: bool) -> None:
        with self._connections_lock:
            if open:
                self._connections.add(connection)
            else:
                self._connections.discard(connection)

    def close_connections(self) -> None:
        """Cut kept-alive connections, so a stopped sandbox really stops answering."""
        with self._connections_lock:
            connections = list(self._connections)
            self._connections.clear()
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if self.verbose:
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "EffectGatewaySandbox/1"
    disable_nagle_algorithm = True  # headers and body are two writes; no 40 ms stalls
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, open=True)

    def finish(self) -> None:
        self.server.track(self.connection, open=False)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            sys.stderr.write(f"sandbox {self.address_string()} {format % args}\n")

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        try:
            body = self._read_body()
        except BadRequest as exc:
            self.close_connection = True
            self._send(Reply(400, {"error": "bad_request", "detail": str(exc)}))
            return
        url = urlsplit(self.path)
        segments = [unquote(s) for s in url.path.split("/") if s]
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        prefix: str | None = None
        if (
            len(segments) >= 2
            and not segments[0].startswith("_")
            and (segments[1] == "operations" or segments[1].startswith("_"))
        ):
            prefix, segments = segments[0], segments[1:]
        write = method == "POST" and segments == ["operations"]
        if write:  # from the request read to the last byte answered (a slow answer included)
            self.server.count_write(prefix or DEFAULT_PROVIDER, 1)
        try:
            try:
                reply = self._route(method, prefix, segments, query, body)
            except BadRequest as exc:
                reply = Reply(400, {"error": "bad_request", "detail": str(exc)})
            except Exception as exc:
                # A bug must not pass for a fault: a silently dropped connection would look
                # like commit_then_drop to the gateway. Answer 500 and say so on stderr.
                traceback.print_exc()
                reply = Reply(500, {"error": "internal_error", "detail": repr(exc)})
            self._send(reply)
        finally:
            if write:
                self.server.count_write(prefix or DEFAULT_PROVIDER, -1)

    def _route(
        self,
        method: str,
        prefix: str | None,
        segments: list[str],
        query: dict[str, str],
        body: bytes,
    ) -> Reply:
        provider = self.server.provider
        name = prefix or DEFAULT_PROVIDER
        route = segments[0] if segments else ""
        allowed: tuple[str, ...]
        if route == "operations" and len(segments) == 1:
            allowed = ("GET", "POST")
            if method == "POST":
                key = self.headers.get("Idempotency-Key")
                return provider.handle_create(provider=name, idempotency_key=key, body=body)
            if method == "GET":
                return provider.handle_lookup(
                    provider=name, idempotency_key=query.get("idempotency_key")
                )
        elif route == "operations" and len(segments) == 2:
            allowed = ("GET",)
            if method == "GET":
                return provider.handle_lookup(provider=name, operation_id=segments[1])
        elif route == "_health" and len(segments) == 1:
            allowed = ("GET",)
            if method == "GET":
                return Reply(200, {"ok": True})
        elif route == "_faults" and len(segments) == 1:
            allowed = ("GET", "POST", "DELETE")
            if method in allowed:
                return _faults(provider, method, prefix, body)
        elif route == "_resources" and len(segments) == 1:
            allowed = ("GET", "POST")
            if method == "GET":
                return Reply(200, {"resources": provider.resources()})
            if method == "POST":
                return _set_resource(provider, prefix, body)
        elif route == "_operations" and len(segments) == 1:
            allowed = ("GET",)
            if method == "GET":
                ops = provider.operations(
                    provider=prefix or query.get("provider"),
                    idempotency_key=query.get("idempotency_key"),
                    type=query.get("type"),
                )
                return Reply(200, {"operations": ops})
        elif route == "_log" and len(segments) == 1:
            allowed = ("GET",)
            if method == "GET":
                return Reply(200, {"log": provider.log(provider=prefix or query.get("provider"))})
        elif route == "_reset" and len(segments) == 1:
            allowed = ("POST",)
            if method == "POST":
                provider.reset()
                return Reply(200, {"ok": True})
        else:
            return Reply(404, {"error": "not_found"})
        return Reply(405, {"error": "method_not_allowed"}, headers={"Allow": ", ".join(allowed)})

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raise BadRequest("chunked request bodies are not supported; send Content-Length")
        length = self.headers.get("Content-Length")
        if not length:
            return b""
        try:
            size = int(length)
        except ValueError as exc:
            raise BadRequest("bad Content-Length") from exc
        if size < 0:
            raise BadRequest("bad Content-Length")
        return self.rfile.read(size)

    def _send(self, reply: Reply) -> None:
        if reply.reset:
            # An abort (RST, SO_LINGER 0) before any byte: the client sees a reset connection.
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
                self.connection.close()
            return
        if reply.drop:
            # Drop without a byte: the client cannot tell whether we committed (SPEC §4 UNKNOWN).
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        if reply.delay and self.server.stopping.wait(reply.delay):
            self.close_connection = True
            return  # stopped while "slow": the answer never leaves
        data = json.dumps(reply.body).encode("utf-8")
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            # The client gave up (e.g. its timeout fired during a slow answer).
            self.close_connection = True


def _json_object(body: bytes) -> dict[str, Any]:
    data = parse_json(body or b"{}")
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    return data


def _faults(provider: SandboxProvider, method: str, prefix: str | None, body: bytes) -> Reply:
    """``/_faults``: list them (GET), clear them (DELETE), add one (POST)."""
    if method == "GET":
        return Reply(200, {"faults": provider.faults()})
    if method == "DELETE":
        provider.clear_faults()
        return Reply(200, {"faults": []})
    spec = _json_object(body)
    fault = spec.pop("fault", None)
    if not isinstance(fault, str):
        raise BadRequest("fault is required")
    spec.setdefault("provider", prefix)
    spec.setdefault("times", 1)
    return Reply(201, provider.add_fault(fault, **spec))


def _set_resource(provider: SandboxProvider, prefix: str | None, body: bytes) -> Reply:
    """``POST /_resources``: set the version of a resource the provider holds."""
    spec = _json_object(body)
    spec.setdefault("provider", prefix)
    unknown = set(spec) - {"provider", "type", "id", "version"}
    if unknown:
        raise BadRequest(f"unknown fields: {', '.join(sorted(unknown))}")
    if not isinstance(spec.get("type"), str) or not isinstance(spec.get("id"), str | int):
        raise BadRequest("type (a string) and id are required")
    if spec["provider"] is not None and not isinstance(spec["provider"], str):
        raise BadRequest("provider must be a string or null")
    provider.set_resource_version(
        provider=spec["provider"],
        type=spec["type"],
        id=spec["id"],
        version=spec.get("version"),
    )
    return Reply(200, {k: spec.get(k) for k in ("provider", "type", "id", "version")})


class SandboxServer:
    """A threading HTTP server around a :class:`SandboxProvider`.

    The socket is bound in the constructor (``port=0`` picks a free port), so :attr:`url`
    is known before :meth:`start`.
    """

    def __init__(
        self,
        provider: SandboxProvider | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        verbose: bool = False,
    ) -> None:
        self.provider = provider if provider is not None else SandboxProvider()
        self._httpd = _HTTPServer((host, port), self.provider, verbose)
        bound_host, bound_port = self._httpd.server_address[:2]
        self.host = str(bound_host)
        self.port = int(bound_port)
        self.url = f"http://{self.host}:{self.port}"
        self._thread: threading.Thread | None = None
        self._serving = False
        self._closed = False

    def peak_in_flight(self, provider_name: str) -> int:
        """The most writes to ``provider_name`` this server handled at once."""
        return self._httpd.peak_in_flight.get(provider_name, 0)

    def base_url(self, provider_name: str) -> str:
        return f"{self.url}/{provider_name}"

    def start(self) -> SandboxServer:
        """Serve in a daemon thread; returns self."""
        if self._thread is None:
            self._serving = True
            self._thread = threading.Thread(
                target=self._httpd.serve_forever,
                kwargs={"poll_interval": 0.05},
                name=f"sandbox-provider-{self.port}",
                daemon=True,
            )
            self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread until :meth:`stop` (from another thread)."""
        self._serving = True
        try:
            self._httpd.serve_forever(poll_interval=0.2)
        finally:
            self._close()

    def stop(self) -> None:
        """Stop serving, cut open connections and release the port."""
        self._httpd.stopping.set()
        if self._serving:
            self._serving = False
            self._httpd.shutdown()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._close()

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            self._httpd.server_close()
        self._httpd.stopping.set()
        self._httpd.close_connections()

    def __enter__(self) -> SandboxServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
