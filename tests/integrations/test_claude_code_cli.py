"""The Claude Code configs of docs/guides/integrations.md, copied verbatim into a project and run
by the real Claude Code CLI (npm, pinned in tests/integrations/claude_code/) against a scripted
model and a live gateway. What reaches the ledger, and what the model is told, is asserted.

The CLI is installed from its pinned lock file into the tools' cache outside the checkout; the
tests skip, saying why, where Node.js is missing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.choices import EffectStatus
from gateway.models import Effect
from tests.support import claude_code
from tests.support.scripted_model import ModelServer, ScriptedModel, ToolCall, result_text

pytestmark = pytest.mark.django_db(transaction=True)

REFUND_TOOL = "__effect-gateway__billing_refund_create"


@pytest.fixture(scope="module")
def claude() -> Path:
    try:
        return claude_code.install()
    except claude_code.Missing as why:
        pytest.skip(str(why))


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


def run(claude: Path, tmp_path: Path, settings: str, model: ScriptedModel, live_server, agent):
    where = claude_code.project(tmp_path, settings)
    with ModelServer(model) as server:
        return claude_code.run(
            claude,
            where,
            gateway_url=live_server.url,
            token=agent.token,
            model_url=server.url,
            prompt="Refund the duplicate charge on order ord_881.",
        )


def test_headless_config_submits_and_the_gateway_holds_what_needs_an_approver(
    claude, tmp_path, live_server, agent, sandbox, eager_tasks
):
    model = three_calls()
    out = run(claude, tmp_path, "claude-code-headless", model, live_server, agent)

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
    claude, tmp_path, live_server, agent, sandbox, eager_tasks
):
    """Run without a terminal, the interactive config's ``ask`` is taken as no: the refund
    that needs an approver never reaches the gateway (why the headless config exists)."""
    model = three_calls()
    out = run(claude, tmp_path, "claude-code-interactive", model, live_server, agent)

    assert list(Effect.objects.values_list("command__idempotency_key", "status")) == [
        ("cc-small", EffectStatus.CONFIRMED)
    ]
    assert len(sandbox.operations()) == 1
    denied = [denial["tool_name"] for denial in out["permission_denials"]]
    assert denied == ["mcp" + REFUND_TOOL, "Bash"]
    told = [result_text(result) for result in model.tool_results()]
    assert "call wait_for_effect" in told[0]
    assert "Nothing has been submitted yet" in told[1] and "nothing was sent" in told[1]
