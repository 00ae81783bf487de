"""Claude Code's hook inputs, as Claude Code sends them, and the answers it understands."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from django.test import Client

from gateway.agent_hooks import views
from gateway.agent_hooks.models import GovernedPattern

pytestmark = pytest.mark.django_db

PRE = "/hooks/claude-code/pre-tool-use"
PERMISSION = "/hooks/claude-code/permission-request"

# Claude Code's documented hook output for these two events (hooks reference): every field is
# optional; a decision lives in hookSpecificOutput, named for its event.
HOOK_OUTPUT = {
    "type": "object",
    "properties": {
        "continue": {"type": "boolean"},
        "stopReason": {"type": "string"},
        "suppressOutput": {"type": "boolean"},
        "systemMessage": {"type": "string"},
        "hookSpecificOutput": {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {
                        "hookEventName": {"const": "PreToolUse"},
                        "permissionDecision": {"enum": ["allow", "deny", "ask"]},
                        "permissionDecisionReason": {"type": "string"},
                        "updatedInput": {"type": "object"},
                        "additionalContext": {"type": "string"},
                    },
                    "required": ["hookEventName"],
                    "additionalProperties": False,
                },
                {
                    "type": "object",
                    "properties": {
                        "hookEventName": {"const": "PermissionRequest"},
                        "decision": {
                            "type": "object",
                            "properties": {
                                "behavior": {"enum": ["allow", "deny"]},
                                "updatedInput": {"type": "object"},
                                "message": {"type": "string"},
                                "interrupt": {"type": "boolean"},
                            },
                            "required": ["behavior"],
                            "additionalProperties": False,
                        },
                    },
                    "required": ["hookEventName", "decision"],
                    "additionalProperties": False,
                },
            ]
        },
    },
    "additionalProperties": False,
}


def hook_input(event: str, tool_name: str, tool_input: dict) -> dict:
    """The JSON Claude Code posts for PreToolUse / PermissionRequest."""
    return {
        "session_id": "abc123-session",
        "transcript_path": "/home/dev/.claude/projects/shop/abc123.jsonl",
        "cwd": "/home/dev/shop",
        "permission_mode": "default",
        "hook_event_name": event,
        "tool_name": tool_name,
        "tool_input": tool_input,
        "tool_use_id": "toolu_01ABC",
    }


def bash(command: str) -> dict:
    return {"command": command, "description": "run it", "timeout": 120000}


def post(path: str, body, token: str | None, **extra) -> dict:
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    data = body if isinstance(body, str | bytes) else json.dumps(body)
    response = Client().post(path, data, content_type="application/json", **headers, **extra)
    assert response.status_code == 200
    answer = response.json()
    jsonschema.validate(answer, HOOK_OUTPUT)
    return answer


def pre(agent, tool_name: str, tool_input: dict, token: str | None = "agent") -> dict:
    token = agent.token if token == "agent" else token
    return post(PRE, hook_input("PreToolUse", tool_name, tool_input), token)


def decision(answer: dict) -> str | None:
    return answer.get("hookSpecificOutput", {}).get("permissionDecision")


@pytest.mark.parametrize(
    ("command", "tool"),
    [
        ("kubectl apply -f deploy/prod.yaml", "deployment_release_promote"),
        ("cd infra && kubectl -n shop rollout undo deploy/catalog", "deployment_release_promote"),
        ("helm upgrade catalog ./chart --set image.tag=a1b2c3", "deployment_release_promote"),
        ("curl -s -X POST https://api.stripe.com/v1/refunds -d charge=ch_1", "billing_refund"),
        ("sudo sendmail ada@example.com < note.txt", "email_message_send"),
        ("gh release create v2.0.0 --notes x", "deployment_release_promote"),
    ],
)
def test_raw_calls_to_governed_systems_are_denied_naming_the_gateway_tool(agent, command, tool):
    answer = pre(agent, "Bash", bash(command))
    assert decision(answer) == "deny"
    reason = answer["hookSpecificOutput"]["permissionDecisionReason"]
    assert f"mcp__effect-gateway__{tool}" in reason


def test_production_database_access_is_denied(agent):
    answer = pre(agent, "Bash", bash("psql -h db.prod.internal -U app -c 'delete from orders'"))
    assert decision(answer) == "deny"
    assert "production databases" in answer["hookSpecificOutput"]["permissionDecisionReason"]


def test_fetching_a_payment_api_is_denied(agent):
    answer = pre(agent, "WebFetch", {"url": "https://api.stripe.com/v1/charges", "prompt": "x"})
    assert decision(answer) == "deny"


@pytest.mark.parametrize(
    "command",
    [
        "ls -la",
        "kubectl get pods -n shop",
        "kubectl rollout status deploy/catalog",
        "grep -r mail src/",
        "git log --oneline",
        "psql -h localhost -c 'select 1'",
    ],
)
def test_other_commands_get_no_decision_so_claude_codes_own_rules_apply(agent, command):
    assert pre(agent, "Bash", bash(command)) == {}


def test_a_gateway_tool_that_needs_approval_asks_with_the_console_link(agent):
    tool_input = {
        "idempotency_key": "billing.refund.create:ord_881:incident_120:v1",
        "resource": {"type": "order", "id": "ord_881", "version": 17},
        "payload": {"amount": 50_000, "currency": "EUR", "reason": "duplicate charge"},
    }
    answer = pre(agent, "mcp__effect-gateway__billing_refund_create", tool_input)
    output = answer["hookSpecificOutput"]
    assert output["permissionDecision"] == "ask"
    assert "needs a human approver" in output["permissionDecisionReason"]
    assert "http://testserver/approvals" in output["permissionDecisionReason"]
    # Read by a model whose call was then refused (claude -p): it must not think it was sent.
    assert "Nothing has been submitted yet" in output["permissionDecisionReason"]
    assert "After it is submitted" not in output["permissionDecisionReason"]
    # Claude Code's correlation ids ride along into the command's context.
    assert output["updatedInput"]["context"] == {
        "runtime": "claude-code",
        "session_id": "abc123-session",
        "call_id": "toolu_01ABC",
    }
    assert output["updatedInput"]["payload"] == tool_input["payload"]


def test_a_gateway_tool_within_policy_is_allowed(agent):
    tool_input = {
        "idempotency_key": "k1",
        "resource": {"type": "order", "id": "ord_881", "version": 17},
        "payload": {"amount": 500, "currency": "EUR", "reason": "duplicate charge"},
    }
    answer = pre(agent, "mcp__effect-gateway__billing_refund_create", tool_input)
    assert decision(answer) == "allow"
    assert pre(agent, "mcp__effect-gateway__get_effect", {"effect_id": "eff_1"})[
        "hookSpecificOutput"
    ] == {
        "hookEventName": "PreToolUse",
        "permissionDecision": "allow",
        "permissionDecisionReason": "The Effect Gateway validates, deduplicates and audits "
        "this call.",
    }


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        # The schema refuses it: the gateway answers with the field errors, the agent fixes it.
        ({"amount": "50000.00", "currency": "EUR", "reason": "duplicate charge"}, "allow"),
        ({"amount": [1], "currency": "EUR", "reason": "duplicate charge"}, "allow"),
        # Strict-mode tools send null for an optional field: null is absent, as the gateway has it.
        ({"amount": 50_000, "currency": "EUR", "reason": "x", "charge_id": None}, "ask"),
        ({"amount": 500, "currency": "EUR", "reason": "x", "charge_id": None}, "allow"),
    ],
)
def test_the_approval_rule_reads_the_payload_the_gateway_will_read(agent, payload, expected):
    tool_input = {
        "idempotency_key": "k2",
        "resource": {"type": "order", "id": "o"},
        "payload": payload,
    }
    answer = pre(agent, "mcp__effect-gateway__billing_refund_create", tool_input)
    assert decision(answer) == expected, answer


def test_an_already_submitted_key_links_to_its_effect(agent, refund_body):
    body = {**refund_body, "payload": {**refund_body["payload"], "amount": 50_000}}
    effect_id = agent.submit(body, "big-refund").json()["effect_id"]
    answer = pre(
        agent,
        "mcp__effect-gateway__billing_refund_create",
        {"idempotency_key": "big-refund", "resource": body["resource"], "payload": body["payload"]},
    )
    assert f"/effects/{effect_id}" in answer["hookSpecificOutput"]["permissionDecisionReason"]


def test_tenant_patterns_add_rules_and_switch_defaults_off(agent, rival_agent):
    tenant = agent.principal.tenant
    GovernedPattern.objects.create(
        tenant=tenant,
        name="pulumi",
        regex=r"\bpulumi\s+up\b",
        gateway_tool="mcp__effect-gateway__deployment_release_promote",
        reason="Infrastructure changes are released through the gateway.",
    )
    GovernedPattern.objects.create(
        tenant=tenant, name="kubectl", regex="x", reason="off", enabled=False
    )
    assert decision(pre(agent, "Bash", bash("cd infra && pulumi up --yes"))) == "deny"
    assert pre(agent, "Bash", bash("kubectl apply -f x.yaml")) == {}
    # Another tenant keeps the defaults and has no pulumi rule.
    assert decision(pre(rival_agent, "Bash", bash("kubectl apply -f x.yaml"))) == "deny"
    assert pre(rival_agent, "Bash", bash("pulumi up")) == {}


@pytest.mark.parametrize("body", ["{not json", "[]", '{"tool_input": {}}', ""])
def test_unreadable_input_still_answers_200_and_asks_a_human(agent, body):
    answer = post(PRE, body, agent.token)
    assert decision(answer) == "ask"
    assert "could not read" in answer["hookSpecificOutput"]["permissionDecisionReason"]
    assert post(PERMISSION, body, agent.token) == {}


def test_without_a_valid_token_a_human_decides_and_nothing_is_matched(agent):
    # Issue 13 item 2: an anonymous caller gets a fixed answer, no matching work at all.
    assert decision(pre(agent, "Bash", bash("kubectl delete ns shop"), token=None)) == "ask"
    answer = pre(agent, "Bash", bash("ls"), token="egw_wrong")
    assert decision(answer) == "ask"
    assert "authentication failed" in answer["hookSpecificOutput"]["permissionDecisionReason"]


def test_a_token_in_the_url_is_refused(agent):
    body = hook_input("PreToolUse", "Bash", bash("ls"))
    answer = post(f"{PRE}?token={agent.token}", body, None)
    assert decision(answer) == "ask"
    assert "Authorization header" in answer["hookSpecificOutput"]["permissionDecisionReason"]


def test_an_internal_error_fails_closed_for_governed_calls(agent, monkeypatch):
    def broken(principal):
        raise RuntimeError("database is down")

    monkeypatch.setattr(views, "_tenant_rules", broken)
    assert decision(pre(agent, "Bash", bash("helm upgrade x ./chart"))) == "deny"
    assert decision(pre(agent, "Bash", bash("ls"))) == "ask"


def test_permission_request_answers(agent):
    def ask(tool_name, tool_input):
        return post(PERMISSION, hook_input("PermissionRequest", tool_name, tool_input), agent.token)

    denied = ask("Bash", bash("kubectl apply -f x.yaml"))["hookSpecificOutput"]["decision"]
    assert denied["behavior"] == "deny"
    assert "mcp__effect-gateway__deployment_release_promote" in denied["message"]
    allowed = ask(
        "mcp__effect-gateway__ticket_create",
        {
            "idempotency_key": "k",
            "resource": {"type": "queue", "id": "support"},
            "payload": {"title": "x", "priority": "P3"},
        },
    )
    assert allowed["hookSpecificOutput"]["decision"] == {"behavior": "allow"}
    # A payload that needs a gateway approver: the dialog is shown, a human decides.
    assert (
        ask(
            "mcp__effect-gateway__deployment_release_promote",
            {"payload": {"environment": "production", "sha": "a1b2c3d", "release": "r"}},
        )
        == {}
    )
    assert ask("Bash", bash("ls")) == {}


@pytest.mark.django_db(transaction=True)
def test_the_http_hook_over_a_real_socket(live_server, agent):
    """What Claude Code's ``http`` hook does: POST the input with the configured header."""
    response = httpx.post(
        f"{live_server.url}{PRE}",
        json=hook_input("PreToolUse", "Bash", bash("kubectl apply -f prod.yaml")),
        headers={"Authorization": f"Bearer {agent.token}"},
        timeout=5,
        trust_env=False,
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    jsonschema.validate(response.json(), HOOK_OUTPUT)
    assert decision(response.json()) == "deny"
