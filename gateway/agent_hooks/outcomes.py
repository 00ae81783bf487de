"""PostToolUse: what a Claude Code tool call came to, recorded against the ledger."""

from __future__ import annotations

import json
from typing import Any

from django.db import IntegrityError, transaction

from gateway.agent_hooks import policy
from gateway.agent_hooks.models import ToolCallOutcome
from gateway.lib import jsonin
from gateway.models import Effect, Principal

MAX_DETAIL = 2000


def _effect_id_in(response: Any) -> str:
    """The effect id a gateway tool returned: in its structured result, or its JSON text."""
    stack = [response]
    seen = 0
    while stack and seen < 200:
        seen += 1
        item = stack.pop()
        if isinstance(item, dict):
            value = item.get("effect_id")
            if isinstance(value, str) and value:
                return value[:64]
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and item.startswith("{"):
            try:
                stack.append(jsonin.loads(item))
            except jsonin.JsonInputError:
                continue
    return ""


def record_outcome(*, principal: Principal, body: dict[str, Any]) -> ToolCallOutcome | None:
    """Record one PostToolUse (or PostToolUseFailure) call; None when it names no tool.

    The status comes from the ledger, not from the response: the agent's runtime reports
    which effect, the gateway says where it stands.
    """
    tool = body.get("tool_name")
    if not isinstance(tool, str) or not tool:
        return None
    response = body.get("tool_response")
    failed = body.get("hook_event_name") == "PostToolUseFailure" or "error" in body
    effect_id = status = ""
    is_gateway_tool, _contract = policy.gateway_contract(tool)
    if is_gateway_tool:
        effect_id = _effect_id_in(response)
        if effect_id:
            status = (
                Effect.objects.filter(pk=effect_id, tenant_id=principal.tenant_id)
                .values_list("status", flat=True)
                .first()
                or ""
            )
            if not status:
                effect_id = ""  # not an effect of this tenant: record nothing about it
    detail = body.get("error") if failed else response
    text = detail if isinstance(detail, str) else json.dumps(detail, default=str)
    tool_use_id = str(body.get("tool_use_id") or "")[:200]
    try:
        with transaction.atomic():
            return ToolCallOutcome.objects.create(
                tenant_id=principal.tenant_id,
                principal=principal,
                session_id=str(body.get("session_id") or "")[:200],
                tool_use_id=tool_use_id,
                tool_name=tool[:200],
                effect_id=effect_id,
                status=status,
                failed=failed,
                detail=text[:MAX_DETAIL],
            )
    except IntegrityError:
        return ToolCallOutcome.objects.get(tenant_id=principal.tenant_id, tool_use_id=tool_use_id)
