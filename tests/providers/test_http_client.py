"""The provider client of a worker process (urllib3 underneath): one client, kept-alive
connections, and the rule that a request which may have left is UNKNOWN while one that
provably did not is NOT_STARTED.

The server here closes idle connections, as real providers and their load balancers do. The
pool checks a kept-alive connection before reusing it; the close can still land between that
check and the write. The tests open that window on purpose (the check is made to miss) and
look at what each kind of close proves. The servers further down fail in the other ways a
provider can (busy, refusing, hanging up, slow, cut off mid-write, chunked, ``Connection:
close``, redirecting, rate limiting, https with and without a client certificate, behind a
proxy), each with what it proves.
"""

from __future__ import annotations

import datetime
import json
import socket
import ssl
import struct
import threading
import time

import pytest
import urllib3

from gateway.choices import Outcome
from gateway.providers import http as provider_http
from gateway.providers.base import ExecuteRequest
from tests.support.tls import self_signed_certificate


class IdleClosingServer:
    """HTTP/1.1 with keep-alive; closes a connection ``idle`` seconds after its last answer,
    gracefully (FIN) or with a reset (RST). Counts the requests it read in full."""

    def __init__(self, *, idle: float, reset: bool, tls: ssl.SSLContext | None = None) -> None:
        self.idle, self.reset, self.tls = idle, reset, tls
        self.requests: list[str] = []
        self.heads: list[bytes] = []  # each request's line and headers, as received
        self.bodies: list[bytes] = []
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}/tickets"
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
        if self.tls is not None:
            try:
                conn = self.tls.wrap_socket(conn, server_side=True)
            except OSError:  # a client that does not trust the certificate
                conn.close()
                return
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
            body, buffer = rest[:length], rest[length:]
            key = next(
                (
                    line.split(b":", 1)[1].strip().decode()
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"idempotency-key")
                ),
                "",
            )
            self.heads.append(head)
            self.bodies.append(body)
            self.requests.append(key)
            if not self.answer(conn, json.loads(body) if body else {}):
                break
        if self.reset:  # SO_LINGER 0: close() sends RST instead of FIN
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()

    def operation(self, body: dict) -> bytes:
        return json.dumps(
            {
                "id": f"op_{len(self.requests)}",
                "status": "succeeded",
                "payload_digest": body.get("payload_digest", "sha256:abc"),
                "result": {},
            }
        ).encode()

    extra_headers = b""  # sent with every answer (a subclass's misbehaviour)

    def answer(self, conn: socket.socket, body: dict) -> bool:
        """Answer one request; False closes the connection. Subclasses misbehave here."""
        answer = self.operation(body)
        conn.sendall(
            b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
            + self.extra_headers
            + f"Content-Length: {len(answer)}\r\n\r\n".encode()
            + answer
        )
        return True

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
    monkeypatch.setattr(urllib3.connectionpool, "is_connection_dropped", lambda conn: False)


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


def test_a_key_that_is_not_ascii_is_not_sent(fresh_client):
    """A command accepted before keys were held to ASCII: its header cannot be written, so
    nothing is sent (NOT_STARTED, with the reason), instead of an encoding error that left
    the effect in DISPATCHING until its lease ran out."""
    server = IdleClosingServer(idle=5, reset=False)
    adapter = provider_http.HttpProviderAdapter(server.url)
    try:
        result = adapter.execute(request("acme:réf-1"))
    finally:
        server.stop()
    assert result.outcome == Outcome.NOT_STARTED
    assert "not ASCII" in result.error
    assert server.requests == [] and server.connections == 0


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


# -- What each way of failing proves ---------------------------------------------------------


class HoldingServer(IdleClosingServer):
    """Reads each request in full, then waits for ``release`` (or ``hold`` seconds)."""

    def __init__(self, *, hold: float = 30, **kwargs) -> None:
        super().__init__(idle=30, reset=False, **kwargs)
        self.hold, self.release = hold, threading.Event()

    def answer(self, conn, body):
        self.release.wait(self.hold)
        return super().answer(conn, body)


