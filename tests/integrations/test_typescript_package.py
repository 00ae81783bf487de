"""The TypeScript package as its users get it: ``npm pack``, installed from the tarball into an
empty project, imported by its name from JavaScript and from TypeScript (both module
resolutions users configure), and a submit + wait against a live gateway through each."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from gateway.models import Command
from tests.support.typescript import TSC, installed_project

pytestmark = pytest.mark.django_db(transaction=True)

NAME = "@effect-gateway/client"

SUBMIT_AND_WAIT = """
import { GatewayClient, deterministicKey } from "@effect-gateway/client";

const gateway = new GatewayClient(process.env.GATEWAY_URL, process.env.GATEWAY_TOKEN);
const run = process.env.RUN_ID;
const key = deterministicKey("ticket.create", "support", run, "v1");
const command = {
  type: "ticket.create",
  resource: { type: "queue", id: "support" },
  payload: { title: `from the packed client ${run}`, priority: "P3" },
};
const effect = await gateway.submit(command, { key });
const done = await gateway.wait(effect.effect_id, { timeoutSeconds: 30 });
console.log(`${run} ${done.status}`);
"""

# The same, typed: a typo in the payload or the type would fail to compile.
TYPED = (
    SUBMIT_AND_WAIT.replace(
        "process.env.GATEWAY_URL, process.env.GATEWAY_TOKEN", "env.GATEWAY_URL!, env.GATEWAY_TOKEN!"
    )
    .replace("process.env.RUN_ID", "env.RUN_ID!")
    .replace("const command = {", "const command: Command = {")
    .replace("import { GatewayClient,", "import { type Command, GatewayClient,")
)
TYPED = (
    "declare const process: { env: Record<string, string | undefined> };\n"
    "const env = process.env;\n" + TYPED
)

TSCONFIGS = {
    "bundler": {"module": "ESNext", "moduleResolution": "bundler"},
    "node16": {"module": "Node16", "moduleResolution": "node16"},
}


def run(argv: list[str], cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=180, **kwargs)
    assert result.returncode == 0, f"{argv}: {result.stdout[-2000:]}{result.stderr[-2000:]}"
    return result


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """An empty npm project with the packed tarball installed, as a user's would be."""
    return installed_project(tmp_path)


def test_the_packed_package_imports_by_name_and_submits(project, gateway_url, agent, sandbox,
                                                        eager_tasks):  # fmt: skip
    installed = project / "node_modules" / NAME
    assert (installed / "dist" / "index.js").is_file()
    assert not (installed / "dist" / "test").exists()  # the package ships its code alone
    env = {**os.environ, "GATEWAY_URL": gateway_url, "GATEWAY_TOKEN": agent.token}

    (project / "plain.mjs").write_text(SUBMIT_AND_WAIT)
    out = run(["node", "plain.mjs"], project, env={**env, "RUN_ID": "mjs"})
    assert out.stdout.strip() == "mjs CONFIRMED"

    tsc = str(TSC)
    (project / "typed.mts").write_text(TYPED)
    for name, options in TSCONFIGS.items():
        config = {
            "compilerOptions": {
                **options,
                "target": "ES2022",
                "strict": True,
                "outDir": f"out-{name}",
                "lib": ["ES2022", "DOM"],
                "types": [],
            },
            "files": ["typed.mts"],
        }
        (project / f"tsconfig.{name}.json").write_text(json.dumps(config))
        run([tsc, "-p", f"tsconfig.{name}.json"], project)
        out = run(["node", f"out-{name}/typed.mjs"], project, env={**env, "RUN_ID": name})
        assert out.stdout.strip() == f"{name} CONFIRMED"

    keys = {"ticket.create:support:mjs:v1", "ticket.create:support:bundler:v1",
            "ticket.create:support:node16:v1"}  # fmt: skip
    assert set(Command.objects.values_list("idempotency_key", flat=True)) == keys
    assert len(sandbox.operations(type="ticket.create")) == 3


def test_a_typed_command_with_a_wrong_field_does_not_compile(project):
    tsc = str(TSC)
    wrong = TYPED.replace('priority: "P3"', 'priority: "P3", amount: 5')
    (project / "wrong.mts").write_text(wrong)
    config = {
        "compilerOptions": {**TSCONFIGS["bundler"], "strict": True, "noEmit": True,
                            "lib": ["ES2022", "DOM"], "types": []},
        "files": ["wrong.mts"],
    }  # fmt: skip
    (project / "tsconfig.json").write_text(json.dumps(config))
    result = subprocess.run([tsc, "-p", "tsconfig.json"], cwd=project, capture_output=True,
                            text=True, timeout=180)  # fmt: skip
    assert result.returncode != 0
    assert "amount" in result.stdout
