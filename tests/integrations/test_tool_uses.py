"""PostToolUse records are read back: ``GET /api/v1/effects/{id}/tool-uses`` (tenant scoped)
and the effect's console page, which list the Claude Code tool calls that returned it."""

from __future__ import annotations

import json

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db(transaction=True)

POST_USE = "/hooks/claude-code/post-tool-use"
TOOL = "mcp__effect-gateway__billing_refund_create"


def post_tool_use(persona, effect_id: str, *, session: str, tool_use: str) -> None:
    body = {
        "session_id": session,
        "hook_event_name": "PostToolUse",
        "tool_name": TOOL,
        "tool_input": {},
        "tool_use_id": tool_use,
        "tool_response": [{"type": "text", "text": json.dumps({"effect_id": effect_id})}],
    }
    response = Client().post(
        POST_USE,
        json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {persona.token}",
    )
    assert response.status_code == 200, response.content


@pytest.fixture
def waiting_refund(agent, refund_body) -> str:
    big = {**refund_body, "payload": {**refund_body["payload"], "amount": 50_000}}
    response = agent.submit(big, "big-refund")
    assert response.status_code == 201, response.content
    return response.json()["effect_id"]


def test_the_tool_calls_that_returned_an_effect_are_listed(
    agent, approver, rival_operator, waiting_refund, ticket_body
):
    post_tool_use(agent, waiting_refund, session="sess-1", tool_use="toolu_1")
    post_tool_use(agent, waiting_refund, session="sess-2", tool_use="toolu_2")
    other = agent.submit(ticket_body, "ticket").json()["effect_id"]
    post_tool_use(agent, other, session="sess-1", tool_use="toolu_3")

    response = approver.client.get(f"/api/v1/effects/{waiting_refund}/tool-uses")
    assert response.status_code == 200, response.content
    uses = response.json()
    assert [(u["session_id"], u["tool_use_id"]) for u in uses] == [
        ("sess-1", "toolu_1"),
        ("sess-2", "toolu_2"),
    ]
    first = uses[0]
    assert first["effect_id"] == waiting_refund
    assert (first["tool_name"], first["principal"]) == (TOOL, "refund-bot")
    assert (first["status"], first["failed"]) == ("AWAITING_APPROVAL", False)
    assert first["recorded_at"]
    # Any role that reads the effect reads its tool calls; another tenant finds neither.
    assert agent.client.get(f"/api/v1/effects/{other}/tool-uses").json()[0]["tool_use_id"] == (
        "toolu_3"
    )
    rival = rival_operator.client.get(f"/api/v1/effects/{waiting_refund}/tool-uses")
    assert rival.status_code == 404
    assert rival["Content-Type"] == "application/problem+json"
    assert agent.client.get("/api/v1/effects/eff_nothing/tool-uses").status_code == 404


def test_an_effect_without_tool_calls_lists_none(agent, waiting_refund):
    assert agent.client.get(f"/api/v1/effects/{waiting_refund}/tool-uses").json() == []
