"""The TypeScript client (clients/typescript): its types are generated from
the schema this gateway serves, and its live test passes against a running gateway."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from gateway.models import Command
from tests.support.typescript import PACKAGE, build_tests

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_generated_types_come_from_the_current_schema(client):
    served = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    shipped = json.loads((PACKAGE / "openapi.json").read_text())
    assert shipped == served, (
        "clients/typescript/openapi.json is stale: run `make clients-schema` and commit it"
    )
    generated = (PACKAGE / "src" / "schema.ts").read_text()
    assert '"ticket.create"' in generated and "CommandBillingRefundCreate" in generated


def test_the_typescript_client_against_a_live_gateway(
    gateway_url, agent, sandbox, eager_tasks, tmp_path
):
    tests = build_tests(tmp_path / "out")
    env = {
        **os.environ,
        "GATEWAY_URL": gateway_url,
        "GATEWAY_TOKEN": agent.token,
        "TS_RUN_ID": "ts-pytest",
    }
    result = subprocess.run(
        ["node", "--test", str(tests)],
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
