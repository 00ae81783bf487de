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