def test_a_full_pool_is_not_started_and_sends_nothing(fresh_client):
    server = HoldingServer()
    adapter = provider_http.HttpProviderAdapter(server.url)
    results = {}

    def call(key):
        results[key] = adapter.execute(request(key))

    busy = [threading.Thread(target=call, args=(f"k{i}",)) for i in range(16)]
    try:
        for thread in busy:
            thread.start()
        deadline = time.monotonic() + 5
        while len(server.requests) < 16 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(server.requests) == 16  # every connection of the pool is out
        waited = adapter.execute(ExecuteRequest(**{**vars(request("late")), "timeout": 0.3}))
        server.release.set()
        for thread in busy:
            thread.join(5)
    finally:
        server.release.set()
        server.stop()
    assert waited.outcome == Outcome.NOT_STARTED, waited
    assert waited.reason == "could not connect: nothing was sent"
    assert waited.error.startswith("PoolTimeout")
    assert "late" not in server.requests
    assert server.connections == 16
    assert {r.outcome for r in results.values()} == {Outcome.CONFIRMED}


def test_a_refused_connection_is_not_started(fresh_client):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, not listening: the kernel refuses connections
    url = f"http://127.0.0.1:{closed.getsockname()[1]}/tickets"
    try:
        result = provider_http.HttpProviderAdapter(url).execute(request("k1"))
        lookup = provider_http.HttpProviderAdapter(url).lookup(idempotency_key="k1", timeout=1)
    finally:
        closed.close()
    assert result.outcome == Outcome.NOT_STARTED, result
    assert result.reason == "could not connect: nothing was sent"
    assert "ConnectionRefused" in result.error
    assert lookup.status == provider_http.LookupStatus.UNREACHABLE


class HangUpServer(IdleClosingServer):
    """Reads the request, then closes the connection without a word."""

    def answer(self, conn, body):
        return False


def test_a_server_that_hangs_up_after_reading_the_request_is_unknown(fresh_client):
    server = HangUpServer(idle=5, reset=False)
    try:
        result = provider_http.HttpProviderAdapter(server.url).execute(request("k1"))
    finally:
        server.stop()
    assert result.outcome == Outcome.UNKNOWN, result
    assert result.reason == "the connection failed after the request was sent"
    assert server.requests == ["k1"]  # it did arrive: NOT_STARTED would have been a lie


def test_a_timeout_after_the_request_was_sent_is_unknown_and_drops_the_connection(
    fresh_client, missed_check
):
    # missed_check: the late answer would make the connection readable, and the liveness
    # check would drop it anyway; what is under test is that it never went back to the pool.
    server = HoldingServer(hold=0.5)
    adapter = provider_http.HttpProviderAdapter(server.url)
    try:
        slow = adapter.execute(ExecuteRequest(**{**vars(request("k1")), "timeout": 0.2}))
        server.release.set()
        time.sleep(0.4)  # the late answer to k1 lands on the abandoned connection
        again = adapter.execute(request("k2"))
    finally:
        server.release.set()
        server.stop()
    assert slow.outcome == Outcome.UNKNOWN, slow
    assert slow.reason == "timed out after the request was sent"
    # Its answer was never read: reused, the connection would hand k1's answer to k2.
    assert again.outcome == Outcome.CONFIRMED, again
    assert again.operation.id == "op_2"
    assert server.connections == 2


def test_a_write_cut_off_midway_is_unknown(fresh_client):
    # The server reads the start of a large request, then resets the connection while the
    # client is still writing it: the write fails, but the kernel had accepted bytes before.
    listener = socket.create_server(("127.0.0.1", 0))
    received = []

    def serve():
        conn, _ = listener.accept()
        received.append(conn.recv(65536))
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    big = ExecuteRequest(**{**vars(request("k1")), "payload": {"title": "t" * 32_000_000}})
    try:
        result = provider_http.HttpProviderAdapter(
            f"http://127.0.0.1:{listener.getsockname()[1]}/tickets"
        ).execute(big)
    finally:
        thread.join(5)
        listener.close()
    assert received and received[0].startswith(b"POST /tickets/operations")
    assert result.outcome == Outcome.UNKNOWN, result
    assert result.reason == "the connection failed after the request was sent"


