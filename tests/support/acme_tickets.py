"""Acme Tickets: a tiny ticketing API with a shape of its own (not SPEC §6), the real server
behind the example contract module docs/examples/acme_effects. Its ticket list is the
oracle: how many tickets a request id made.

- ``POST /v2/tickets`` with ``X-Request-Id``, body ``{"summary", "severity", "metadata"}``:
  ``201 {"ticket": {...}}``; the same request id and body again: ``200`` and the same ticket;
  the same request id with another body: ``409 {"error": "request_id_reused"}``; a body it
  refuses: ``400 {"errors": [...]}``.
- ``GET /v2/tickets?request_id=ID``: ``200 {"tickets": [...]}`` (empty when none).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

SEVERITIES = ("low", "high", "critical")


class AcmeTickets:
    """The tickets, decided and recorded under one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tickets: list[dict[str, Any]] = []
        self.requests: dict[str, dict[str, Any]] = {}  # request id -> the body it came with

    def create(self, request_id: str, body: Any) -> tuple[int, dict[str, Any]]:
        errors = []
        if not request_id:
            errors.append("X-Request-Id is required")
        if not isinstance(body, dict) or not isinstance(body.get("summary"), str):
            errors.append("summary: a string is required")
        elif body.get("severity") not in SEVERITIES:
            errors.append(f"severity: one of {', '.join(SEVERITIES)}")
        if errors:
            return 400, {"errors": errors}
        with self.lock:
            if request_id in self.requests:
                if self.requests[request_id] != body:
                    return 409, {"error": "request_id_reused"}
                return 200, {"ticket": self._by_request(request_id)[0]}
            ticket = {
                "number": 1000 + len(self.tickets) + 1,
                "state": "open",
                "summary": body["summary"],
                "severity": body["severity"],
                "metadata": body.get("metadata") or {},
                "request_id": request_id,
            }
            self.requests[request_id] = body
            self.tickets.append(ticket)
            return 201, {"ticket": ticket}

    def _by_request(self, request_id: str) -> list[dict[str, Any]]:
        return [t for t in self.tickets if t["request_id"] == request_id]

    def find(self, request_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return self._by_request(request_id)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _answer(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        if urlsplit(self.path).path != "/v2/tickets":
            return self._answer(404, {"error": "not_found"})
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw)
        except ValueError:
            return self._answer(400, {"errors": ["the body is not JSON"]})
        self._answer(*self.server.acme.create(self.headers.get("X-Request-Id", ""), body))

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        request_id = parse_qs(url.query).get("request_id", [""])[0]
        if url.path != "/v2/tickets" or not request_id:
            return self._answer(404, {"error": "not_found"})
        self._answer(200, {"tickets": self.server.acme.find(request_id)})


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, acme: AcmeTickets) -> None:
        self.acme = acme
        super().__init__(("127.0.0.1", 0), _Handler)


class AcmeTicketsServer:
    """The server on a free loopback port, in a thread of the test process."""

    def __init__(self) -> None:
        self.acme = AcmeTickets()
        self.httpd = _Server(self.acme)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> AcmeTicketsServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
