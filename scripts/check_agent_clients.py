"""The agent-runtime checks of ``scripts/check_real_clients.py``: the TypeScript package from its
tarball, headless Claude Code from the docs' config, and the MCP tools' schemas under the
strict-mode portability rules. Each talks to the running gateway only through a real client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support import claude_code  # noqa: E402
from tests.support.scripted_model import (  # noqa: E402
    ModelServer,
    ScriptedModel,
    ToolCall,
    result_text,
)
from tests.support.strict_schemas import strict_mode_problems  # noqa: E402
from tests.support.typescript import installed_project  # noqa: E402

TS_SUBMIT_AND_WAIT = """
import { GatewayClient, deterministicKey } from "@effect-gateway/client";

const gateway = new GatewayClient(process.env.GATEWAY_URL, process.env.GATEWAY_TOKEN);
const key = deterministicKey("ticket.create", "support", process.env.RUN_ID, "v1");
const command = {
  type: "ticket.create",
  resource: { type: "queue", id: "support" },
  payload: { title: `from the packed TypeScript client ${process.env.RUN_ID}`, priority: "P3" },
};
const effect = await gateway.submit(command, { key });
const done = await gateway.wait(effect.effect_id, { timeoutSeconds: 30 });
console.log(JSON.stringify({ key, status: done.status }));
"""


def typescript_tarball(url: str, token: str, run: str, operations: Callable[[str], list]) -> str:
    """``npm pack``, installed into an empty project, imported by name, submit + wait."""
    with tempfile.TemporaryDirectory() as scratch:
        app = installed_project(Path(scratch))
        (app / "check.mjs").write_text(TS_SUBMIT_AND_WAIT)
        env = {**os.environ, "GATEWAY_URL": url, "GATEWAY_TOKEN": token, "RUN_ID": f"ts-{run}"}
        out = subprocess.run(
            ["node", "check.mjs"], cwd=app, env=env, capture_output=True, text=True, timeout=120
        )
    assert out.returncode == 0, out.stderr[-2000:]
    answer = json.loads(out.stdout)
    assert answer["status"] == "CONFIRMED", answer
    assert len(operations(answer["key"])) == 1
    return f"imported by name from the tarball; {answer['key']} CONFIRMED, 1 provider operation"


def claude_code_headless(url: str, token: str, run: str, operations: Callable[[str], list]) -> str:
    """The docs' headless config, verbatim, in the real CLI with a scripted model: a ticket
    within policy is executed once, a refund over the approval rule waits for an approver."""
    ticket_key = f"ticket.create:support:claude-{run}:v1"
    refund_key = f"billing.refund.create:ord_claude_{run}:v1"
    model = ScriptedModel(
        [
            ToolCall(
                "__effect-gateway__ticket_create",
                {
                    "idempotency_key": ticket_key,
                    "resource": {"type": "queue", "id": "support"},
                    "payload": {"title": f"headless Claude Code {run}", "priority": "P3"},
                },
            ),
            ToolCall(
                "__effect-gateway__billing_refund_create",
                {
                    "idempotency_key": refund_key,
                    "resource": {"type": "order", "id": f"ord_claude_{run}", "version": 1},
                    "payload": {"amount": 25_000, "currency": "EUR", "reason": "check"},
                },
            ),
        ]
    )
    claude = claude_code.install()
    with tempfile.TemporaryDirectory() as scratch, ModelServer(model) as server:
        where = claude_code.project(Path(scratch), "claude-code-headless")
        out = claude_code.run(
            claude, where, gateway_url=url, token=token, model_url=server.url, prompt="Go."
        )
    told = [result_text(result) for result in model.tool_results()]
    assert len(told) == 2, out
    ticket, refund = (json.loads(text) for text in told)
    assert ticket["context"]["runtime"] == "claude-code", ticket
    assert refund["status"] == "AWAITING_APPROVAL" and "wait_for_effect" in refund["next_step"]
    assert len(operations(ticket_key)) == 1 and operations(refund_key) == []
    return "docs' headless config: ticket sent once, refund held for an approver, 0 denials"


def strict_schemas(tools: list[Any]) -> str:
    """Every listed tool's input schema under OpenAI strict mode's and MCP Inspector's
    ``--strict`` portability rules."""
    problems = [p for tool in tools for p in strict_mode_problems(tool.inputSchema, tool.name)]
    assert problems == [], problems[:10]
    return f"{len(tools)} tools, 0 portability problems"


def _approve_in_console(authorization_url: str, login: tuple[str, str], agent: str) -> str:
    """What the admin does in a browser: open the URL, sign in, pick ``agent``, approve.
    Answers the redirect the client's callback receives."""
    import re

    import httpx

    with httpx.Client(trust_env=False, follow_redirects=False, timeout=30) as browser:
        page = browser.get(authorization_url)
        login_url = httpx.URL(authorization_url).join(page.headers["location"])
        browser.get(login_url)
        signed_in = browser.post(
            login_url,
            data={
                "username": login[0],
                "password": login[1],
                "next": parse_qs(login_url.query.decode())["next"][0],
                "csrfmiddlewaretoken": browser.cookies["csrftoken"],
            },
        )
        assert signed_in.status_code == 302, signed_in.text[-500:]
        consent = browser.get(login_url.join(signed_in.headers["location"]))
        field = r'<input type="hidden" name="([^"]+)" value="([^"]*)"'
        hidden = dict(re.findall(field, consent.text))
        offered = r'id="principal-(\d+)"[^>]*>\s*<label for="principal-\1"><strong>([^<]+)<'
        agents = {name: pk for pk, name in re.findall(offered, consent.text)}
        assert agent in agents, f"{agent} is not offered: {sorted(agents)}"
        answer = browser.post(
            consent.url,
            data={**hidden, "allow": "on", "principal": agents[agent]},
        )
        assert answer.status_code == 302, answer.text[-500:]
        return answer.headers["location"]