class ChunkedServer(IdleClosingServer):
    def answer(self, conn, body):
        answer = self.operation(body)
        half = len(answer) // 2
        chunks = b"".join(
            f"{len(part):x}\r\n".encode() + part + b"\r\n"
            for part in (answer[:half], answer[half:])
        )
        conn.sendall(
            b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
        )
        return True


def two_calls(server: IdleClosingServer):
    """Two requests (keys k1, k2) through one adapter to ``server``, stopped after them."""
    adapter = provider_http.HttpProviderAdapter(server.url)
    try:
        return adapter.execute(request("k1")), adapter.execute(request("k2"))
    finally:
        server.stop()


def test_a_chunked_answer_is_read_in_full_and_the_connection_kept(fresh_client):
    server = ChunkedServer(idle=5, reset=False)
    first, second = two_calls(server)
    assert (first.outcome, second.outcome) == (Outcome.CONFIRMED, Outcome.CONFIRMED)
    assert (first.operation.id, second.operation.id) == ("op_1", "op_2")
    assert server.connections == 1


class ClosingServer(IdleClosingServer):
    """Says ``Connection: close`` and yet keeps reading: only the client's respect for the
    header makes it open a new connection."""

    extra_headers = b"Connection: close\r\n"


def test_an_answer_that_says_connection_close_is_not_reused(fresh_client):
    server = ClosingServer(idle=5, reset=False)
    first, second = two_calls(server)
    assert (first.outcome, second.outcome) == (Outcome.CONFIRMED, Outcome.CONFIRMED)
    assert server.connections == 2


def test_an_idle_connection_past_the_keepalive_is_not_reused(fresh_client, settings):
    settings.GATEWAY_PROVIDER_KEEPALIVE = 0.1
    provider_http._clients.clear()
    server = IdleClosingServer(idle=5, reset=False)  # it would have kept it
    adapter = provider_http.HttpProviderAdapter(server.url)
    try:
        adapter.execute(request("k1"))
        time.sleep(0.2)
        again = adapter.execute(request("k2"))
    finally:
        server.stop()
    assert again.outcome == Outcome.CONFIRMED
    assert server.connections == 2


def test_without_keepalive_every_call_has_its_own_connection(fresh_client, settings):
    settings.GATEWAY_PROVIDER_KEEPALIVE = 0
    provider_http._clients.clear()
    server = IdleClosingServer(idle=5, reset=False)
    adapter = provider_http.HttpProviderAdapter(server.url)
    try:
        results = [adapter.execute(request(key)).outcome for key in ("k1", "k2")]
    finally:
        server.stop()
    assert results == [Outcome.CONFIRMED, Outcome.CONFIRMED]
    assert server.connections == 2
    assert b"\r\nConnection: close" in server.heads[0]


def test_the_request_carries_the_protocol_headers_and_a_compact_body(fresh_client):
    server = IdleClosingServer(idle=5, reset=False)
    adapter = provider_http.HttpProviderAdapter(server.url + "/")
    try:
        adapter.execute(request("tenant:k1"))
        adapter.lookup(idempotency_key="tenant:k 1&x", timeout=1)
        adapter.lookup(idempotency_key="", provider_operation_id="op/1", timeout=1)
    finally:
        server.stop()
    post, get, get_by_id = (head.decode().split("\r\n") for head in server.heads)
    headers = {line.split(": ", 1)[0].lower(): line.split(": ", 1)[1] for line in post[1:]}
    assert post[0] == "POST /tickets/operations HTTP/1.1"
    assert headers["host"] == f"127.0.0.1:{server.port}"
    assert headers["content-type"] == "application/json"
    assert headers["idempotency-key"] == "tenant:k1"
    assert headers["x-effect-id"] == "eff_test"
    assert headers["user-agent"].startswith("effect-gateway/")
    assert server.bodies[0] == (
        b'{"type":"ticket.create","resource":{"type":"queue","id":"q"},'
        b'"payload":{"title":"t"},"payload_digest":"sha256:abc"}'
    )
    assert get[0] == "GET /tickets/operations?idempotency_key=tenant%3Ak+1%26x HTTP/1.1"
    assert get_by_id[0] == "GET /tickets/operations/op%2F1 HTTP/1.1"
    assert server.connections == 1


