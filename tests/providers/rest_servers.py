"""Two real HTTP servers of two different shapes, for the declared REST adapter's tests. Each
keeps its own records (the tests' oracle) and has fault switches the tests set directly.

* ``TicketsServer``: in the style of Zendesk. ``POST /api/v2/tickets`` honours an
  ``Idempotency-Key`` header (a replay returns the first ticket; the key with another body is a
  400); ``GET /api/v2/tickets/{id}``; ``GET /api/v2/tickets?external_id=``. Bearer token auth.
* ``DeploysServer``: an internal deployment service with no idempotency at all. ``POST
  /deploys`` queues a deploy (202, ``queued``); each read moves it on (``running``, then
  ``succeeded``, or ``failed`` for a SHA in ``fail_shas``); ``GET /deploys/{uid}``; ``GET
  /deploys?ref=``.

Fault switches (``server.fault``): ``rate_limit`` (429 with Retry-After, nothing recorded),
``maintenance`` (503 with Retry-After, nothing recorded), ``drop_after_commit`` (records, then
closes the connection without an answer), ``error_after_commit`` (records, then 500),
``redirect_after_commit`` (records, then a 303 to another URL), ``slow`` (records, then
answers after ``delay`` seconds), ``tamper_digest`` (records another
digest than the one sent).
"""

from __future__ import annotations

import hashlib
import json
import socket
import ssl
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support.tls import self_signed_certificate  # noqa: F401  (re-exported)


