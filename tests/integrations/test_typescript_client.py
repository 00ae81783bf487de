"""The TypeScript client (clients/typescript): its types are generated from
the schema this gateway serves, and its live test passes against a running gateway."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gateway.models import Command

pytestmark = pytest.mark.django_db(transaction=True)

PACKAGE = Path(__file__).resolve().parents[2] / "clients" / "typescript"


def build() -> None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js is not installed")
    if not (PACKAGE / "node_modules" / ".bin" / "tsc").exists():
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund"],
            cwd=PACKAGE,
            check=True,
            capture_output=True,
            timeout=300,
        )
    for config in ("tsconfig.json", "tsconfig.test.json"):  # the package, then its tests
        subprocess.run(
            [str(PACKAGE / "node_modules" / ".bin" / "tsc"), "-p", config],
            cwd=PACKAGE,
            check=True,
            timeout=300,
        )


def test_the_generated_types_come_from_the_current_schema(client):
    served = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    shipped = json.loads((PACKAGE / "openapi.json").read_text())
    assert shipped == served, (
        "clients/typescript/openapi.json is stale: run `make clients-schema` and commit it"
    )
    generated = (PACKAGE / "src" / "schema.ts").read_text()
    assert '"ticket.create"' in generated and "CommandBillingRefundCreate" in generated


def test_the_typescript_client_against_a_live_gateway(gateway_url, agent, sandbox, eager_tasks):
    build()
    env = {
        **os.environ,
        "GATEWAY_URL": gateway_url,
        "GATEWAY_TOKEN": agent.token,
        "TS_RUN_ID": "ts-pytest",
    }
    result = subprocess.run(
        ["node", "--test", "dist-test/test/"],
        cwd=PACKAGE,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "# fail 0" in result.stdout and "# skipped 0" in result.stdout, result.stdout[-2000:]
    command = Command.objects.get(idempotency_key="ticket.create:support:ts-pytest:v1")
    assert command.context == {"runtime": "typescript", "run_id": "ts-pytest"}
    assert len(sandbox.operations(type="ticket.create")) == 1