# -- https -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1, made here: (cert file, key file)."""
    return self_signed_certificate(tmp_path_factory.mktemp("tls"), common_name="provider.test")


@pytest.fixture
def tls_server(certificate):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certificate)
    server = IdleClosingServer(idle=5, reset=False, tls=context)
    yield server
    server.stop()


def test_https_keeps_its_connection_with_a_trusted_certificate(
    fresh_client, certificate, tls_server, settings
):
    settings.GATEWAY_PROVIDER_CA_BUNDLE = str(certificate[0])
    adapter = provider_http.HttpProviderAdapter(tls_server.url)
    first = adapter.execute(request("k1"))
    second = adapter.execute(request("k2"))
    assert (first.outcome, second.outcome) == (Outcome.CONFIRMED, Outcome.CONFIRMED), first
    assert tls_server.requests == ["k1", "k2"]
    assert tls_server.connections == 1


def test_https_to_an_untrusted_certificate_is_not_started(fresh_client, tls_server):
    result = provider_http.HttpProviderAdapter(tls_server.url).execute(request("k1"))
    assert result.outcome == Outcome.NOT_STARTED, result
    assert "CERTIFICATE_VERIFY_FAILED" in result.error
    assert tls_server.requests == []


def test_https_with_a_client_certificate_when_the_provider_requires_one(
    fresh_client, certificate, settings
):
    """mTLS: the provider trusts the client's certificate (here its own, self-signed)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certificate)
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(certificate[0])
    server = IdleClosingServer(idle=5, reset=False, tls=context)
    settings.GATEWAY_PROVIDER_CA_BUNDLE = str(certificate[0])
    try:
        settings.GATEWAY_PROVIDER_CLIENT_CERT = str(certificate[0])
        settings.GATEWAY_PROVIDER_CLIENT_KEY = str(certificate[1])
        provider_http._clients.clear()
        with_cert = provider_http.HttpProviderAdapter(server.url).execute(request("k1"))
        settings.GATEWAY_PROVIDER_CLIENT_CERT = settings.GATEWAY_PROVIDER_CLIENT_KEY = ""
        provider_http._clients.clear()
        without = provider_http.HttpProviderAdapter(server.url).execute(request("k2"))
    finally:
        server.stop()
    assert with_cert.outcome == Outcome.CONFIRMED, with_cert
    # TLS 1.3 refuses a missing certificate after the client's side of the handshake, when
    # the request is already written: never CONFIRMED, and the provider never read it.
    assert without.outcome in (Outcome.NOT_STARTED, Outcome.UNKNOWN), without
    assert "certificate" in without.error.lower(), without.error
    assert server.requests == ["k1"]


class RedirectingServer(IdleClosingServer):
    def answer(self, conn, body):
        conn.sendall(
            b"HTTP/1.1 303 See Other\r\nLocation: http://elsewhere.test/operations/op_9\r\n"
            b"Content-Length: 0\r\n\r\n"
        )
        return True


def test_a_redirect_is_not_followed_and_proves_nothing(fresh_client):
    server = RedirectingServer(idle=5, reset=False)
    try:
        result = provider_http.HttpProviderAdapter(server.url).execute(request("k1"))
    finally:
        server.stop()
    assert result.outcome == Outcome.UNKNOWN, result
    assert result.http_status == 303
    assert "http://elsewhere.test/operations/op_9" in result.reason
    assert "never followed" in result.reason
    assert server.requests == ["k1"]  # one request, to the configured URL only


class RateLimitingServer(IdleClosingServer):
    def answer(self, conn, body):
        answer = b'{"error": "rate_limited"}'
        conn.sendall(
            b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\n"
            + f"Content-Length: {len(answer)}\r\n\r\n".encode()
            + answer
        )
        return True


def test_a_429_is_unknown_with_the_wait_the_provider_asked_for(fresh_client):
    server = RateLimitingServer(idle=5, reset=False)
    try:
        result = provider_http.HttpProviderAdapter(server.url).execute(request("k1"))
    finally:
        server.stop()
    assert result.outcome == Outcome.UNKNOWN, result
    assert (result.http_status, result.retry_after, result.error) == (429, 7.0, "rate_limited")


def test_retry_after_reads_seconds_and_http_dates():
    now = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)
    assert provider_http.retry_after("120", now=now) == 120.0
    assert provider_http.retry_after("Thu, 01 Jan 2026 12:00:30 GMT", now=now) == 30.0
    assert provider_http.retry_after("Thu, 01 Jan 2026 11:00:00 GMT", now=now) == 0.0
    assert provider_http.retry_after("soon", now=now) is None
    assert provider_http.retry_after(None) is None


# -- proxies ----------------------------------------------------------------------------------


class TunnelRefusingProxy(IdleClosingServer):
    """A proxy that refuses every CONNECT: the provider behind it is never reached."""

    def _serve(self, conn):
        self.heads.append(conn.recv(65536))
        conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
        conn.close()


@pytest.fixture
def no_proxy_env(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_a_plain_provider_is_reached_through_http_proxy(fresh_client, no_proxy_env):
    proxy = IdleClosingServer(idle=5, reset=False)  # answers as the provider would
    no_proxy_env.setenv("HTTP_PROXY", f"http://user:secret@127.0.0.1:{proxy.port}")
    try:
        result = provider_http.HttpProviderAdapter("http://provider.test/tickets").execute(
            request("k1")
        )
    finally:
        proxy.stop()
    assert result.outcome == Outcome.CONFIRMED, result
    line, *headers = proxy.heads[0].decode().split("\r\n")
    assert line == "POST http://provider.test/tickets/operations HTTP/1.1"
    fields = dict(h.split(": ", 1) for h in headers if ": " in h)
    assert {k.lower(): v for k, v in fields.items()}["proxy-authorization"] == (
        "Basic dXNlcjpzZWNyZXQ="  # user:secret, from the proxy URL
    )


def test_no_proxy_sends_straight_to_the_provider(fresh_client, no_proxy_env):
    server = IdleClosingServer(idle=5, reset=False)
    no_proxy_env.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
    no_proxy_env.setenv("NO_PROXY", "127.0.0.1")
    try:
        result = provider_http.HttpProviderAdapter(server.url).execute(request("k1"))
    finally:
        server.stop()
    assert result.outcome == Outcome.CONFIRMED, result
    assert server.heads[0].startswith(b"POST /tickets/operations HTTP/1.1")


def test_a_proxy_that_refuses_the_tunnel_is_not_started(fresh_client, no_proxy_env):
    proxy = TunnelRefusingProxy(idle=5, reset=False)
    no_proxy_env.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.port}")
    try:
        result = provider_http.HttpProviderAdapter("https://provider.test/tickets").execute(
            request("k1")
        )
    finally:
        proxy.stop()
    assert result.outcome == Outcome.NOT_STARTED, result
    assert "403" in result.error
    assert proxy.heads[0].startswith(b"CONNECT provider.test:443 HTTP/1.1")


def test_a_name_that_does_not_resolve_is_not_started(fresh_client, monkeypatch):
    def no_such_name(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(urllib3.util.connection.socket, "getaddrinfo", no_such_name)
    result = provider_http.HttpProviderAdapter("http://provider.invalid/tickets").execute(
        request("k1")
    )
    assert result.outcome == Outcome.NOT_STARTED, result
    assert result.error.startswith("gaierror"), result.error


def test_a_configured_ca_bundle_replaces_the_system_store(fresh_client, settings, certificate):
    """With a bundle, only its CAs are trusted: a provider with a publicly trusted
    certificate would fail the handshake, so the bundle is the whole trust store."""
    settings.GATEWAY_PROVIDER_CA_BUNDLE = str(certificate[0])
    context = provider_http._client().tls()
    assert [ca["subject"] for ca in context.get_ca_certs()] == [
        ((("commonName", "provider.test"),),)
    ]
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
