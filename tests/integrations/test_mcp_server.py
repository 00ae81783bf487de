"""The MCP server as a host starts it: ``python -m gateway.mcp_server`` on stdio (and
``effect-gateway-mcp`` over streamable HTTP with bearer tokens), driven by the real ``mcp`` 1.x
client, calling a running gateway (live_server) and the sandbox provider."""

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
from effect_gateway_client.mcp_server.schemas import lenient, portable
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import McpError

from gateway.contracts import CONTRACTS
from gateway.models import ApiToken, Command
from tests.support.mcp import streamable_http_mcp
from tests.support.strict_schemas import strict_mode_problems

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
            params = server_params(gateway_url, token)
            async with stdio_client(params) as (read, write), ClientSession(read, write) as c:
                await c.initialize()
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
        schema = tool.inputSchema
        # Strict mode lists every field; the ones an agent may leave out take null.
        assert schema["required"] == [
            "idempotency_key",
            "resource",
            "payload",
            "intent",
            "context",
        ]
        assert lenient(schema)["required"] == ["idempotency_key", "resource", "payload"]
        payload_schema = {k: v for k, v in contract.payload_schema.items() if k != "$schema"}
        assert schema["properties"]["payload"] == portable(payload_schema), effect_type
        assert lenient(schema["properties"]["payload"])["required"] == sorted(
            payload_schema.get("required", []), key=list(payload_schema["properties"]).index
        ), effect_type
        assert schema["properties"]["resource"]["properties"]["type"]["const"] == (
            contract.resource_type
        )
        assert tool.annotations.idempotentHint is True
        assert tool.annotations.readOnlyHint is False
    # destructiveHint false promises additive updates only (MCP spec): creating a ticket,
    # a reservation, a shipment. Money, mail, releases, cancelling, closing: destructive.
    destructive = {name for name, tool in tools.items() if tool.annotations.destructiveHint}
    assert destructive == {
        "billing_charge_create",
        "billing_refund_create",
        "email_message_send",
        "inventory_reservation_release",
        "shipment_cancel",
        "deployment_release_promote",
        "deployment_release_rollback",
        "deployment_release_verify",
        "ticket_close",
    }
    assert tools["get_effect"].annotations.readOnlyHint is True
    # Optional fields take null, so that OpenAI's strict mode need not invent values.
    null = {"type": "null"}
    assert null in tools["ticket_create"].inputSchema["properties"]["context"]["anyOf"]
    assert null in tools["wait_for_effect"].inputSchema["properties"]["until"]["anyOf"]


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
            {"effect_id": first.structuredContent["effect_id"], "timeout_seconds": 10},
        )
        return first, second, waited

    first, second, waited = run(session)(gateway_url, agent.token)
    assert not first.isError and not second.isError, text(first) + text(second)
    assert first.structuredContent["replayed"] is False
    assert second.structuredContent["replayed"] is True
    assert "nothing new was sent" in second.structuredContent["next_step"]
    # Each text once: the text block is the structured JSON, guidance included.
    assert [json.loads(block.text) for block in second.content] == [second.structuredContent]
    assert second.structuredContent["effect_id"] == first.structuredContent["effect_id"]
    assert waited.structuredContent["status"] == "CONFIRMED"
    assert len(sandbox.operations(type="billing.refund.create")) == 1
    command = Command.objects.get(pk=first.structuredContent["effect_id"])
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
    assert invalid.isError and "payload/priority" in text(invalid)
    assert "same idempotency_key" in invalid.structuredContent["next_step"]
    assert not ok.isError
    assert reused.isError and "identical payload" in reused.structuredContent["next_step"]
    assert "new idempotency_key" in reused.structuredContent["next_step"]
    assert missing.isError and "No effect eff_NOPE" in missing.structuredContent["error"]
    assert no_key.isError
    assert "missing required field 'idempotency_key'" in no_key.structuredContent["error"]
    assert Command.objects.count() == 1


def test_a_refused_token_is_a_protocol_error(gateway_url, agent):
    def revoke():
        ApiToken.objects.filter(principal=agent.principal).update(revoked_at=timezone.now())

    async def session(client):
        await client.list_tools()
        await anyio.to_thread.run_sync(revoke)
        with pytest.raises(McpError) as caught:
            await client.call_tool("get_effect", {"effect_id": "eff_X"})
        return caught.value

    error = run(session)(gateway_url, agent.token)
    assert "refused this token" in error.error.message


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
    results = listed.structuredContent["results"]
    assert [e["context"]["run_id"] for e in results] == ["run-b"]
    assert json.loads(json.dumps(results))[0]["type"] == "ticket.create"