def mcp_oauth(
    url: str, run: str, operations: Callable[[str], list], *, login: tuple[str, str], agent: str
) -> str:
    """A remote MCP client that discovers the gateway's authorization server, registers,
    gets a token with PKCE after the admin approves it in the console, and calls a tool."""
    import anyio
    import httpx
    from mcp import ClientSession
    from mcp.client.auth import OAuthClientProvider
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.auth import OAuthClientMetadata

    callback = "http://127.0.0.1:9/callback"
    port = int(os.environ.get("MCP_OAUTH_PORT", "8808"))
    mcp_url = f"http://127.0.0.1:{port}/mcp"
    server = _start_mcp(url, port)
    redirects: list[str] = []

    async def redirect_handler(authorization_url: str) -> None:
        redirects.append(
            await anyio.to_thread.run_sync(_approve_in_console, authorization_url, login, agent)
        )

    async def callback_handler() -> tuple[str, str | None]:
        query = parse_qs(urlsplit(redirects.pop()).query)
        return query["code"][0], query.get("state", [None])[0]

    provider = OAuthClientProvider(
        server_url=mcp_url,
        client_metadata=OAuthClientMetadata(
            client_name=f"check_real_clients {run}",
            redirect_uris=[callback],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
        ),
        storage=_MemoryTokens(),
        redirect_handler=redirect_handler,
        callback_handler=callback_handler,
    )
    key = f"ticket.create:support:oauth-{run}:v1"
    ticket = {
        "idempotency_key": key,
        "resource": {"type": "queue", "id": "support"},
        "payload": {"title": f"remote MCP over OAuth {run}", "priority": "P3"},
    }

    async def main():
        http = httpx.AsyncClient(trust_env=False, timeout=30, auth=provider)
        async with (
            http,
            streamable_http_client(mcp_url, http_client=http) as (read, write, _),
            ClientSession(read, write) as client,
        ):
            await client.initialize()
            first = await client.call_tool("ticket_create", ticket)
            again = await client.call_tool("ticket_create", ticket)
            return first, again

    try:
        _wait_for_port(port)
        first, again = anyio.run(main)
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert not first.isError, first.structuredContent
    assert again.structuredContent["replayed"] is True
    assert len(operations(key)) == 1
    return f"discovery, registration, PKCE, console approval as {login[0]}; 2 calls = 1 operation"


class _MemoryTokens:
    """The MCP SDK's token storage, in memory."""

    tokens: Any = None
    client_info: Any = None

    async def get_tokens(self) -> Any:
        return self.tokens

    async def set_tokens(self, tokens: Any) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> Any:
        return self.client_info

    async def set_client_info(self, info: Any) -> None:
        self.client_info = info


def _start_mcp(url: str, port: int) -> subprocess.Popen:
    """``effect-gateway-mcp`` over streamable HTTP on ``port``, with no token of its own."""
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "effect_gateway_client.mcp_server"),
            *("--transport", "streamable-http", "--port", str(port), "--gateway-url", url),
        ],
        env={k: v for k, v in os.environ.items() if k != "GATEWAY_TOKEN"},
        stdin=subprocess.DEVNULL,
    )


def _wait_for_port(port: int) -> None:
    import socket
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listens on port {port}")


class MachineSigner:
    """An approver's Ed25519 key, registered by an admin, that signs approvals where the
    gateway's policy asks for a signature (financial and irreversible types by default)."""

    def __init__(self, url: str, admin_token: str, principal: str) -> None:
        import base64

        import httpx
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        self.key = Ed25519PrivateKey.generate()
        raw = self.key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        answer = httpx.post(
            f"{url}/api/v1/signing-keys",
            json={
                "principal": principal,
                "public_key": base64.urlsafe_b64encode(raw).rstrip(b"=").decode(),
                "name": "check_real_clients",
            },
            headers={"Authorization": f"Bearer {admin_token}"},
            trust_env=False,
        )
        answer.raise_for_status()
        self.key_id = answer.json()["credential_id"]

    def approve(self, approver: Any, effect_id: str) -> Any:
        """``approver`` (a GatewayClient) approves ``effect_id`` with a signed challenge."""
        import base64

        challenge = approver.approval_challenge(effect_id)
        data = challenge["challenge"]
        signature = self.key.sign(base64.urlsafe_b64decode(data + "=" * (-len(data) % 4)))
        return approver.approve(
            effect_id,
            challenge["payload_digest"],
            signature={
                "nonce": challenge["nonce"],
                "key_id": self.key_id,
                "signature": base64.urlsafe_b64encode(signature).rstrip(b"=").decode(),
            },
        )
