"""An MCP server whose tools are the gateway's effect types (the mcp 1.x SDK).

It reads ``GET /api/v1/effect-types?permitted=true`` with the caller's token and offers one tool
per contract that token may submit (its input schema carries the contract's
``payload_schema``), plus read tools to follow effects. Every call goes to the gateway's HTTP
API through :mod:`effect_gateway_client`; this process never touches the database.

Two ways to run it:

- stdio (one agent, beside the host): the token comes from ``GATEWAY_TOKEN``.
- streamable HTTP (remote): every MCP request carries ``Authorization: Bearer <gateway
  token>``; the server acts with *that* token, so one server serves many agents, each with its
  own tools and permissions. A request without a valid token is answered 401.

What the model reads: Claude Code hands the model only ``structuredContent`` when a result has
one, other hosts only the text. So each result carries its guidance (``next_step``) inside
the structured JSON, and the text block is that same JSON — every sentence said once.

Errors the model can fix — arguments that do not match the tool's input schema, an invalid
payload (400), a reused key (422), a state conflict (409), a missing permission (403), an
unknown effect (404), rate limiting — come back as tool results with ``isError`` and a
``next_step`` that says the fix. A refused token or a failing gateway is not the model's to
fix: those are JSON-RPC errors, which the host shows to its user.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import anyio.to_thread
import jsonschema
from mcp import types
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import McpError

from effect_gateway_client import (
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
    __version__,
    tool_name,
)
from effect_gateway_client.mcp_server.schemas import lenient, portable

logger = logging.getLogger(__name__)

SERVER_NAME = "effect-gateway"
# Over HTTP, the MCP endpoint's own URL (its OAuth resource) goes with every gateway request in
# this header: the gateway accepts an OAuth access token only from the endpoint it was issued
# for (RFC 8707), so a token minted for another audience is refused here.
RESOURCE_HEADER = "X-Gateway-Resource"
MAX_WAIT = 120.0
# How long one token's tool list is reused before the gateway is asked again (grants change).
TOOLS_TTL = 30.0
KEY_RECIPE = (
    "A stable business key for this command: "
    "<effect-type>:<business-resource>:<intent-revision>:<scope>, e.g. "
    "billing.refund.create:ord_881:incident_120-v1:refund-bot. Re-use the SAME key when you "
    "retry or re-run; never a random value per attempt. A different payload needs a new key."
)
# Optional fields accept null (= not given): OpenAI's strict mode makes every property
# required, and a model told it must fill a field without a null option invents a value.
_CONTEXT_SCHEMA = {
    "type": ["object", "null"],
    "description": "Correlation ids stored with the command (not part of its digest).",
    "properties": {name: {"type": ["string", "null"], "maxLength": 200} for name in CONTEXT_KEYS},
    "additionalProperties": False,
}
_INTENT_SCHEMA = {
    "type": ["object", "null"],
    "description": "Why: the plan step this command carries out (not part of its digest).",
    "properties": {
        "summary": {"type": ["string", "null"], "maxLength": 4000},
        "task_id": {"type": ["string", "null"], "maxLength": 200},
        "plan_revision": {"type": ["integer", "null"]},
    },
}


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer …`` header, or None."""
    scheme, _, token = (authorization or "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def submit_input_schema(effect_type: EffectType) -> dict[str, Any]:
    """The tool's input: the key, the resource of the contract's type, the contract's payload
    schema (as served by the gateway, without its ``$schema``), the intent and correlation."""
    payload_schema = {k: v for k, v in effect_type.payload_schema.items() if k != "$schema"}
    resource_required = ["type", "id"]
    if effect_type.resource_version_required:
        resource_required.append("version")
    version = {"type": "integer", "minimum": 0}
    if not effect_type.resource_version_required:
        version = {"type": ["integer", "null"], "minimum": 0}
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
                    "version": version,
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


def additive(effect_type: EffectType) -> bool:
    """Only adds something new (a ticket, a reservation, a shipment) without changing or
    removing what exists, moving money or sending what cannot be unsent."""
    return (
        effect_type.type.endswith(".create")
        and not effect_type.financial
        and not effect_type.irreversible
    )


def destructive(effect_type: EffectType) -> bool:
    """MCP's ``destructiveHint``: false promises additive updates only, so every other write —
    money, releases, cancellations, closing, sending mail — is announced as destructive."""
    return not additive(effect_type)


def submit_tool(effect_type: EffectType) -> types.Tool:
    approval = effect_type.approval.get("description", "")
    notes = [effect_type.description, f"Approval: {approval}" if approval else ""]
    if effect_type.irreversible and "irreversible" not in effect_type.description.lower():
        notes.append("Irreversible: it can only be followed by a correction.")
    notes.append("Idempotent per idempotency_key: the same key and payload return the same effect.")
    return types.Tool(
        name=tool_name(effect_type.type),
        title=f"Submit {effect_type.type}",
        description=" ".join(note for note in notes if note),
        inputSchema=portable(submit_input_schema(effect_type)),
        annotations=types.ToolAnnotations(
            title=f"Submit {effect_type.type}",
            readOnlyHint=False,
            destructiveHint=destructive(effect_type),
            idempotentHint=True,
            openWorldHint=True,
        ),
        _meta={"effect-gateway/effect_type": effect_type.type},
    )


_READ = types.ToolAnnotations(readOnlyHint=True, idempotentHint=True, openWorldHint=False)

READ_TOOLS = [
    types.Tool(
        name="get_effect",
        title="Get an effect",
        description="The current state of one effect: status, approval, receipt, compensation.",
        inputSchema={
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
        inputSchema={
            "type": "object",
            "properties": {
                "status": {
                    "type": ["string", "null"],
                    "description": "One status or several, comma-separated "
                    "(UNKNOWN,AWAITING_APPROVAL).",
                },
                "type": {"type": ["string", "null"]},
                "context": _CONTEXT_SCHEMA,
                "limit": {"type": ["integer", "null"], "minimum": 1, "maximum": 100},
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
        f"for at most timeout_seconds (≤ {MAX_WAIT:.0f}, default 30). Answers the state reached.",
        inputSchema={
            "type": "object",
            "properties": {
                "effect_id": {"type": "string", "minLength": 1},
                "timeout_seconds": {"type": ["number", "null"], "minimum": 0, "maximum": MAX_WAIT},
                "until": {"type": ["array", "null"], "items": {"type": "string"}},
            },
            "required": ["effect_id"],
            "additionalProperties": False,
        },
        annotations=_READ,
    ),
]
for _tool in READ_TOOLS:
    _tool.inputSchema = portable(_tool.inputSchema)


# --- what the model reads -------------------------------------------------------------------


def approval_url(base_url: str, effect_id: str) -> str:
    """The console page where an approver signs this effect off."""
    return f"{base_url.rstrip('/')}/effects/{effect_id}"


def next_step(effect: Effect, base_url: str) -> str:
    """What the model should do now, in one paragraph (it reads this in the structured JSON)."""
    parts = []
    if effect.replayed:
        parts.append(
            "This idempotency_key was already submitted with this payload: this is the effect "
            "it names; nothing new was sent to the provider."
        )
    if effect.awaiting_approval:
        parts.append(
            f"The command is recorded and waits for a human approver "
            f"({approval_url(base_url, effect.effect_id)}). It is not done yet: call "
            f"wait_for_effect with effect_id {effect.effect_id!r} (timeout_seconds up to "
            f"{MAX_WAIT:.0f}) and call it again while the status is AWAITING_APPROVAL. Do not "
            "submit it again under another key and do not report it as done before CONFIRMED."
        )
    elif effect.status == "CONFIRMED":
        receipt = effect.receipt or {}
        operation = receipt.get("provider_operation_id")
        parts.append(
            f"Done: the provider confirmed it (operation {operation})."
            if operation
            else "Done: the provider confirmed it."
        )
    elif effect.status in {"REJECTED", "EXPIRED", "CANCELLED"}:
        parts.append(
            f"It ended {effect.status} and nothing was done by the provider. Tell the user; "
            "submit again (with a new intent revision in the key) only if the plan changes."
        )
    elif effect.status == "COMPENSATED":
        parts.append(
            "It happened at the provider and was then undone by its compensation (a separate "
            "command, under compensation.compensated_by). Do not submit it again."
        )
    elif effect.status == "COMPENSATION_FAILED":
        parts.append(
            "It happened at the provider, and undoing it FAILED: it is NOT undone. Its owner "
            "has been told; tell the user, and do not retry the compensation or resubmit."
        )
    else:
        parts.append(
            f"It is {effect.status}: call wait_for_effect with effect_id {effect.effect_id!r} "
            "to follow it to its outcome."
        )
    return " ".join(parts)


def effect_result(effect: Effect, base_url: str) -> types.CallToolResult:
    data = {**effect.raw, "replayed": effect.replayed, "next_step": next_step(effect, base_url)}
    if effect.awaiting_approval:
        data["approval_url"] = approval_url(base_url, effect.effect_id)
    return _structured(data)


def _structured(data: dict[str, Any], *, is_error: bool = False) -> types.CallToolResult:
    # The text block is the structured JSON itself (MCP's advice for older hosts), so a host
    # that shows both does not say anything twice in other words.
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(data, sort_keys=True))],
        structuredContent=data,
        isError=is_error,
    )


def tool_error(
    what: str, fix: str, problem: dict[str, Any] | None = None, **extra: Any
) -> types.CallToolResult:
    """An error the model can fix: what went wrong, and the fix (``next_step``)."""
    data: dict[str, Any] = {"error": what, "next_step": fix, **extra}
    if problem:
        data["problem"] = {
            k: problem[k]
            for k in ("type", "title", "status", "errors", "effect_id")
            if k in problem and k != "detail"
        }
    return _structured(data, is_error=True)


def fixable_error(error: GatewayError) -> types.CallToolResult:
    """A gateway problem the model can fix, as a tool result that says how."""
    if isinstance(error, ValidationFailed):
        return tool_error(
            f"The gateway refused the command: {error.detail}",
            "Fix the fields named in problem.errors and call again with the same idempotency_key.",
            error.problem,
        )
    if isinstance(error, IdempotencyKeyMismatch):
        return tool_error(
            error.detail.split(" Send the identical")[0],
            "Send the identical payload to get that effect back, or use a new idempotency_key "
            "(e.g. bump the intent revision) for a different command.",
            error.problem,
        )
    if isinstance(error, Conflict):
        return tool_error(
            error.detail, "Read the effect with get_effect and act on its state.", error.problem
        )
    if isinstance(error, NotPermitted):
        return tool_error(
            error.detail,
            "This agent's gateway token may not do this; ask a human operator instead of "
            "trying another way around the gateway.",
            error.problem,
        )
    if isinstance(error, NotFound):
        return tool_error(
            error.detail,
            "Check the effect_id (list_effects shows this tenant's effects).",
            error.problem,
        )
    if isinstance(error, RateLimited):
        wait = f"after {error.retry_after:.0f} s" if error.retry_after else "later"
        return tool_error(
            "The gateway is rate limiting this agent.",
            f"Call again {wait} with the same idempotency_key.",
            error.problem,
        )
    return tool_error(error.detail, "Read the problem and correct the call.", error.problem)


def protocol_error(error: GatewayError) -> McpError:
    if isinstance(error, AuthenticationFailed):
        message = (
            f"The gateway refused this token ({error.detail}); give the MCP server a valid "
            "gateway token (GATEWAY_TOKEN, or the Authorization header over HTTP)."
        )
    else:
        message = f"The Effect Gateway failed: {error.detail}"
    return McpError(types.ErrorData(code=types.INTERNAL_ERROR, message=message))


# --- argument checks --------------------------------------------------------------------------


def _where(error: jsonschema.ValidationError) -> str:
    return "/".join(str(part) for part in error.absolute_path) or "(the arguments)"


def argument_errors(arguments: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """Each way ``arguments`` miss the tool's input schema, as a sentence with its fix."""
    problems: list[str] = []
    for name, value in arguments.items():
        expected = (schema.get("properties") or {}).get(name) or {}
        wants_object = "object" in _types(expected)
        if wants_object and isinstance(value, str):
            hint = "a JSON object"
            try:
                parsed = json.loads(value)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                hint = "the object itself, not a string holding JSON: pass " + json.dumps(parsed)
            problems.append(f"{name}: got a string; expected {hint}.")
    if problems:
        return problems
    validator = jsonschema.Draft202012Validator(schema)
    for error in sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path)):
        where = _where(error)
        if error.validator == "required":
            missing = error.message.split("'")[1] if "'" in error.message else error.message
            fix = f" ({KEY_RECIPE})" if missing == "idempotency_key" else ""
            problems.append(f"{where}: missing required field {missing!r}{fix}.")
        elif error.validator == "additionalProperties":
            allowed = sorted((error.schema.get("properties") or {}).keys())
            problems.append(f"{where}: {error.message}; allowed fields: {', '.join(allowed)}.")
        elif error.validator == "const":
            problems.append(f"{where}: must be {error.validator_value!r}.")
        elif error.validator == "enum":
            choices = ", ".join(repr(v) for v in error.validator_value)
            problems.append(f"{where}: {error.instance!r} is not one of {choices}.")
        else:
            problems.append(f"{where}: {error.message}.")
    return problems