def test_arguments_are_checked_against_the_input_schema_with_a_fix(gateway_url, agent, sandbox):
    """A stringified payload, a wrong type, an unknown field: the model is told the fix, and
    nothing reaches the gateway."""
    base = {
        "idempotency_key": "ticket.create:support:schema:v1",
        "resource": {"type": "queue", "id": "support"},
    }
    payload = {"title": "Printer on fire", "priority": "P2"}

    async def session(client):
        stringified = await client.call_tool(
            "ticket_create", {**base, "payload": json.dumps(payload)}
        )
        wrong_resource = await client.call_tool(
            "ticket_create", {**base, "resource": {"type": "order", "id": "x"}, "payload": payload}
        )
        extra = await client.call_tool("ticket_create", {**base, "payload": payload, "amount": 1})
        nulls = await client.call_tool(
            "ticket_create", {**base, "payload": payload, "intent": None, "context": None}
        )
        return stringified, wrong_resource, extra, nulls

    stringified, wrong_resource, extra, nulls = run(session)(gateway_url, agent.token)
    assert stringified.isError
    error = stringified.structuredContent["error"]
    assert "payload: got a string" in error and "not a string holding JSON" in error
    assert "dictionary update sequence" not in error
    assert wrong_resource.isError and "resource/type: must be 'queue'" in text(wrong_resource)
    assert extra.isError and "allowed fields" in text(extra)
    assert not nulls.isError, text(nulls)  # null = not given
    assert Command.objects.count() == 1


def test_only_the_tools_of_the_tokens_grants_are_listed(gateway_url, db):
    import io

    from django.core.management import call_command

    out = io.StringIO()
    call_command(
        "issue_token",
        tenant="acme",
        principal="ticket-bot",
        role="agent",
        types="ticket.*",
        stdout=out,
    )
    token = out.getvalue().strip().splitlines()[-1]

    async def session(client):
        tools = {t.name for t in (await client.list_tools()).tools}
        refused = await client.call_tool(
            "billing_refund_create",
            {"idempotency_key": "k:1", "resource": ORDER, "payload": REFUND},
        )
        return tools, refused

    tools, refused = run(session)(gateway_url, token)
    assert tools == {
        "ticket_create",
        "ticket_close",
        "get_effect",
        "list_effects",
        "wait_for_effect",
    }
    assert refused.isError and "no tool 'billing_refund_create'" in text(refused)


def test_an_approval_needing_command_tells_the_model_to_wait(
    gateway_url, agent, approver, sandbox, eager_tasks
):
    """Claude Code passes the model only structuredContent: the guidance must be in it."""
    args = {
        "idempotency_key": "billing.refund.create:ord_881:big:v1",
        "resource": ORDER,
        "payload": {"amount": 15_000, "currency": "EUR", "reason": "duplicate charge"},
    }

    async def session(client):
        submitted = await client.call_tool("billing_refund_create", args)
        effect_id = submitted.structuredContent["effect_id"]
        waited = await client.call_tool(
            "wait_for_effect", {"effect_id": effect_id, "timeout_seconds": 0.5}
        )
        return submitted, waited

    submitted, waited = run(session)(gateway_url, agent.token)
    data = submitted.structuredContent
    assert data["status"] == "AWAITING_APPROVAL"
    assert "wait_for_effect" in data["next_step"] and data["effect_id"] in data["next_step"]
    assert "not done yet" in data["next_step"]
    assert data["approval_url"] == f"{gateway_url}/effects/{data['effect_id']}"
    assert waited.structuredContent["status"] == "AWAITING_APPROVAL"
    assert "wait_for_effect" in waited.structuredContent["next_step"]
    assert sandbox.operations(type="billing.refund.create") == []


@pytest.fixture
def http_mcp(gateway_url):
    """``effect-gateway-mcp --transport streamable-http`` on a free port, without a token."""
    with streamable_http_mcp(gateway_url) as url:
        yield url


def test_remote_mcp_over_streamable_http_with_bearer_tokens(http_mcp, agent, sandbox, eager_tasks):
    import httpx
    from mcp.client.streamable_http import streamable_http_client

    # No token, or a token the gateway refuses: 401 before any MCP session.
    assert httpx.post(http_mcp, json={}, trust_env=False).status_code == 401
    refused = httpx.post(
        http_mcp, json={}, headers={"Authorization": "Bearer egw_nope"}, trust_env=False
    )
    assert refused.status_code == 401 and "refused" in refused.text

    async def main():
        headers = {"Authorization": f"Bearer {agent.token}"}
        http = httpx.AsyncClient(headers=headers, trust_env=False, timeout=30)
        async with (
            http,
            streamable_http_client(http_mcp, http_client=http) as (read, write, _),
            ClientSession(read, write) as client,
        ):
            await client.initialize()
            tools = {t.name for t in (await client.list_tools()).tools}
            result = await client.call_tool(
                "ticket_create",
                {
                    "idempotency_key": "ticket.create:support:http:v1",
                    "resource": {"type": "queue", "id": "support"},
                    "payload": {"title": "over http", "priority": "P3"},
                },
            )
            return tools, result

    tools, result = anyio.run(main)
    assert "ticket_create" in tools
    assert not result.isError, text(result)
    command = Command.objects.get(pk=result.structuredContent["effect_id"])
    assert command.requested_by_id == agent.principal.pk  # acted with the caller's token
    assert len(sandbox.operations(type="ticket.create")) == 1