class _Handler(BaseHTTPRequestHandler):
    server: _HttpServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def _handle(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        owner = self.server.owner
        with owner.lock:
            owner.received.append(
                {"method": method, "path": self.path, "headers": dict(self.headers), "body": body}
            )
        answer = owner.handle(method, self.path, dict(self.headers), body)
        if answer is None:  # drop: the request was read and acted on; no answer at all
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        code, data, extra = answer
        if owner.fault == "slow" and method == "POST" and 200 <= code < 300:
            time.sleep(owner.delay)
        raw = json.dumps(data).encode()
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            for name, value in extra.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(raw)
        except OSError:  # the client gave up (a timeout): what it did stays recorded
            self.close_connection = True


class _KeepAliveHandler(_Handler):
    """HTTP/1.1: connections stay open between requests, closed after ``timeout`` idle seconds,
    as a provider's load balancer does."""

    protocol_version = "HTTP/1.1"
    timeout = 0.3


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    owner: RecordingServer

    def get_request(self) -> tuple[socket.socket, Any]:
        request = super().get_request()
        self.owner.connections += 1
        return request

    def shutdown_request(self, request: Any) -> None:
        super().shutdown_request(request)
        self.owner.closed += 1


class RecordingServer:
    """A threaded HTTP/1.0 server on a free loopback port, with its own records."""

    def __init__(self, *, tls: ssl.SSLContext | None = None, keepalive: bool = False) -> None:
        self.lock = threading.Lock()
        self.connections = 0
        self.closed = 0
        self.received: list[dict[str, Any]] = []
        self.fault: str | None = None
        self.delay = 2.0
        self.retry_after = "7"
        handler = _KeepAliveHandler if keepalive else _Handler
        self._httpd = _HttpServer(("127.0.0.1", 0), handler)
        self._httpd.owner = self
        if tls is not None:
            self._httpd.socket = tls.wrap_socket(self._httpd.socket, server_side=True)
        self.port = self._httpd.server_address[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def start(self) -> RecordingServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def handle(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, Any, dict[str, str]] | None:
        raise NotImplementedError

    def _refuse_for_now(self) -> tuple[int, Any, dict[str, str]] | None:
        if self.fault == "rate_limit":
            return 429, {"error": "TooManyRequests"}, {"Retry-After": self.retry_after}
        if self.fault == "maintenance":
            return 503, {"error": "maintenance: nothing queued"}, {"Retry-After": self.retry_after}
        return None

    def _after_commit(
        self, answer: tuple[int, Any, dict[str, str]]
    ) -> tuple[int, Any, dict[str, str]] | None:
        if self.fault == "drop_after_commit":
            return None
        if self.fault == "error_after_commit":
            return 500, {"error": "internal error"}, {}
        if self.fault == "redirect_after_commit":
            return 303, {}, {"Location": f"{self.url}/elsewhere"}
        return answer


class TicketsServer(RecordingServer):
    """Zendesk-style tickets with an Idempotency-Key header and an external_id search."""

    def __init__(self, *, token: str = "test-token", tls: ssl.SSLContext | None = None) -> None:
        super().__init__(tls=tls)
        self.token = token
        self.tickets: list[dict[str, Any]] = []
        self.keys: dict[str, tuple[str, int]] = {}  # key -> (body digest, ticket id)

    def handle(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, Any, dict[str, str]] | None:
        if headers.get("Authorization") != f"Bearer {self.token}":
            return 401, {"error": "Couldn't authenticate you"}, {}
        parts = urlsplit(path)
        if method == "POST" and parts.path == "/api/v2/tickets":
            return self._create(headers, body)
        if method == "GET" and parts.path == "/api/v2/tickets":
            wanted = parse_qs(parts.query).get("external_id", [""])[0]
            with self.lock:
                found = [t for t in self.tickets if t["external_id"] == wanted]
            return 200, {"tickets": found, "count": len(found)}, {}
        if method == "GET" and parts.path.startswith("/api/v2/tickets/"):
            ticket_id = parts.path.rsplit("/", 1)[1]
            with self.lock:
                found = [t for t in self.tickets if str(t["id"]) == ticket_id]
            if not found:
                return 404, {"error": "RecordNotFound"}, {}
            return 200, {"ticket": found[0]}, {}
        return 404, {"error": "InvalidEndpoint"}, {}

    def _create(self, headers: dict[str, str], body: bytes) -> Any:
        later = self._refuse_for_now()
        if later is not None:
            return later
        ticket = json.loads(body).get("ticket") or {}
        if not ticket.get("subject"):
            return 422, {"error": "RecordInvalid", "description": "Subject: cannot be blank"}, {}
        key = headers.get("Idempotency-Key", "")
        digest = hashlib.sha256(body).hexdigest()
        with self.lock:
            if key in self.keys:
                seen_digest, ticket_id = self.keys[key]
                if seen_digest != digest:
                    return 400, {"error": "IdempotentRequestError"}, {}
                first = next(t for t in self.tickets if t["id"] == ticket_id)
                return 201, {"ticket": first}, {"x-idempotency-lookup": "hit"}
            ticket_id = 35436 + len(self.tickets)
            record = {
                "id": ticket_id,
                "url": f"{self.url}/api/v2/tickets/{ticket_id}.json",
                "status": "new",
                "subject": ticket["subject"],
                "priority": ticket.get("priority"),
                "group": ticket.get("group"),
                "external_id": ticket.get("external_id"),
                "description": (ticket.get("comment") or {}).get("body", ""),
            }
            self.tickets.append(record)
            if key:
                self.keys[key] = (digest, ticket_id)
        return self._after_commit((201, {"ticket": record}, {}))


class DeploysServer(RecordingServer):
    """A deployment service without idempotency: every POST queues a new deploy."""

    services = frozenset({"catalog", "billing"})

    def __init__(self, *, keepalive: bool = False) -> None:
        super().__init__(keepalive=keepalive)
        self.deploys: list[dict[str, Any]] = []
        self.fail_shas: set[str] = set()

    def handle(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, Any, dict[str, str]] | None:
        parts = urlsplit(path)
        if method == "POST" and parts.path == "/deploys":
            return self._create(body)
        if method == "GET" and parts.path == "/deploys":
            ref = parse_qs(parts.query).get("ref", [""])[0]
            with self.lock:
                found = [self._advance(d) for d in self.deploys if d["ref"] == ref]
            return 200, {"deploys": found}, {}
        if method == "GET" and parts.path.startswith("/deploys/"):
            uid = parts.path.rsplit("/", 1)[1]
            with self.lock:
                found = [self._advance(d) for d in self.deploys if d["uid"] == uid]
            if not found:
                return 404, {"error": "no such deploy"}, {}
            return 200, {"deploy": found[0]}, {}
        return 404, {"error": "no such endpoint"}, {}

    def _create(self, body: bytes) -> Any:
        later = self._refuse_for_now()
        if later is not None:
            return later
        data = json.loads(body)
        if data.get("service") not in self.services:
            return 422, {"error": f"unknown service {data.get('service')!r}"}, {}
        digest = data.get("digest", "")
        if self.fault == "tamper_digest":
            digest = "sha256:" + "0" * 64
        record = {
            "uid": f"d-{uuid.uuid4().hex[:12]}",
            "state": "queued",
            "service": data["service"],
            "sha": data.get("sha"),
            "ref": data.get("ref"),
            "digest": digest,
            "note": data.get("note"),
        }
        with self.lock:
            self.deploys.append(record)
        return self._after_commit((202, {"deploy": dict(record)}, {}))

    def _advance(self, deploy: dict[str, Any]) -> dict[str, Any]:
        """Each read finds the deploy one step further on: queued, running, then done."""
        if deploy["state"] == "queued":
            deploy["state"] = "running"
        elif deploy["state"] == "running":
            deploy["state"] = "failed" if deploy["sha"] in self.fail_shas else "succeeded"
        return dict(deploy)
