"""The effect page's Tool calls section: the PostToolUse records that name the effect."""

from __future__ import annotations

import json

from gateway.agent_hooks.outcomes import record_outcome
from tests.console.conftest import REFUND, TICKET, submit


def recorded(principal, effect_id: str, *, session: str, tool_use: str, failed=False):
    body = {
        "session_id": session,
        "hook_event_name": "PostToolUseFailure" if failed else "PostToolUse",
        "tool_name": "mcp__effect-gateway__billing_refund_create",
        "tool_use_id": tool_use,
        "tool_response": json.dumps({"effect_id": effect_id}),
    }
    outcome = record_outcome(principal=principal, body=body)
    assert outcome is not None and outcome.effect_id == effect_id
    return outcome


def test_the_effect_page_shows_its_tool_calls(oscar, bot):
    effect = submit(bot.principal, REFUND, payload={**REFUND["payload"], "amount": 50_000})
    recorded(bot.principal, effect.pk, session="sess-42", tool_use="toolu_9")
    html = oscar.client.get(f"/effects/{effect.pk}").content.decode()
    assert 'id="tool-uses-heading"' in html
    section = html[html.index('id="tool-uses-heading"') : html.index('id="events-heading"')]
    for text in ("sess-42", "toolu_9", "mcp__effect-gateway__billing_refund_create"):
        assert text in section
    assert "AWAITING_APPROVAL" in section and "refund-bot" in section
    assert "<time" in section  # when it was recorded

    bare = submit(bot.principal, TICKET)
    assert "tool-uses-heading" not in oscar.client.get(f"/effects/{bare.pk}").content.decode()


def test_another_tenants_effect_page_is_not_found(olga, bot):
    effect = submit(bot.principal, TICKET)
    recorded(bot.principal, effect.pk, session="sess-1", tool_use="toolu_1")
    assert olga.client.get(f"/effects/{effect.pk}").status_code == 404