def _types(schema: dict[str, Any]) -> set[str]:
    kind = schema.get("type")
    if isinstance(kind, list):
        return set(kind)
    return {kind} if kind else set()


def _without_nulls(value: Any) -> Any:
    """Null means "not given" (see the nullable optional fields above)."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value


# --- the server -------------------------------------------------------------------------------


class GatewayTools:
    """The tools of one gateway, and the handlers that call them, per token."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        agent: str | None = None,
        timeout: float = 15.0,
        client_factory: Callable[[str], GatewayClient] | None = None,
        resource: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.agent = agent
        self.resource = resource
        headers = {RESOURCE_HEADER: resource} if resource else None
        self._factory = client_factory or (
            lambda token: GatewayClient(self.base_url, token, timeout=timeout, headers=headers)
        )
        self._clients: dict[str, GatewayClient] = {}
        self._tools: dict[str, tuple[float, list[types.Tool], dict[str, EffectType]]] = {}
        self._lock = threading.Lock()
        self.server: Server | None = None

    # -- per token -----------------------------------------------------------------------

    def _token(self) -> str:
        """Over HTTP, the token of the request being served (its Authorization header: the
        session's tasks do not inherit the request's context, the SDK's request context
        carries the request); on stdio, the server's own."""
        token = None
        try:
            request = self.server.request_context.request if self.server else None
        except LookupError:
            request = None
        if request is not None and hasattr(request, "headers"):
            token = bearer_token(request.headers.get("authorization"))
        token = token or self.token
        if not token:
            raise McpError(types.ErrorData(code=types.INVALID_REQUEST, message="No gateway token."))
        return token

    def client(self, token: str | None = None) -> GatewayClient:
        token = token or self._token()
        with self._lock:
            if token not in self._clients:
                self._clients[token] = self._factory(token)
            return self._clients[token]

    def catalogue(
        self, token: str | None = None, *, fresh: bool = False
    ) -> tuple[list[types.Tool], dict]:
        """The token's tools: the effect types its grants allow, plus the read tools.
        ``fresh`` asks the gateway even when the list is cached (the HTTP transport's token
        check: a revoked token is refused at its next request).
        Raises GatewayError (e.g. AuthenticationFailed for a bad token)."""
        token = token or self._token()
        cached = self._tools.get(token)
        if cached and cached[0] > time.monotonic() and not fresh:
            return cached[1], cached[2]
        effect_types = self.client(token).effect_types(permitted=True)
        by_tool = {tool_name(t.type): t for t in effect_types}
        tools = [submit_tool(t) for t in effect_types] + READ_TOOLS
        self._tools[token] = (time.monotonic() + TOOLS_TTL, tools, by_tool)
        return tools, by_tool

    def close(self) -> None:
        for client in self._clients.values():
            client.close()

    # -- handlers ------------------------------------------------------------------------

    async def list_tools(self, request: types.ListToolsRequest) -> types.ServerResult:
        token = self._token()
        try:
            tools, _ = await anyio.to_thread.run_sync(self.catalogue, token)
        except GatewayError as error:
            raise protocol_error(error) from error
        return types.ServerResult(types.ListToolsResult(tools=tools))

    async def call_tool(self, request: types.CallToolRequest, client_name: str | None):
        token = self._token()
        name = request.params.name
        arguments = dict(request.params.arguments or {})
        try:
            tools, by_tool = await anyio.to_thread.run_sync(self.catalogue, token)
        except GatewayError as error:
            raise protocol_error(error) from error
        schema = next((t.inputSchema for t in tools if t.name == name), None)
        if schema is None:
            return tool_error(
                f"There is no tool {name!r} for this agent.",
                "Call one of: " + ", ".join(t.name for t in tools) + ".",
            )
        problems = argument_errors(arguments, lenient(schema))
        if problems:
            return tool_error(
                "The arguments do not match the tool's input schema: " + " ".join(problems),
                "Correct these fields and call the tool again with the same idempotency_key.",
            )
        arguments = _without_nulls(arguments)
        client = self.client(token)
        call: Callable[[], Effect | list[Effect]]
        if name in by_tool:
            call = partial(self._submit, client, by_tool[name], arguments, client_name)
        elif name == "get_effect":
            call = partial(client.get, str(arguments["effect_id"]))
        elif name == "wait_for_effect":
            call = partial(self._wait, client, arguments)
        else:
            call = partial(self._list, client, arguments)
        try:
            # The client is synchronous (and long polls): keep it off the event loop.
            outcome: Effect | list[Effect] = await anyio.to_thread.run_sync(call)
        except RateLimited as error:
            return fixable_error(error)
        except AuthenticationFailed as error:
            raise protocol_error(error) from error
        except (ValidationFailed, IdempotencyKeyMismatch, Conflict, NotPermitted, NotFound) as e:
            return fixable_error(e)
        except GatewayError as error:
            raise protocol_error(error) from error
        except ValueError as error:  # the client's own argument checks
            return tool_error(str(error), "Correct the arguments and call again.")
        if isinstance(outcome, list):
            return _structured(
                {
                    "results": [
                        {**e.raw, "next_step": next_step(e, self.base_url)} for e in outcome
                    ],
                    "next_step": "" if outcome else "No effects match these filters.",
                }
            )
        return effect_result(outcome, self.base_url)

    def _submit(
        self,
        client: GatewayClient,
        effect_type: EffectType,
        args: dict[str, Any],
        client_name: str | None,
    ) -> Effect:
        return client.submit(
            effect_type.type,
            args["resource"],
            args["payload"],
            key=str(args["idempotency_key"]),
            intent=args.get("intent"),
            context=_context(args, client_name, self.agent),
        )

    def _wait(self, client: GatewayClient, args: dict[str, Any]) -> Effect:
        timeout = min(float(args.get("timeout_seconds", 30)), MAX_WAIT)
        until = args.get("until")
        return client.wait(str(args["effect_id"]), timeout, until=until if until else SETTLED)

    def _list(self, client: GatewayClient, args: dict[str, Any]) -> list[Effect]:
        context = args.get("context") or {}
        page = client.list(
            status=args.get("status"),
            type=args.get("type"),
            context={k: str(v) for k, v in context.items()},
            limit=args.get("limit") or 20,
        )
        return page.results


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


