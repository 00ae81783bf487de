"""Smoke test of the installed ``effect-gateway-client`` beside openai-agents,
langchain-mcp-adapters and langgraph, in an environment without Django.

A stub gateway (a few routes of the HTTP API, in this process) stands behind the real
``effect-gateway-mcp`` console script; langchain-mcp-adapters and the OpenAI Agents SDK load
its tools and call one, and the sync and async clients talk to the stub. Run by
``scripts/clients_smoke.sh`` (``make clients-test``). Exits non-zero on any failure.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import version
from pathlib import Path

TOKEN = "egw_smoke"
TICKET_TYPE = {
    "type": "ticket.create",
    "description": "Open a ticket.",
    "provider": "ticketing",
    "effect_class": "external_write",
    "owner": "support",
    "resource_type": "queue",
    "resource_version_required": False,
    "payload_schema": {
        "type": "object",
        "properties": {"title": {"type": "string"}, "priority": {"enum": ["P1", "P2"]}},
        "required": ["title", "priority"],
        "additionalProperties": False,
    },
    "example": {},
    "approval": {"description": "never"},
    "irreversible": False,
    "compensator": "ticket.close",
}
submitted: dict[str, dict] = {}


def effect(key: str, body: dict) -> dict:
    return {
        "effect_id": "eff_" + str(abs(hash(key)) % 10**8),
        "type": body["type"],
        "status": "CONFIRMED",
        "idempotency_key": key,
        "payload_digest": "sha256:x",
        "resource": body["resource"],
        "context": body.get("context", {}),
        "receipt": {"provider_operation_id": "op_1", "provider_status": "succeeded"},
    }


class Gateway(BaseHTTPRequestHandler):
    def _send(self, status: int, body: dict, headers: dict | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _authorised(self) -> bool:
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self._send(401, {"type": "x/authentication-failed", "detail": "bad token"})
            return False
        return True

    def do_GET(self) -> None:
        if not self._authorised():
            return
        if self.path.startswith("/api/v1/effect-types"):
            self._send(200, {"results": [TICKET_TYPE]})
        elif self.path.startswith("/api/v1/effects/"):
            effect_id = self.path.split("/")[4].split("?")[0]
            found = next((e for e in submitted.values() if e["effect_id"] == effect_id), None)
            self._send(200, found) if found else self._send(404, {"detail": "No effect"})
        else:
            self._send(404, {"detail": "not here"})

    def do_POST(self) -> None:
        if not self._authorised():
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        key = self.headers["Idempotency-Key"]
        if key in submitted:
            self._send(200, submitted[key], {"Idempotent-Replayed": "true"})
        else:
            submitted[key] = effect(key, body)
            self._send(201, submitted[key])

    def log_message(self, *args) -> None:
        pass


def main() -> int:
    import effect_gateway_client
    import langchain_mcp_adapters  # noqa: F401
    import langgraph  # noqa: F401
    from agents.mcp import MCPServerStdio
    from effect_gateway_client import AsyncGatewayClient, GatewayClient
    from effect_gateway_client.langgraph import effect_key
    from langchain_mcp_adapters.client import MultiServerMCPClient

    assert "django" not in sys.modules, "the client imported Django"
    mcp_version = version("mcp")
    assert mcp_version.startswith("1."), mcp_version
    print(
        f"installed: effect-gateway-client {version('effect-gateway-client')}, mcp "
        f"{mcp_version}, openai-agents {version('openai-agents')}, langchain-mcp-adapters "
        f"{version('langchain-mcp-adapters')}, langgraph {version('langgraph')}"
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"

    with GatewayClient(url, TOKEN) as gateway:
        first = gateway.submit(
            "ticket.create",
            {"type": "queue", "id": "s"},
            {"title": "t", "priority": "P2"},
            key="ticket.create:s:smoke:v1",
        )
        again = gateway.submit(
            "ticket.create",
            {"type": "queue", "id": "s"},
            {"title": "t", "priority": "P2"},
            key="ticket.create:s:smoke:v1",
        )
        assert (first.replayed, again.replayed) == (False, True)

    async def run_async() -> None:
        async with AsyncGatewayClient(url, TOKEN) as gateway:
            done = await gateway.wait(first.effect_id, timeout=1)
            assert done.status == "CONFIRMED"

    asyncio.run(run_async())
    assert effect_key("billing.refund.create", "ord_1") == "billing.refund.create:ord_1:v1"

    # The console script beside this interpreter, as pipx/uvx install it.
    command = shutil.which("effect-gateway-mcp", path=str(Path(sys.executable).parent))
    assert command, "the effect-gateway-mcp console script is not installed"
    env = {"GATEWAY_URL": url, "GATEWAY_TOKEN": TOKEN}

    async def langchain() -> None:
        client = MultiServerMCPClient(
            {"gateway": {"command": command, "args": [], "transport": "stdio", "env": env}}
        )
        tools = {tool.name: tool for tool in await client.get_tools()}
        assert {"ticket_create", "wait_for_effect", "get_effect"} <= set(tools), sorted(tools)
        answer = await tools["ticket_create"].ainvoke(
            {
                "idempotency_key": "ticket.create:s:langchain:v1",
                "resource": {"type": "queue", "id": "s"},
                "payload": {"title": "from langchain", "priority": "P1"},
            }
        )
        assert "ticket.create:s:langchain:v1" in str(answer), answer
        print("langchain-mcp-adapters: tools", sorted(tools), "called ticket_create")

    async def openai_agents() -> None:
        async with MCPServerStdio(params={"command": command, "args": [], "env": env}) as mcp:
            names = sorted(tool.name for tool in await mcp.list_tools())
            assert "ticket_create" in names, names
            print("openai-agents MCPServerStdio: tools", names)

    asyncio.run(langchain())
    asyncio.run(openai_agents())
    assert "ticket.create:s:langchain:v1" in submitted
    server.shutdown()
    print(f"smoke: ok ({effect_gateway_client.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
