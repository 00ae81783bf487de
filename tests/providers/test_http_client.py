"""The provider client of a worker process: one client, kept-alive connections, and the rule
that a request which may have left is UNKNOWN while one that provably did not is NOT_STARTED.

The server here closes idle connections, as real providers and their load balancers do. The
client checks a pooled connection before reusing it; the close can still land between that
check and the write. The tests open that window on purpose (the check is made to miss) and
look at what each kind of close proves.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time

import pytest

from gateway.choices import Outcome
from gateway.providers import http as provider_http
from gateway.providers.base import ExecuteRequest


class IdleClosingServer:
    """HTTP/1.1 with keep-alive; closes a connection ``idle`` seconds after its last answer,
    gracefully (FIN) or with a reset (RST). Counts the requests it read in full."""

    def __init__(self, *, idle: float, reset: bool) -> None:
        self.idle, self.reset = idle, reset
        self.requests: list[str] = []
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/tickets"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buffer = b""
        while True:
            conn.settimeout(self.idle)
            try:
                chunk = conn.recv(65536)
            except TimeoutError:
                break  # idle for too long: close it, as a provider would
            if not chunk:
                break
            buffer += chunk
            head, sep, rest = buffer.partition(b"\r\n\r\n")
            if not sep:
                continue
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(rest) < length:
                continue
            body, buffer = json.loads(rest[:length]), rest[length:]
            key = next(
                line.split(b":", 1)[1].strip().decode()
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"idempotency-key")
            )
            self.requests.append(key)
            answer = json.dumps(
                {
                    "id": f"op_{len(self.requests)}",
                    "status": "succeeded",
                    "payload_digest": body["payload_digest"],
                    "result": {},
                }
            ).encode()
            conn.sendall(
                b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(answer)}\r\n\r\n".encode()
                + answer
            )
        if self.reset:  # SO_LINGER 0: close() sends RST instead of FIN
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()

    def stop(self) -> None:
        self.sock.close()


def request(key: str) -> ExecuteRequest:
    return ExecuteRequest(
        effect_id="eff_test",
        type="ticket.create",
        idempotency_key=key,
        resource={"type": "queue", "id": "q"},
        payload={"title": "t"},
        payload_digest="sha256:abc",
        timeout=2,
    )


@pytest.fixture
def fresh_client(settings):
    """A new per-process client for each test (the pool must not carry sockets across)."""
    settings.GATEWAY_PROVIDER_KEEPALIVE = 30
    provider_http._clients.clear()
    yield
    for client in provider_http._clients.values():
        client.close()
    provider_http._clients.clear()


@pytest.fixture
def missed_check(monkeypatch):
    """The pool's liveness check of an idle connection misses the close (the close arrives
    just after it): the request is written on the closed connection."""
    monkeypatch.setattr(provider_http, "_readable", lambda sock: False)


def test_one_client_per_process_keeps_its_connection(fresh_client):
    server = IdleClosingServer(idle=5, reset=False)
    adapter = provider_http.HttpProviderAdapter(server.url)
    try:
        first = adapter.execute(request("k1"))
        second = adapter.execute(request("k2"))
    finally:
        server.stop()
    assert (first.outcome, second.outcome) == (Outcome.CONFIRMED, Outcome.CONFIRMED)
    assert server.requests == ["k1", "k2"]
    assert server.connections == 1  # the second call reused the first one's connection
    assert provider_http._client() is provider_http._client()


def test_a_connection_closed_while_idle_is_replaced_before_the_request(fresh_client):
    server = IdleClosingServer(idle=0.05, reset=False)
    adapter = provider_http.HttpProviderAdapter(server.url)
    try:
        assert adapter.execute(request("k1")).outcome == Outcome.CONFIRMED
        time.sleep(0.3)  # the server has closed the idle connection
        again = adapter.execute(request("k2"))
    finally:
        server.stop()
    assert again.outcome == Outcome.CONFIRMED
    assert server.requests == ["k1", "k2"]
    assert server.connections == 2


def test_a_reused_connection_reset_before_the_write_is_not_started(fresh_client, missed_check):
    server = IdleClosingServer(idle=0.05, reset=True)
    adapter = provider_http.HttpProviderAdapter(server.url)
    try:
        assert adapter.execute(request("k1")).outcome == Outcome.CONFIRMED
        time.sleep(0.3)  # the server reset the idle connection; the client does not know
        result = adapter.execute(request("k2"))
    finally:
        server.stop()
    assert result.outcome == Outcome.NOT_STARTED, result
    assert "before any byte" in result.reason
    assert server.requests == ["k1"]  # the provider never saw k2


def test_a_reused_connection_that_fails_after_the_write_is_unknown(fresh_client, missed_check):
    server = IdleClosingServer(idle=0.05, reset=False)
    adapter = provider_http.HttpProviderAdapter(server.url)
    try:
        assert adapter.execute(request("k1")).outcome == Outcome.CONFIRMED
        time.sleep(0.3)  # closed gracefully (FIN): the write is accepted, the answer never comes
        result = adapter.execute(request("k2"))
    finally:
        server.stop()
    # The bytes left this machine: whether the provider acted on them is not knowable here.
    assert result.outcome == Outcome.UNKNOWN, result
    assert "after the request was sent" in result.reason


def test_a_client_made_before_a_fork_is_not_used_after_it(fresh_client, monkeypatch):
    before = provider_http._client()
    monkeypatch.setattr(provider_http.os, "getpid", lambda: -1)
    after = provider_http._client()
    assert after is not before
