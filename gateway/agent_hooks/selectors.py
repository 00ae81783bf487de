"""Reads of the agent hooks app, scoped by tenant."""

from __future__ import annotations

from django.db.models import QuerySet

from gateway.agent_hooks.models import ToolCallOutcome
from gateway.models import Effect


def effect_tool_uses(effect: Effect) -> QuerySet[ToolCallOutcome]:
    """The PostToolUse records that name ``effect``: which Claude Code session and tool call
    returned it, and its status when the hook ran, oldest first."""
    return (
        ToolCallOutcome.objects.filter(tenant_id=effect.tenant_id, effect_id=effect.pk)
        .select_related("principal")
        .order_by("recorded_at", "id")
    )