INSTRUCTIONS = (
    "Use these tools for every payment, deployment, ticket or email side effect: never call "
    "those systems directly. Each submit tool needs an idempotency_key derived from the "
    "business plan; re-use it on retries. A result's next_step says what to do next; effects "
    "that need approval are recorded and wait for a human: follow them with wait_for_effect."
)


def build_server(tools: GatewayTools) -> Server:
    """The MCP server for one gateway. Handlers are registered on the request table directly
    (not with the SDK's decorators): the SDK's own input validation would answer its raw
    jsonschema message, and its catch-all would turn a refused token into a tool result."""
    server: Server = Server(SERVER_NAME, version=__version__, instructions=INSTRUCTIONS)

    async def call_tool(request: types.CallToolRequest) -> types.ServerResult:
        try:
            params = server.request_context.session.client_params
            name = params.clientInfo.name if params is not None else None  # not initialized
        except (AttributeError, LookupError):
            name = None
        return types.ServerResult(await tools.call_tool(request, name))

    tools.server = server
    server.request_handlers[types.ListToolsRequest] = tools.list_tools
    server.request_handlers[types.CallToolRequest] = call_tool
    return server


__all__ = [
    "RESOURCE_HEADER",
    "SERVER_NAME",
    "GatewayTools",
    "additive",
    "argument_errors",
    "bearer_token",
    "build_server",
    "destructive",
    "next_step",
    "submit_input_schema",
    "tool_name",
]
