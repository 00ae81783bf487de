"""The bench's two loads (tests.benchmarks.bench.client, tests.benchmarks.bench.floor) against
real servers: a floor that executed an effect twice, or a client that lost submissions, would
make the figures lie."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
import pytest
from django.conf import settings

from tests.benchmarks.bench import client as bench_client
from tests.benchmarks.bench import floor as bench_floor
from tests.benchmarks.bench.run import libpq_dsn
from tests.benchmarks.bench.stats import by_node


def _dsn() -> str:
    return libpq_dsn(settings.DATABASES["default"])


@pytest.mark.parametrize("client", ["stdlib", "httpx"])
def test_the_floor_executes_every_effect_once_and_records_it(
    client, sandbox_server, transactional_db
):
    prefix = f"floor-test:{uuid.uuid4().hex[:8]}"
    result = bench_floor.run(
        dsn=_dsn(),
        pool_size=2,
        url=sandbox_server.base_url("tickets"),
        concurrency=3,
        count=12,
        prefix=prefix,
        client=client,
    )
    try:
        executed = [
            op["idempotency_key"]
            for op in sandbox_server.provider.operations(provider="tickets")
            if op["idempotency_key"].startswith(prefix + ":")
            and ":warm:" not in op["idempotency_key"]
        ]
        with psycopg.connect(_dsn(), autocommit=True) as conn:
            rows = conn.execute(
                "SELECT key, status, operation_id FROM bench_floor WHERE key LIKE %s "
                "AND key NOT LIKE %s",
                (prefix + ":%", prefix + ":warm:%"),
            ).fetchall()
    finally:
        with psycopg.connect(_dsn(), autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS bench_floor")
    assert result["n"] == 12 and result["rate"] > 0
    assert sorted(executed) == sorted(f"{prefix}:{i}" for i in range(12))  # once each
    assert {status for _, status, _ in rows} == {"CONFIRMED"}
    assert len(rows) == 12 and all(op for _, _, op in rows)


def _send_json(handler: BaseHTTPRequestHandler, status: int, document: dict) -> None:
    """Answer ``document`` as JSON on a kept-alive connection."""
    body = json.dumps(document).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


class _ClosingHandler(BaseHTTPRequestHandler):
    """Answers as HTTP/1.1 (so the client keeps the connection) and then closes it anyway,
    as a server does with a kept-alive connection it timed out."""

    protocol_version = "HTTP/1.1"
    seen: list[str] = []

    def do_POST(self):
        length = int(self.headers["Content-Length"])
        self.seen.append(json.loads(self.rfile.read(length))["n"])
        _send_json(self, 201, {"effect_id": f"eff_{len(self.seen)}"})
        self.close_connection = True  # without saying so in a header

    def log_message(self, *args):
        pass


def test_the_client_sends_again_on_a_connection_the_server_closed():
    _ClosingHandler.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ClosingHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    conn = bench_client.Connection(f"http://127.0.0.1:{server.server_port}")
    try:
        answers = [
            conn.request("POST", "/api/v1/commands", json.dumps({"n": n}).encode(), {})
            for n in range(3)
        ]
    finally:
        conn.close()
        server.shutdown()
        server.server_close()
    assert [status for status, _ in answers] == [201, 201, 201]
    assert _ClosingHandler.seen == [0, 1, 2]  # each request reached the server once


class _SlowHandler(BaseHTTPRequestHandler):
    """A kept-alive server that takes ``delay`` seconds to answer each submission and notes
    when each one arrived."""

    protocol_version = "HTTP/1.1"
    delay = 0.0
    arrivals: list[float] = []

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.arrivals.append(time.perf_counter())
        time.sleep(self.delay)
        _send_json(self, 201, {"effect_id": f"eff_{len(self.arrivals)}"})

    def log_message(self, *args):
        pass


def _paced(rate: float, count: int, concurrency: int, delay: float) -> tuple[dict, list[float]]:
    _SlowHandler.delay, _SlowHandler.arrivals = delay, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = bench_client.run(
            bases=[f"http://127.0.0.1:{server.server_port}"],
            tokens=["t"],
            body={},
            prefix="paced",
            concurrency=concurrency,
            count=count,
            rate=rate,
        )
    finally:
        server.shutdown()
        server.server_close()
    return result, sorted(_SlowHandler.arrivals)


def test_the_paced_client_offers_submissions_at_its_rate():
    result, arrivals = _paced(rate=50, count=25, concurrency=4, delay=0.001)
    assert len(result["ids"]) == 25 and result["late"] == 0
    # 25 submissions due every 20 ms: the last arrives about 480 ms after the first, where a
    # closed loop of four threads would have sent them all within a few milliseconds.
    assert 0.4 < arrivals[-1] - arrivals[0] < 1.0
    assert max(result["submit"]) < 0.2


def test_the_paced_client_counts_latency_from_when_a_submission_was_due():
    # One thread, a server that takes 50 ms, submissions due every 10 ms: each waits behind
    # the ones before it, and its latency says so (no coordinated omission).
    result, _ = _paced(rate=100, count=10, concurrency=1, delay=0.05)
    assert result["late"] >= 8
    assert max(result["submit"]) > 0.4  # the tenth was due at 90 ms and answered near 500 ms


def test_the_paced_client_says_when_each_submission_was_sent_and_answered():
    before = time.time()
    result, _ = _paced(rate=50, count=10, concurrency=2, delay=0.01)
    spans = sorted(result["spans"])
    assert len(spans) == 10
    # On the wall clock, so that the benchmark can set them beside what else ran at the time.
    assert before < spans[0][0] < spans[-1][1] < time.time()
    # (A wall clock near 1.8e9 s carries about a microsecond less precision than the latencies.)
    latencies = sorted(end - start for start, end in spans)
    assert latencies == pytest.approx(sorted(result["submit"]), abs=1e-5)
    # Due every 20 ms: the tenth about 180 ms after the first.
    assert 0.15 < spans[-1][0] - spans[0][0] < 0.5


@pytest.mark.django_db(transaction=True)
def test_the_effect_loop_waits_until_the_ledger_says_confirmed(sandbox, agent, ticket_body):
    from django.db import connection

    from gateway import services
    from gateway.choices import EffectStatus
    from gateway.models import Effect

    response = agent.submit(ticket_body, "oracle-1")
    assert response.status_code == 201
    effect_id = response.json()["effect_id"]
    dispatching: list[float] = []

    def dispatch_later() -> None:
        time.sleep(0.3)
        try:
            dispatching.append(time.monotonic())
            services.effect_dispatch(effect_id=effect_id, worker="test")  # to CONFIRMED
        finally:
            connection.close()

    oracle = bench_client.Oracle(_dsn(), interval=0.005).start()
    try:
        threading.Thread(target=dispatch_later).start()
        assert oracle.wait(effect_id, timeout=10) is True
        # Not before the worker's record committed: PREPARED and DISPATCHING are not the end.
        assert dispatching and time.monotonic() > dispatching[0]
        assert Effect.objects.get(pk=effect_id).status == EffectStatus.CONFIRMED
        assert oracle.polls > 1
        # An effect that is never confirmed: the wait gives up at its timeout.
        other = agent.submit({**ticket_body, "payload": {"title": "never", "priority": "P4"}}, "o2")
        assert oracle.wait(other.json()["effect_id"], timeout=0.3) is False
    finally:
        oracle.stop()


class _EffectHandler(BaseHTTPRequestHandler):
    """A kept-alive server that answers an effect's GETs from a script of statuses, noting
    each path it was asked."""

    protocol_version = "HTTP/1.1"
    script: list[tuple[int, str]] = []
    paths: list[str] = []

    def do_GET(self):
        self.paths.append(self.path)
        status, effect_status = self.script.pop(0)
        _send_json(self, status, {"effect_id": "eff_1", "status": effect_status})

    def log_message(self, *args):
        pass


UNTIL = "&until=" + bench_client.SETTLED  # what the clients send by default


@contextmanager
def _scripted_effect(script: list[tuple[int, str]]) -> Iterator[bench_client.Connection]:
    """A connection to an ``_EffectHandler`` server answering ``script``."""
    _EffectHandler.paths = []
    _EffectHandler.script = script
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EffectHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    conn = bench_client.Connection(f"http://127.0.0.1:{server.server_port}")
    try:
        yield conn
    finally:
        conn.close()
        server.shutdown()
        server.server_close()


def test_the_api_loop_waits_as_an_agent_does_naming_the_status_it_saw():
    script = [
        (200, "PREPARED"),
        (200, "DISPATCHING"),
        (429, "DISPATCHING"),  # too many long polls open: again after a pause
        (200, "CONFIRMED"),
    ]
    with _scripted_effect(script) as conn:
        settled = bench_client.wait_through_api(conn, "t", "eff_1")
    assert settled == "CONFIRMED"
    assert _EffectHandler.paths == [
        "/api/v1/effects/eff_1",
        "/api/v1/effects/eff_1?wait=5&seen=PREPARED" + UNTIL,
        "/api/v1/effects/eff_1?wait=5&seen=DISPATCHING" + UNTIL,
        "/api/v1/effects/eff_1?wait=5&seen=DISPATCHING" + UNTIL,
    ]


def test_the_api_loop_starts_from_the_submissions_answer_as_the_client_does():
    # GatewayClient.wait(effect) starts from the status submit answered: no first look.
    with _scripted_effect([(200, "DISPATCHING"), (200, "CONFIRMED")]) as conn:
        settled = bench_client.wait_through_api(conn, "t", "eff_1", "PREPARED")
        assert bench_client.wait_through_api(conn, "t", "eff_2", "CONFIRMED") == "CONFIRMED"
    assert settled == "CONFIRMED"
    assert _EffectHandler.paths == [
        "/api/v1/effects/eff_1?wait=5&seen=PREPARED" + UNTIL,
        "/api/v1/effects/eff_1?wait=5&seen=DISPATCHING" + UNTIL,
    ]


def test_the_api_loop_knows_the_gateways_open_statuses():
    from gateway.choices import SETTLED, EffectStatus

    assert set(EffectStatus.values) - SETTLED == bench_client.OPEN
    assert bench_client.SETTLED.split(",") == sorted(SETTLED)


# The oracle's thread dies of the refused connection and prints it (to the client's stderr).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_an_oracle_that_cannot_read_the_ledger_fails_its_waits_at_once():
    # Its connection refused: a wait must say so, not sit out its timeout for every effect.
    oracle = bench_client.Oracle("host=127.0.0.1 port=9 dbname=none connect_timeout=1").start()
    try:
        with pytest.raises(RuntimeError, match="oracle stopped"):
            oracle.wait("eff_1", timeout=30)
    finally:
        oracle.stop()


def test_each_web_node_gets_its_own_latencies():
    class Quick(_SlowHandler):
        delay, arrivals = 0.0, []

    class Slow(_SlowHandler):
        delay, arrivals = 0.25, []

    servers = [ThreadingHTTPServer(("127.0.0.1", 0), handler) for handler in (Quick, Slow)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = bench_client.run(
            bases=[f"http://127.0.0.1:{server.server_port}" for server in servers],
            tokens=["t"],
            body={},
            prefix="nodes",
            concurrency=2,
            count=8,
        )
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
    split = by_node(result["submit"], result["nodes"])
    assert sorted(split) == [0, 1] and len(split[0]) == len(split[1]) == 4
    assert max(split[0]) < 0.25 <= min(split[1])  # node 1 is the slow one, every time
