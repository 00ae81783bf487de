"""Fixtures for the agent-runtime integrations: a gateway on a real port (pytest-django's
``live_server``), clients for the personas, and a webhook receiver on loopback."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gateway.client import GatewayClient


@pytest.fixture
def gateway_url(live_server) -> str:
    return live_server.url


@pytest.fixture
def connect(gateway_url) -> Iterator[Callable[..., GatewayClient]]:
    """``connect(persona)``: a GatewayClient with that persona's token."""
    clients: list[GatewayClient] = []

    def make(persona, **options) -> GatewayClient:
        options.setdefault("backoff", 0.01)
        client = GatewayClient(gateway_url, persona.token, **options)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@dataclass
class Delivery:
    """One request the receiver got."""

    headers: dict[str, str]
    body: bytes

    @property
    def event(self) -> dict:
        return json.loads(self.body)


@dataclass
class Receiver:
    """A webhook receiver: records every POST, answers the next scripted status (then 200)."""

    url: str
    deliveries: list[Delivery] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    arrived: queue.Queue = field(default_factory=queue.Queue)

    def answer(self, *statuses: int) -> None:
        self.statuses.extend(statuses)

    def wait_for(self, count: int, timeout: float = 10.0) -> list[Delivery]:
        deadline = time.monotonic() + timeout
        while len(self.deliveries) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(self.deliveries) >= count, (
            f"the receiver got {len(self.deliveries)} deliveries, expected {count}"
        )
        return list(self.deliveries)

    def of_type(self, event_type: str) -> list[Delivery]:
        return [d for d in self.deliveries if d.event["type"] == event_type]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with lock:
                status = state.statuses.pop(0) if state.statuses else 200
                delivery = Delivery({k.lower(): v for k, v in self.headers.items()}, body)
                state.deliveries.append(delivery)
            state.arrived.put(delivery)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state = Receiver(url=f"http://127.0.0.1:{server.server_address[1]}/hooks/gateway")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


@pytest.fixture
def webhook_endpoint(operator, receiver) -> tuple[str, str]:
    """An endpoint of tenant acme, registered through the API: (id, secret)."""
    response = operator.client.post(
        "/api/v1/webhook-endpoints", {"url": receiver.url}, format="json"
    )
    assert response.status_code == 201, response.content
    body = response.json()
    return body["id"], body["secret"]
