"""The example contract module docs/examples/acme_effects, end to end with no change to the
product: loaded from GATEWAY_CONTRACT_MODULES, submitted through the API, sent by a real
worker through the example's adapter to a real server with an API of its own, whose
records are the oracle."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from django.db import connection

from gateway.contracts import get_contract
from gateway.models import Attempt, Effect
from gateway.services import worker_name
from tests.support.acme_tickets import AcmeTicketsServer
from tests.support.processes import Celery, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
MODULES = ["gateway.contracts.demo", "acme_effects"]
TICKET = {
    "type": "acme.ticket.create",
    "resource": {"type": "queue", "id": "ops"},
    "payload": {"summary": "Disk full on db-3", "severity": "low"},
}


@pytest.fixture
def acme(settings, monkeypatch):
    """The Acme Tickets server, and this process configured as a deployment would be."""
    server = AcmeTicketsServer().start()
    monkeypatch.syspath_prepend(str(EXAMPLES))
    settings.GATEWAY_PROVIDER_URLS = {**settings.GATEWAY_PROVIDER_URLS, "acme-tickets": server.url}
    settings.GATEWAY_CONTRACT_MODULES = MODULES
    yield server
    server.stop()


def status(effect_id: str) -> str:
    connection.close()  # read what the worker committed
    return Effect.objects.get(pk=effect_id).status


def test_an_example_effect_is_sent_once_by_a_real_worker_and_confirmed(
    acme, agent, queue, tmp_path
):
    types = agent.client.get("/api/v1/effect-types").json()["results"]
    listed = next(t for t in types if t["type"] == "acme.ticket.create")
    assert (listed["version"], listed["provider"]) == (1, "acme-tickets")
    assert listed["fingerprint"] == get_contract("acme.ticket.create").fingerprint

    response = agent.submit(TICKET, "acme-ticket-1")
    assert response.status_code == 201, response.content
    effect_id = response.json()["effect_id"]
    assert response.json()["contract_version"] == 1
    worker = Celery(
        "worker",
        queue,
        tmp_path / "worker.log",
        GATEWAY_CONTRACT_MODULES=json.dumps(MODULES),
        PYTHONPATH=os.pathsep.join([str(EXAMPLES), os.environ.get("PYTHONPATH", "")]),
    )
    try:
        wait_until(lambda: status(effect_id) == "CONFIRMED", timeout=90, what="CONFIRMED")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the worker's log:\n{worker.output()[-4000:]}") from None
    finally:
        worker.stop()
    assert "Traceback" not in worker.output()

    effect = Effect.objects.select_related("command").get(pk=effect_id)
    tickets = acme.acme.find(effect.command.provider_key)
    assert len(acme.acme.tickets) == 1 and len(tickets) == 1  # exactly one operation
    ticket = tickets[0]
    assert ticket["metadata"] == {"gateway_digest": effect.command.payload_digest}
    assert effect.provider_operation_id == str(ticket["number"])
    assert effect.command.contract_version == 1
    sender = Attempt.objects.get(effect_id=effect_id).worker
    assert sender and sender != worker_name()  # the worker process sent it, not this one

    shown = agent.client.get(f"/api/v1/effects/{effect_id}").json()
    assert shown["status"] == "CONFIRMED" and shown["contract_version"] == 1
    assert shown["receipt"]["provider_operation_id"] == str(ticket["number"])
    assert shown["receipt"]["provider_status"] == "open"
    assert shown["receipt"]["digest_matches"] is True


def test_the_example_adapter_speaks_the_outcome_vocabulary(acme):
    """What it answers when Acme is down (nothing sent), and what a lookup finds."""
    from gateway.choices import Outcome
    from gateway.providers.base import ExecuteRequest, LookupStatus
    from gateway.providers.registry import adapter_for

    contract = get_contract("acme.ticket.create")
    adapter = adapter_for(contract)

    def send(key: str, summary: str = "x"):
        payload = {"summary": summary, "severity": "low"}
        return adapter.execute(
            ExecuteRequest("eff_1", contract.type, key, {}, payload, f"sha256:{summary}", 2)
        )

    assert send("k1").outcome == Outcome.CONFIRMED
    assert send("k1").outcome == Outcome.CONFIRMED  # a replay: the same ticket
    reused = send("k1", summary="other")
    assert (reused.outcome, reused.mismatch) == (Outcome.UNKNOWN, True)
    assert len(acme.acme.tickets) == 1
    found = adapter.lookup(idempotency_key="k1", timeout=2)
    assert found.status == LookupStatus.FOUND and found.operation.payload_digest == "sha256:x"
    assert adapter.lookup(idempotency_key="k2", timeout=2).status == LookupStatus.NOT_FOUND
    acme.stop()
    down = send("k3")
    assert down.outcome == Outcome.NOT_STARTED, down
    assert adapter.lookup(idempotency_key="k1", timeout=2).status == LookupStatus.UNREACHABLE


def test_the_guide_shows_the_example_as_it_is_and_every_check():
    """docs/guides/effect-types.md includes the package verbatim and lists each check id."""
    from gateway.contracts import loading

    guide = (EXAMPLES.parent / "guides" / "effect-types.md").read_text()
    source = (EXAMPLES / "acme_effects" / "__init__.py").read_text()
    assert f"```python\n{source}```" in guide
    assert len(source.splitlines()) < 100
    ids = {v for k, v in vars(loading).items() if k.isupper() and str(v).startswith("gateway.")}
    assert ids and all(f"`{id}`" in guide for id in ids), ids