def test_the_http_server_refuses_other_hosts_and_origins(http_mcp):
    """DNS rebinding: a page of another site, or a name rebound to this port, gets nothing;
    the server's own names pass the guard (and meet the bearer check: 401)."""
    import httpx

    port = http_mcp.split(":")[2].split("/")[0]

    def post(**headers: str) -> httpx.Response:
        return httpx.post(http_mcp, json={}, headers=headers, trust_env=False)

    assert post(Host=f"evil.example:{port}").status_code == 421
    assert post(Host=f"localhost:{port}").status_code == 401
    assert post(Origin="http://evil.example").status_code == 403
    assert post(Origin=f"http://127.0.0.1:{port}").status_code == 401
    assert post().status_code == 401  # no Origin: not a browser, the token decides


def test_without_the_mcp_extra_the_script_says_what_to_install():
    blocked = (
        "import sys; sys.modules['mcp'] = None; "
        "from effect_gateway_client.mcp_cli import entry; entry()"
    )
    result = subprocess.run(
        [sys.executable, "-c", blocked], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "pip install 'effect-gateway-client[mcp]'" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_tool_says_irreversible_once(gateway_url, agent):
    from effect_gateway_client.mcp_server.server import GatewayTools, submit_tool

    tools = GatewayTools(gateway_url, token=agent.token)
    try:
        catalogue = {t.type: t for t in tools.client(agent.token).effect_types()}
    finally:
        tools.close()
    for effect_type in catalogue.values():
        said = submit_tool(effect_type).description.lower().count("irreversible")
        assert said == (1 if effect_type.irreversible else 0), effect_type.type
    assert catalogue["email.message.send"].irreversible


def test_every_tool_schema_passes_strict_mode_and_portability_rules(gateway_url, agent):
    from effect_gateway_client.mcp_server.server import GatewayTools

    tools = GatewayTools(gateway_url, token=agent.token)
    try:
        listed, _ = tools.catalogue(agent.token)
    finally:
        tools.close()
    assert len(listed) > 10
    problems = [p for tool in listed for p in strict_mode_problems(tool.inputSchema, tool.name)]
    assert problems == []


def test_an_optional_payload_field_sent_as_null_is_the_command_without_it(
    gateway_url, agent, sandbox, eager_tasks
):
    import jsonschema
    from effect_gateway_client.mcp_server.schemas import lenient
    from effect_gateway_client.mcp_server.server import GatewayTools

    tools = GatewayTools(gateway_url, token=agent.token)
    try:
        listed, _ = tools.catalogue(agent.token)
    finally:
        tools.close()
    schema = next(t.inputSchema for t in listed if t.name == "ticket_create")
    payload_schema = schema["properties"]["payload"]
    optional = [
        name
        for name, sub in payload_schema["properties"].items()
        if {"type": "null"} in sub.get("anyOf", ())
    ]
    assert optional, "the ticket contract has optional payload fields"
    field = optional[0]
    base = {"title": "printer on fire", "priority": "P3"}
    arguments = {
        "idempotency_key": "ticket.create:support:nulls:v1",
        "resource": {"type": "queue", "id": "support", "version": None},
        "payload": {**dict.fromkeys(optional), **base},
        "intent": None,
        "context": None,
    }
    jsonschema.validate(arguments, schema)  # strict: every field present, optional ones null
    jsonschema.validate({k: v for k, v in arguments.items() if v is not None}, lenient(schema))

    with_nulls = agent.submit(
        {
            "type": "ticket.create",
            "resource": arguments["resource"],
            "payload": arguments["payload"],
        },
        "ticket.create:support:nulls:v1",
    )
    assert with_nulls.status_code == 201, with_nulls.content
    without = agent.submit(
        {"type": "ticket.create", "resource": {"type": "queue", "id": "support"}, "payload": base},
        "ticket.create:support:nulls:v1",
    )
    assert without.status_code == 200, without.content  # the same command: a replay
    assert without.json()["payload_digest"] == with_nulls.json()["payload_digest"]
    assert field not in with_nulls.json()["payload"]
    assert len(sandbox.operations(type="ticket.create")) == 1


def test_next_step_never_calls_a_failed_compensation_undone():
    from effect_gateway_client import Effect
    from effect_gateway_client.mcp_server.server import next_step

    def effect(status: str) -> Effect:
        return Effect.from_json({"effect_id": "eff_1", "type": "billing.charge.create",
                                 "status": status, "approval": {"required": False}})  # fmt: skip

    failed = next_step(effect("COMPENSATION_FAILED"), "http://gw")
    assert "NOT undone" in failed and "was undone" not in failed
    assert "undone by its compensation" in next_step(effect("COMPENSATED"), "http://gw")
