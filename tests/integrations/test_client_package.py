"""The standalone ``effect-gateway-client`` package (clients/python): the
async client against a live gateway, the typed models checked against the OpenAPI schema,
no Django, and the public ``gateway.*`` import paths naming the same objects."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys

import anyio
import pytest
from effect_gateway_client import (
    AsyncGatewayClient,
    Effect,
    EffectType,
    GatewayClient,
    IdempotencyKeyMismatch,
    NotFound,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_async_client_submits_replays_waits_and_raises_problems(
    gateway_url, agent, ticket_body, sandbox, eager_tasks
):
    async def main():
        async with AsyncGatewayClient(gateway_url, agent.token, backoff=0.01) as gateway:
            args = (ticket_body["type"], ticket_body["resource"], ticket_body["payload"])
            first = await gateway.submit(*args, key="ticket.create:support:async:v1")
            again = await gateway.submit(*args, key="ticket.create:support:async:v1")
            done = await gateway.wait(first.effect_id, timeout=10)
            events = await gateway.events(first.effect_id)
            types = await gateway.effect_types(permitted=True)
            listed = await gateway.list(type="ticket.create")
            with pytest.raises(IdempotencyKeyMismatch):
                await gateway.submit(
                    ticket_body["type"],
                    ticket_body["resource"],
                    {**ticket_body["payload"], "title": "another"},
                    key="ticket.create:support:async:v1",
                )
            with pytest.raises(NotFound):
                await gateway.get("eff_nope")
            return first, again, done, events, types, listed

    first, again, done, events, types, listed = anyio.run(main)
    assert (first.replayed, again.replayed) == (False, True)
    assert again.effect_id == first.effect_id
    assert done.status == "CONFIRMED"
    assert [e["to_status"] for e in events][-1] == "CONFIRMED"
    assert "ticket.create" in {t.type for t in types}
    assert [e.effect_id for e in listed.results] == [first.effect_id]
    assert len(sandbox.operations(type="ticket.create")) == 1


def test_the_async_client_has_every_call_of_the_sync_client_with_the_same_parameters():
    def calls(cls) -> dict[str, inspect.Signature]:
        return {
            name: inspect.signature(member)
            for name, member in inspect.getmembers(cls, inspect.isfunction)
            if not name.startswith("_") and name not in {"close", "aclose"}
        }

    sync, asynchronous = calls(GatewayClient), calls(AsyncGatewayClient)
    assert sorted(sync) == sorted(asynchronous)
    for name, signature in sync.items():
        assert list(signature.parameters) == list(asynchronous[name].parameters), name
        assert inspect.iscoroutinefunction(getattr(AsyncGatewayClient, name)), name


def test_the_async_client_compensates_once(gateway_url, agent, approver, sandbox, eager_tasks):
    order = {"type": "order", "id": "ord_881", "version": 17}
    charge = {"amount": 600_000, "currency": "EUR", "customer_id": "cus_42"}

    async def main():
        async with (
            AsyncGatewayClient(gateway_url, agent.token, backoff=0.01) as gateway,
            AsyncGatewayClient(gateway_url, approver.token, backoff=0.01) as human,
        ):
            effect = await gateway.submit(
                "billing.charge.create", order, charge, key="billing.charge.create:ord_881:a:v1"
            )
            await human.approve(effect.effect_id, effect.payload_digest)
            await gateway.wait(effect.effect_id, timeout=10)
            first = await gateway.compensate(effect.effect_id, "charged twice")
            again = await gateway.compensate(effect.effect_id, "charged twice")
            return first, again, await gateway.get(effect.effect_id)

    first, again, original = anyio.run(main)
    assert first.type == "billing.refund.create" and first.replayed is False
    # The refund of 6,000.00 waits for its own approval; asking again replays it.
    assert again.effect_id == first.effect_id and again.replayed is True
    assert original.status == "COMPENSATING"
    assert sandbox.operations(type="billing.refund.create") == []


def test_the_typed_models_match_the_openapi_schema(client):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    components = schema["components"]["schemas"]
    for model, component in ((Effect, "Effect"), (EffectType, "EffectType")):
        fields = {f.name for f in dataclasses.fields(model)} - {"raw", "replayed"}
        properties = set(components[component]["properties"])
        assert fields <= properties, (component, sorted(fields - properties))
        required = set(components[component].get("required", []))
        # What the client reads with data[...] (not .get) must be required by the schema.
        assert {"type"} <= required


def test_the_client_and_the_mcp_server_import_without_django(tmp_path):
    code = (
        "import sys, effect_gateway_client, effect_gateway_client.mcp_server.server, "
        "effect_gateway_client.aio; "
        "assert not any(m == 'django' or m.startswith('django.') for m in sys.modules), "
        "'django imported'; print('ok')"
    )
    source = str(__import__("pathlib").Path(effect_gateway_client_path()).parent)
    result = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {source!r}); {code}"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.stdout.strip() == "ok", result.stderr


def effect_gateway_client_path() -> str:
    import effect_gateway_client

    return str(__import__("pathlib").Path(effect_gateway_client.__file__).parent)


def test_the_public_gateway_paths_name_the_same_objects():
    import effect_gateway_client
    import effect_gateway_client.langgraph
    import effect_gateway_client.mcp_server.server
    import effect_gateway_client.models

    import gateway.client
    import gateway.client.models
    import gateway.langgraph_tools
    import gateway.mcp_server
    import gateway.mcp_server.server

    assert gateway.client.GatewayClient is effect_gateway_client.GatewayClient
    assert gateway.client.models is effect_gateway_client.models
    assert gateway.langgraph_tools is effect_gateway_client.langgraph
    assert gateway.mcp_server.server is effect_gateway_client.mcp_server.server
    assert gateway.mcp_server.build_server is effect_gateway_client.mcp_server.build_server
