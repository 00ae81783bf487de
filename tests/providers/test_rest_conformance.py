"""The declared REST adapter through the conformance kit, against the Zendesk-style tickets
server of tests/providers/rest_servers.py: the oracle is the server's own tickets, counted by
the idempotency key it stored. The server cannot stay "processing" or forget a key on demand:
those cases SKIP; the faults after the request left come from the kit's fault proxy."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.providers.conformance import RecordsDriver, Sample, Subject
from gateway.providers.conformance.pytest_plugin import assert_conformant
from gateway.providers.rest import RestProviderAdapter
from gateway.providers.rest_spec import RestSpec
from tests.providers.rest_servers import TicketsServer

pytest_plugins = ["gateway.providers.conformance.pytest_plugin"]

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "guides" / "providers" / "examples"
TOKEN = "test-token"
SAMPLE = Sample(
    "ticket.create",
    {"type": "queue", "id": "support"},
    {"title": "Printer on fire", "priority": "P2", "body": "Smoke."},
    {"title": "Printer on fire", "priority": "P3", "body": "Smoke."},
)


@pytest.fixture(scope="module")
def conformance_subject():
    server = TicketsServer(token=TOKEN).start()
    spec = RestSpec.from_file(EXAMPLES / "tickets.json")

    def operations(key: str) -> int:
        with server.lock:
            return 1 if key in server.keys else 0

    try:
        yield Subject(
            adapter=lambda base_url: RestProviderAdapter(
                spec, base_url, headers={"Authorization": f"Bearer {TOKEN}"}
            ),
            base_url=server.url,
            driver=RecordsDriver(operations),
            sample=SAMPLE,
            timeout=2.0,
        )
    finally:
        server.stop()


def test_the_declared_rest_adapter_passes(conformance_report):
    assert_conformant(conformance_report)
