"""An MCP server whose tools are the gateway's effect types.

At start-up it reads ``GET /api/v1/effect-types`` and offers one tool per contract (its input
schema carries the contract's ``payload_schema``), plus read tools to follow effects. Every call
goes to the gateway's HTTP API through :mod:`gateway.client`; this process never touches the
database, so it can run beside the agent, with only the agent's token.

Errors the model can fix — an invalid payload (400), a reused key (422), a state conflict (409),
a missing permission (403), an unknown effect (404) — come back as tool results with
``isError`` and a text that says the fix. A refused token or a failing gateway is not the
model's to fix: those are protocol errors, which the host shows to its user.

The low-level ``mcp.server.Server`` is used rather than ``MCPServer``: the tools are data
(JSON Schemas from the contracts), not Python signatures.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from functools import partial
from typing import Any

import anyio.to_thread
import mcp_types as types
from mcp.server import Server
from mcp.shared.exceptions import MCPError

from gateway.client import (
    CONTEXT_KEYS,
    SETTLED,
    AuthenticationFailed,
    Conflict,
    Effect,
    EffectType,
    GatewayClient,
    GatewayError,
    IdempotencyKeyMismatch,
    NotFound,
    NotPermitted,
    RateLimited,
    ValidationFailed,
    tool_name,
)

logger = logging.getLogger(__name__)

SERVER_NAME = "effect-gateway"
MAX_WAIT = 120.0
KEY_RECIPE = (
    "A stable business key for this command: "
    "<effect-type>:<business-resource>:<intent-revision>:<scope>, e.g. "
    "billing.refund.create:ord_881:incident_120-v1:refund-bot. Re-use the SAME key when you "
    "retry or re-run; never a random value per attempt. A different payload needs a new key."
)
_CONTEXT_SCHEMA = {
    "type": "object",
    "description": "Correlation ids stored with the command (not part of its digest).",
    "properties": {name: {"type": "string", "maxLength": 200} for name in CONTEXT_KEYS},
    "additionalProperties": False,
}
_INTENT_SCHEMA = {
    "type": "object",
    "description": "Why: the plan step this command carries out (not part of its digest).",
    "properties": {
        "summary": {"type": "string", "maxLength": 4000},
        "task_id": {"type": "string", "maxLength": 200},
        "plan_revision": {"type": "integer"},
    },
}


def submit_input_schema(effect_type: EffectType) -> dict[str, Any]:
    """The tool's input: the key, the resource of the contract's type, the contract's payload
    schema (as served by the gateway, without its ``$schema``), the intent and correlation."""
    payload_schema = {k: v for k, v in effect_type.payload_schema.items() if k != "$schema"}
    resource_required = ["type", "id"]
    if effect_type.resource_version_required:
        resource_required.append("version")
    return {
        "type": "object",
        "properties": {
            "idempotency_key": {
                "type": "string",
                "minLength": 1,
                "maxLength": 255,
                "description": KEY_RECIPE,
            },
            "resource": {
                "type": "object",
                "description": "The business object this command changes, at the version you "
                "expect.",
                "properties": {
                    "type": {"type": "string", "const": effect_type.resource_type},
                    "id": {"type": "string", "minLength": 1, "maxLength": 200},
                    "version": {"type": "integer", "minimum": 0},
                },
                "required": resource_required,
                "additionalProperties": False,
            },
            "payload": payload_schema,
            "intent": _INTENT_SCHEMA,
            "context": _CONTEXT_SCHEMA,
        },
        "required": ["idempotency_key", "resource", "payload"],
        "additionalProperties": False,
    }


def destructive(effect_type: EffectType) -> bool:
    """Irreversible or money-moving effects are announced as destructive to the host."""
    return effect_type.irreversible or effect_type.financial


def submit_tool(effect_type: EffectType) -> types.Tool:
    approval = effect_type.approval.get("description", "")
    notes = [effect_type.description, f"Approval: {approval}" if approval else ""]
    if effect_type.irreversible:
        notes.append("Irreversible: it can only be followed by a correction.")
    notes.append(
        "Submitting is idempotent per idempotency_key: the same key and payload return the "
        "same effect (replayed=true) and the provider is called once."
    )
    return types.Tool(
        name=tool_name(effect_type.type),
        title=f"Submit {effect_type.type}",
        description=" ".join(note for note in notes if note),
        input_schema=submit_input_schema(effect_type),
        annotations=types.ToolAnnotations(
            title=f"Submit {effect_type.type}",
            read_only_hint=False,
            destructive_hint=destructive(effect_type),
            idempotent_hint=True,
            open_world_hint=True,
        ),
        meta={"effect-gateway/effect_type": effect_type.type},
    )


_READ = types.ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)

READ_TOOLS = [
    types.Tool(
        name="get_effect",
        title="Get an effect",
        description="The current state of one effect: status, approval, receipt, compensation.",
        input_schema={
            "type": "object",
            "properties": {"effect_id": {"type": "string", "minLength": 1}},
            "required": ["effect_id"],
            "additionalProperties": False,
        },
        annotations=_READ,
    ),
    types.Tool(
        name="list_effects",
        title="List effects",
        description="This tenant's effects, newest first, filtered by status, type or the "
        "correlation ids of a run (e.g. run_id).",
        input_schema={
            "type": "object",
            "properties": {
                "status": {
                    "type": "string",
                    "description": "One status or several, comma-"
                    "separated (UNKNOWN,AWAITING_APPROVAL).",
                },
                "type": {"type": "string"},
                "context": _CONTEXT_SCHEMA,
                "limit": {"type": "integer", "minimum": 1, "maximum": 100},
            },
            "additionalProperties": False,
        },
        annotations=_READ,
    ),
    types.Tool(
        name="wait_for_effect",
        title="Wait for an effect",
        description="Wait (long poll, no busy loop) until the effect is settled — CONFIRMED, "
        "REJECTED, EXPIRED, CANCELLED, COMPENSATED, COMPENSATION_FAILED — or one of `until`, "
        f"for at most timeout_seconds (≤ {MAX_WAIT:.0f}). Answers the state reached.",
        input_schema={
            "type": "object",
            "properties": {
                "effect_id": {"type": "string", "minLength": 1},
                "timeout_seconds": {"type": "number", "minimum": 0, "maximum": MAX_WAIT},
                "until": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["effect_id"],
            "additionalProperties": False,
        },
        annotations=_READ,
    ),
]


def _effect_summary(effect: Effect) -> str:
    parts = [f"Effect {effect.effect_id} ({effect.type}) is {effect.status}."]
    if effect.replayed:
        parts.append(
            "This key was already submitted with this payload: this is the effect it names; "
            "nothing new was sent to the provider."
        )
    if effect.awaiting_approval:
        parts.append(
            "It waits for a human approver in the gateway console; call wait_for_effect to "
            "follow it. Do not submit it again under another key."
        )
    elif not effect.settled:
        parts.append("Call wait_for_effect to follow it to its outcome.")
    receipt = effect.receipt or {}
    if receipt.get("provider_operation_id"):
        parts.append(
            f"Provider operation {receipt['provider_operation_id']} "
            f"({receipt.get('provider_status')})."
        )
    return " ".join(parts)


def _result(effect: Effect) -> types.CallToolResult:
    data = {**effect.raw, "replayed": effect.replayed}
    return types.CallToolResult(
        content=[
            types.TextContent(text=_effect_summary(effect)),
            types.TextContent(text=json.dumps(data, sort_keys=True)),
        ],
        structured_content=data,
    )


def _tool_error(text: str, problem: dict[str, Any] | None = None) -> types.CallToolResult:
    content = [types.TextContent(text=text)]
    if problem:
        content.append(types.TextContent(text=json.dumps(problem, sort_keys=True)))
    return types.CallToolResult(content=content, is_error=True)


def fixable_error(error: GatewayError) -> types.CallToolResult:
    """A gateway problem the model can fix, as a tool result that says how."""
    if isinstance(error, ValidationFailed):
        text = (
            f"The gateway refused the command: {error}. Fix these fields and call again with "
            "the same idempotency_key."
        )
    elif isinstance(error, IdempotencyKeyMismatch):
        text = (
            f"{error.detail} Send the identical payload to get that effect back, or use a new "
            "idempotency_key (e.g. bump the intent revision) for a different command."
        )
    elif isinstance(error, Conflict):
        text = f"{error.detail} Read the effect with get_effect and act on its current state."
    elif isinstance(error, NotPermitted):
        text = (
            f"{error.detail} This agent's gateway token may not do this; ask a human operator "
            "instead of trying another way around the gateway."
        )
    elif isinstance(error, NotFound):
        text = f"{error.detail} Check the effect_id (list_effects shows this tenant's effects)."
    elif isinstance(error, RateLimited):
        wait = f" after {error.retry_after:.0f} s" if error.retry_after else " later"
        text = f"The gateway is rate limiting this agent: call again{wait} with the same key."
    else:
        text = error.detail
    return _tool_error(text, error.problem)


def protocol_error(error: GatewayError) -> MCPError:
    if isinstance(error, AuthenticationFailed):
        message = (
            f"The gateway refused this MCP server's token ({error.detail}); set GATEWAY_TOKEN "
            "to a valid token and restart the server."
        )
    else:
        message = f"The Effect Gateway failed: {error.detail}"
    return MCPError(code=types.INTERNAL_ERROR, message=message, data=error.problem or None)


def _context(arguments: dict[str, Any], client_name: str | None, agent: str | None) -> dict:
    """The correlation stored with the command: the caller's ids over this server's defaults."""
    context: dict[str, str] = {"runtime": "mcp"}
    if agent or client_name:
        context["agent"] = str(agent or client_name)
    given = arguments.get("context")
    if isinstance(given, dict):
        context.update(
            {k: str(v) for k, v in given.items() if k in CONTEXT_KEYS and v not in (None, "")}
        )
    return context


class GatewayTools:
    """The tools of one gateway, and the handlers that call them."""

    def __init__(
        self, client: GatewayClient, effect_types: list[EffectType], *, agent: str | None = None
    ) -> None:
        self.client = client
        self.agent = agent
        self.by_tool = {tool_name(t.type): t for t in effect_types}
        self.tools = [submit_tool(t) for t in effect_types] + READ_TOOLS

    async def list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.tools)

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> Any:
        arguments = dict(params.arguments or {})
        call: Callable[[], Effect | list[Effect]]
        if params.name in self.by_tool:
            missing = [n for n in ("idempotency_key", "resource", "payload") if n not in arguments]
            if missing:
                return _tool_error(f"Missing {', '.join(missing)}. idempotency_key: {KEY_RECIPE}")
            call = partial(self._submit, self.by_tool[params.name], arguments, _client_name(ctx))
        elif params.name == "get_effect":
            call = partial(self.client.get, str(arguments.get("effect_id", "")))
        elif params.name == "wait_for_effect":
            call = partial(self._wait, arguments)
        elif params.name == "list_effects":
            call = partial(self._list, arguments)
        else:
            raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown tool: {params.name}")
        try:
            # The client is synchronous (and long polls): keep it off the event loop.
            outcome = await anyio.to_thread.run_sync(call)
        except (AuthenticationFailed, RateLimited) as error:
            if isinstance(error, RateLimited):
                return fixable_error(error)
            raise protocol_error(error) from error
        except (ValidationFailed, IdempotencyKeyMismatch, Conflict, NotPermitted, NotFound) as e:
            return fixable_error(e)
        except GatewayError as error:
            raise protocol_error(error) from error
        except ValueError as error:  # the client's own argument checks
            return _tool_error(str(error))
        if isinstance(outcome, list):
            data = {"results": [{**e.raw} for e in outcome]}
            lines = [_effect_summary(e) for e in outcome] or ["No effects match."]
            return types.CallToolResult(
                content=[types.TextContent(text="\n".join(lines))], structured_content=data
            )
        return _result(outcome)

    def _submit(self, effect_type: EffectType, args: dict[str, Any], client: str | None) -> Effect:
        return self.client.submit(
            effect_type.type,
            args["resource"],
            args["payload"],
            key=str(args["idempotency_key"]),
            intent=args.get("intent"),
            context=_context(args, client, self.agent),
        )

    def _wait(self, args: dict[str, Any]) -> Effect:
        timeout = min(float(args.get("timeout_seconds", 30)), MAX_WAIT)
        until = args.get("until")
        return self.client.wait(
            str(args.get("effect_id", "")),
            timeout,
            until=until if until else SETTLED,
        )

    def _list(self, args: dict[str, Any]) -> list[Effect]:
        context = args.get("context") or {}
        page = self.client.list(
            status=args.get("status"),
            type=args.get("type"),
            context={k: str(v) for k, v in context.items()},
            limit=args.get("limit") or 20,
        )
        return page.results


def _client_name(ctx: Any) -> str | None:
    try:
        return ctx.session.client_params.client_info.name
    except AttributeError:
        return None


def build_server(
    client: GatewayClient, effect_types: list[EffectType], *, agent: str | None = None
) -> Server:
    """The MCP server for one gateway; ``effect_types`` come from ``client.effect_types()``."""
    tools = GatewayTools(client, effect_types, agent=agent)
    schemas = {tool.name: tool.input_schema for tool in tools.tools}
    return Server(
        SERVER_NAME,
        version="1",
        title="Effect Gateway",
        instructions=(
            "Use these tools for every payment, deployment, ticket or email side effect: never "
            "call those systems directly. Each submit tool needs an idempotency_key derived "
            "from the business plan; re-use it on retries. Effects that need approval wait for "
            "a human: follow them with wait_for_effect."
        ),
        get_tool_input_schema=schemas.get,
        on_list_tools=tools.list_tools,
        on_call_tool=tools.call_tool,
    )
