"""The MCP server as a host starts it: ``python -m gateway.mcp_server`` on stdio, driven by the
real ``mcp`` client, calling a running gateway (live_server) and the sandbox provider."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import anyio.to_thread
import pytest
from django.utils import timezone
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError

from gateway.contracts import CONTRACTS
from gateway.models import ApiToken, Command

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
ORDER = {"type": "order", "id": "ord_881", "version": 17}
REFUND = {"amount": 500, "currency": "EUR", "reason": "duplicate charge"}


def server_params(gateway_url: str, token: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "gateway.mcp_server", "--gateway-url", gateway_url],
        env={"GATEWAY_TOKEN": token, "PYTHONPATH": str(ROOT)},
        cwd=str(ROOT),
    )


def run(session):
    """Run ``session(client)`` against a freshly spawned server; answer what it returns."""

    def go(gateway_url: str, token: str):
        async def main():
            async with Client(server_params(gateway_url, token), read_timeout_seconds=60) as c:
                return await session(c)

        return anyio.run(main)

    return go


def text(result) -> str:
    return "\n".join(block.text for block in result.content)


def test_tools_mirror_the_contracts(gateway_url, agent):
    async def session(client):
        return (await client.list_tools()).tools

    tools = {tool.name: tool for tool in run(session)(gateway_url, agent.token)}
    expected = {t.replace(".", "_") for t in CONTRACTS} | {
        "get_effect",
        "list_effects",
        "wait_for_effect",
    }
    assert set(tools) == expected
    for effect_type, contract in CONTRACTS.items():
        tool = tools[effect_type.replace(".", "_")]
        schema = tool.input_schema
        assert schema["required"] == ["idempotency_key", "resource", "payload"]
        payload_schema = {k: v for k, v in contract.payload_schema.items() if k != "$schema"}
        assert schema["properties"]["payload"] == payload_schema, effect_type
        assert schema["properties"]["resource"]["properties"]["type"]["const"] == (
            contract.resource_type
        )
        assert tool.annotations.idempotent_hint is True
        assert tool.annotations.read_only_hint is False
        destructive = contract.irreversible or contract.effect_class == "financial_write"
        assert tool.annotations.destructive_hint is destructive, effect_type
    assert tools["billing_refund_create"].annotations.destructive_hint is True
    assert tools["email_message_send"].annotations.destructive_hint is True
    assert tools["ticket_create"].annotations.destructive_hint is False
    assert tools["get_effect"].annotations.read_only_hint is True


def test_calling_a_tool_twice_with_one_key_is_one_provider_operation(
    gateway_url, agent, sandbox, eager_tasks
):
    args = {
        "idempotency_key": "billing.refund.create:ord_881:incident_120:v1",
        "resource": ORDER,
        "payload": REFUND,
        "intent": {"summary": "refund the duplicate charge"},
        "context": {"run_id": "run-7"},
    }

    async def session(client):
        first = await client.call_tool("billing_refund_create", args)
        second = await client.call_tool("billing_refund_create", args)
        waited = await client.call_tool(
            "wait_for_effect",
            {"effect_id": first.structured_content["effect_id"], "timeout_seconds": 10},
        )
        return first, second, waited

    first, second, waited = run(session)(gateway_url, agent.token)
    assert not first.is_error and not second.is_error, text(first) + text(second)
    assert first.structured_content["replayed"] is False
    assert second.structured_content["replayed"] is True
    assert "nothing new was sent" in text(second)
    assert second.structured_content["effect_id"] == first.structured_content["effect_id"]
    assert waited.structured_content["status"] == "CONFIRMED"
    assert len(sandbox.operations(type="billing.refund.create")) == 1
    command = Command.objects.get(pk=first.structured_content["effect_id"])
    assert command.context["runtime"] == "mcp"
    assert command.context["run_id"] == "run-7"
    assert command.context["agent"]  # the MCP client's name


def test_problems_the_model_can_fix_are_tool_errors_that_say_the_fix(
    gateway_url, agent, sandbox, eager_tasks
):
    key = "ticket.create:support:printer:v1"
    ticket = {
        "idempotency_key": key,
        "resource": {"type": "queue", "id": "support"},
        "payload": {"title": "Printer on fire", "priority": "P2"},
    }

    async def session(client):
        invalid = await client.call_tool(
            "ticket_create", {**ticket, "payload": {"title": "x", "priority": "P9"}}
        )
        ok = await client.call_tool("ticket_create", ticket)
        reused = await client.call_tool(
            "ticket_create", {**ticket, "payload": {"title": "Other", "priority": "P1"}}
        )
        missing = await client.call_tool("get_effect", {"effect_id": "eff_NOPE"})
        no_key = await client.call_tool(
            "ticket_create", {k: v for k, v in ticket.items() if k != "idempotency_key"}
        )
        return invalid, ok, reused, missing, no_key

    invalid, ok, reused, missing, no_key = run(session)(gateway_url, agent.token)
    assert invalid.is_error and "payload.priority" in text(invalid)
    assert "same idempotency_key" in text(invalid)
    assert not ok.is_error
    assert reused.is_error and "identical payload" in text(reused)
    assert "new idempotency_key" in text(reused)
    assert missing.is_error and "No effect eff_NOPE" in text(missing)
    assert no_key.is_error and "idempotency_key" in text(no_key)
    assert Command.objects.count() == 1


def test_a_refused_token_is_a_protocol_error(gateway_url, agent):
    def revoke():
        ApiToken.objects.filter(principal=agent.principal).update(revoked_at=timezone.now())

    async def session(client):
        await client.list_tools()
        await anyio.to_thread.run_sync(revoke)
        with pytest.raises(MCPError) as caught:
            await client.call_tool("get_effect", {"effect_id": "eff_X"})
        return caught.value

    error = run(session)(gateway_url, agent.token)
    assert "refused this MCP server's token" in error.message


def test_the_server_does_not_start_without_a_valid_token(gateway_url):
    env = {**os.environ, "GATEWAY_TOKEN": "egw_not-a-token", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "gateway.mcp_server", "--gateway-url", gateway_url],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2
    assert "effect-types" in result.stderr and "not valid" in result.stderr


def test_list_effects_filters_by_run(gateway_url, agent, sandbox, eager_tasks):
    async def session(client):
        for run_id in ("run-a", "run-b"):
            await client.call_tool(
                "ticket_create",
                {
                    "idempotency_key": f"ticket.create:support:{run_id}:v1",
                    "resource": {"type": "queue", "id": "support"},
                    "payload": {"title": run_id, "priority": "P3"},
                    "context": {"run_id": run_id},
                },
            )
        return await client.call_tool("list_effects", {"context": {"run_id": "run-b"}})

    listed = run(session)(gateway_url, agent.token)
    results = listed.structured_content["results"]
    assert [e["context"]["run_id"] for e in results] == ["run-b"]
    assert json.loads(json.dumps(results))[0]["type"] == "ticket.create"
