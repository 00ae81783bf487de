"""The Claude Code configs of docs/guides/integrations.md, copied verbatim into a project and run
by the real Claude Code CLI (npm, pinned in tests/integrations/claude_code/) against a scripted
model and a live gateway. What reaches the ledger, and what the model is told, is asserted.

The CLI is installed from its pinned lock file into a cache outside the checkout; the test skips,
saying why, where Node.js is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.choices import EffectStatus
from gateway.models import Effect
from tests.integrations.test_docs_examples import examples
from tests.support.scripted_model import ModelServer, ScriptedModel, ToolCall, result_text

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
PINNED = ROOT / "tests" / "integrations" / "claude_code"
REFUND_TOOL = "__effect-gateway__billing_refund_create"


@pytest.fixture(scope="module")
def claude() -> Path:
    """The pinned CLI, installed with ``npm ci`` into the tools' cache (not the checkout)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js is not installed")
    lock = json.loads((PINNED / "package-lock.json").read_text())
    version = lock["packages"]["node_modules/@anthropic-ai/claude-code"]["version"]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    home = cache / "effect-gateway" / f"claude-code-{version}"
    binary = home / "node_modules" / ".bin" / "claude"
    if not binary.exists():
        home.mkdir(parents=True, exist_ok=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copy(PINNED / name, home / name)
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=home,
            check=True,
            capture_output=True,
            timeout=600,
        )
    return binary


def project(tmp_path: Path, settings: str) -> Path:
    """A project holding the docs' ``.mcp.json`` and the given ``.claude/settings.json``."""
    where = tmp_path / "project"
    (where / ".claude").mkdir(parents=True)
    (where / ".mcp.json").write_text(examples()["claude-code-mcp"][1])
    (where / ".claude" / "settings.json").write_text(examples()[settings][1])
    return where


def run_claude(claude: Path, where: Path, env: dict[str, str], prompt: str) -> dict:
    """``claude -p`` as the docs run it; its JSON result."""
    home = where.parent / "home"
    home.mkdir(exist_ok=True)
    result = subprocess.run(
        [str(claude), "-p", prompt, "--mcp-config", ".mcp.json", "--output-format", "json"],
        cwd=where,
        env={**env, "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    return json.loads(result.stdout)


@pytest.fixture
def cli_env(live_server, agent, tmp_path) -> dict[str, str]:
    """The environment the docs assume: the gateway's URL and token, and ``effect-gateway-mcp``
    on PATH as installing the client puts it there."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mcp = bin_dir / "effect-gateway-mcp"
    mcp.write_text(f'#!/bin/sh\nexec {sys.executable} -m effect_gateway_client.mcp_server "$@"\n')
    mcp.chmod(0o755)
    return {
        **os.environ,
        "GATEWAY_URL": live_server.url,
        "GATEWAY_TOKEN": agent.token,
        "ANTHROPIC_API_KEY": "sk-ant-scripted",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "PYTHONPATH": f"{ROOT / 'clients' / 'python' / 'src'}:{ROOT}",
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
    }


def refund(amount: int, key: str) -> ToolCall:
    return ToolCall(
        REFUND_TOOL,
        {
            "idempotency_key": key,
            "resource": {"type": "order", "id": "ord_881", "version": 17},
            "payload": {"amount": amount, "currency": "EUR", "reason": "duplicate charge"},
        },
    )


def three_calls() -> ScriptedModel:
    """A refund within policy, one that needs an approver, and a raw call around the gateway."""
    return ScriptedModel(
        [
            refund(500, "cc-small"),
            refund(50_000, "cc-large"),
            ToolCall("Bash", {"command": "kubectl delete namespace prod"}),
        ]
    )


def test_headless_config_submits_and_the_gateway_holds_what_needs_an_approver(
    claude, tmp_path, cli_env, sandbox, eager_tasks
):
    model = three_calls()
    where = project(tmp_path, "claude-code-headless")
    with ModelServer(model) as server:
        out = run_claude(claude, where, {**cli_env, "ANTHROPIC_BASE_URL": server.url}, "Refund.")

    small, large = (
        Effect.objects.select_related("command").get(command__idempotency_key=key)
        for key in ("cc-small", "cc-large")
    )
    assert small.status == EffectStatus.CONFIRMED
    assert large.status == EffectStatus.AWAITING_APPROVAL
    assert small.command.context["runtime"] == "claude-code"
    assert [op["idempotency_key"] for op in sandbox.operations()] == [small.command.provider_key]
    told = [result_text(result) for result in model.tool_results()]
    assert small.command.effect_id in told[0] and "call wait_for_effect" in told[0]
    assert "waits for a human approver" in told[1] and "not" in told[1].lower()
    assert "Blocked by the Effect Gateway" in told[2]
    assert [denial["tool_name"] for denial in out["permission_denials"]] == ["Bash"]


def test_interactive_config_asks_before_what_needs_an_approver(
    claude, tmp_path, cli_env, sandbox, eager_tasks
):
    """Run without a terminal, the interactive config's ``ask`` is taken as no: the refund
    that needs an approver never reaches the gateway (why the headless config exists)."""
    model = three_calls()
    where = project(tmp_path, "claude-code-interactive")
    with ModelServer(model) as server:
        out = run_claude(claude, where, {**cli_env, "ANTHROPIC_BASE_URL": server.url}, "Refund.")

    assert list(Effect.objects.values_list("command__idempotency_key", "status")) == [
        ("cc-small", EffectStatus.CONFIRMED)
    ]
    assert len(sandbox.operations()) == 1
    denied = [denial["tool_name"] for denial in out["permission_denials"]]
    assert denied == ["mcp" + REFUND_TOOL, "Bash"]
    told = [result_text(result) for result in model.tool_results()]
    assert "call wait_for_effect" in told[0]
    assert "Nothing has been submitted yet" in told[1] and "nothing was sent" in told[1]
