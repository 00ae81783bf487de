"""What the agent hooks app shows on the console's effect page."""

from __future__ import annotations

from gateway.agent_hooks import selectors
from gateway.console.extensions import Panel
from gateway.models import Effect, Principal


def effect_panel(principal: Principal, effect: Effect) -> Panel:
    """The Claude Code tool calls that returned this effect (PostToolUse records)."""
    tool_uses = list(selectors.effect_tool_uses(effect))
    return Panel({"tool_uses": tool_uses}, token=[(t.pk, t.status) for t in tool_uses])
