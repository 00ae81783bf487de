"""Every example of docs/guides/integrations.md, run as written against a live gateway: each
fenced block after an ``<!-- example: NAME -->`` marker is extracted and run
with $GATEWAY_URL pointing at the test's server, and its output checked."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.models import Command, Effect
from tests.support.mcp import streamable_http_mcp
from tests.support.processes import free_port

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "guides" / "integrations.md"
EXAMPLE = re.compile(r"<!-- example: ([a-z0-9-]+) -->\n```(\w+)\n(.*?)\n```", re.S)


def examples() -> dict[str, tuple[str, str]]:
    return {name: (lang, code) for name, lang, code in EXAMPLE.findall(DOC.read_text())}


def test_every_example_is_run_here():
    names = set(examples())
    ran = {
        "list-by-run",
        "python-client",
        "python-async",
        "mcp-stdio",
        "mcp-http",
        "typescript",
        "hook-decides",
        "claude-code-mcp",
        "claude-code-interactive",
        "claude-code-headless",
        "langgraph-endpoint",
        "refund-graph",
        "webhook-register",
        "webhook-verify",
    }
    assert names == ran, f"examples without a test: {names - ran}, tests without: {ran - names}"


@pytest.fixture
def env(gateway_url, agent, operator, tmp_path):
    return {
        **os.environ,
        "GATEWAY_URL": gateway_url,
        "GATEWAY_TOKEN": agent.token,
        "OPERATOR_TOKEN": operator.token,
        "AGENT_NAME": agent.principal.name,
        "PYTHONPATH": str(ROOT),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }


def run(name: str, env: dict, *, cwd: Path = ROOT, timeout: float = 90) -> str:
    lang, code = examples()[name]
    if lang == "python":
        argv = [sys.executable, "-c", code]
    elif lang == "bash":
        argv = ["bash", "-euo", "pipefail", "-c", code]
    else:
        raise AssertionError(f"{name}: {lang} examples are run by their own test")
    result = subprocess.run(
        argv,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, f"{name}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_python_examples(env, sandbox, eager_tasks):
    first = run("python-client", env)
    again = run("python-client", env)
    assert " new" in first.splitlines()[0] and "replayed" in again.splitlines()[0]
    assert "CONFIRMED" in first and "use a new key" in first
    assert "CONFIRMED" in run("python-async", env)
    assert len(sandbox.operations(type="ticket.create")) == 2
    listed = run("list-by-run", env)
    assert '"run_id": "run-42"' in listed.replace('":"', '": "')
    run("webhook-verify", env)


def test_mcp_examples(env, sandbox, eager_tasks):
    out = run("mcp-stdio", env)
    assert "ticket_create" in out and "CONFIRMED" in out
    command = [sys.executable, "-m", "effect_gateway_client.mcp_server"]
    with streamable_http_mcp(env["GATEWAY_URL"], command=command, env=env) as url:
        out = run("mcp-http", {**env, "MCP_URL": url})
        assert "tools, e.g." in out


def test_hook_and_webhook_examples(env, sandbox):
    assert '"permissionDecision": "deny"' in run("hook-decides", env).replace('":"', '": "')
    registered = run("webhook-register", env)
    assert '"secret": "whsec_' in registered.replace('":"', '": "')


def test_typescript_example(env, sandbox, eager_tasks, tmp_path):
    from tests.support.typescript import installed_project

    # As the guide says: the package installed from its tarball, imported by its name.
    app = installed_project(tmp_path)
    _, code = examples()["typescript"]
    (app / "example.mjs").write_text(code)
    result = subprocess.run(
        ["node", "example.mjs"], cwd=app, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "CONFIRMED new" in result.stdout


def test_the_langgraph_example_twice_and_with_a_cancel(env, agent, approver, sandbox, eager_tasks):
    port = free_port()
    env = {**env, "RECEIVER_PORT": str(port)}
    _, code = examples()["langgraph-endpoint"]
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", code + '\necho "$WEBHOOK_SECRET"'],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    secret = result.stdout.strip().splitlines()[-1]
    assert secret.startswith("whsec_")
    env["WEBHOOK_SECRET"] = secret

    def graph(order_id: str) -> subprocess.Popen:
        _, code = examples()["refund-graph"]
        return subprocess.Popen(
            [sys.executable, "-u", "-c", code],
            cwd=ROOT,
            env={**env, "ORDER_ID": order_id},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def interrupted(process: subprocess.Popen) -> str:
        line = process.stdout.readline()
        assert line.startswith("interrupted:"), line + process.stderr.read()
        return line.split()[1]

    # First run: interrupts; approved by alice; the webhook resumes it.
    process = graph("ord_881")
    effect_id = interrupted(process)
    effect = Effect.objects.select_related("command").get(pk=effect_id)
    approver.client.post(
        f"/api/v1/effects/{effect_id}/approve",
        {"payload_digest": effect.command.payload_digest},
        format="json",
    )
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "'status': 'CONFIRMED'" in out
    # Second run: the same intention replays the confirmed refund, no interrupt, one refund.
    out, err = graph("ord_881").communicate(timeout=60)
    assert "done:" in out and "'status': 'CONFIRMED'" in out, err
    assert "interrupted" not in out
    assert len(sandbox.operations(type="billing.refund.create")) == 1
    assert Command.objects.filter(type="billing.refund.create").count() == 1
    # A cancel instead of an approval resumes the thread too.
    process = graph("ord_882")
    effect_id = interrupted(process)
    agent.client.post(f"/api/v1/effects/{effect_id}/cancel", {"reason": "no"}, format="json")
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "'status': 'CANCELLED'" in out
