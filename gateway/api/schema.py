"""What drf-spectacular cannot infer, added to ``/api/schema/`` after generation.

Client generators (the TypeScript client in ``clients/typescript``, openapi-generator, …) must
see what the API really sends and takes:

- ``POST /api/v1/commands``: one request schema per effect type, a ``oneOf`` discriminated by
  ``type``, each with the contract's own ``payload_schema`` and resource type — not
  ``payload: unknown``.
- every error answer: RFC 9457 ``application/problem+json`` for 400, 401, 403, 404, 409, 413,
  415, 422 and 429, where the operation can give it.
- lists as they are answered: ``…/events`` are plain arrays (not cursor pages), the webhook
  endpoints, their messages, the effect types and the saga definitions are ``{"results": […]}``.
- enums where the API has a closed set (effect types, approval states, webhook event types).
"""

from __future__ import annotations

import copy
import re
from typing import Any

from gateway.choices import ApprovalState, EffectStatus
from gateway.contracts import CONTRACTS
from gateway.webhooks.choices import EventType

PROBLEM = "application/problem+json"
REF = "#/components/schemas/"

_PROBLEM_SCHEMA = {
    "type": "object",
    "description": "RFC 9457 problem details.",
    "properties": {
        "type": {"type": "string", "format": "uri"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "errors": {
            "type": "object",
            "description": "Field errors: {field: [message, …]} (400 only).",
            "additionalProperties": {"type": "array", "items": {"type": "string"}},
        },
        "effect_id": {"type": "string", "description": "422: the effect the key names."},
    },
    "required": ["type", "title", "status", "detail"],
}

_ERRORS = {
    400: "The request is not valid: problem.errors names each field (validation-error, "
    "malformed-request).",
    401: "No token, or a token that is unknown, revoked or expired.",
    403: "The principal's role, grants or a freeze do not allow this.",
    404: "Nothing of this id in the caller's tenant.",
    409: "The current state does not allow this (invalid-transition, digest-mismatch).",
    413: "The body is larger than the gateway accepts.",
    415: "Send application/json.",
    422: "The Idempotency-Key already names another command or run (a different digest).",
    429: "Rate limited: retry after Retry-After seconds, with the same Idempotency-Key.",
}

# POST operations that may answer 422 (an idempotency key reused for other content).
_KEYED = re.compile(r"^/api/v1/(commands|sagas|effects/\{[^}]+\}/compensate)$")
# Answers that are {"results": [...]} without pagination: path -> item schema.
_RESULTS_LISTS = {
    "/api/v1/webhook-endpoints": "Endpoint",
    "/api/v1/webhook-endpoints/{id}/messages": "Message",
    "/api/v1/effect-types": "EffectType",
    "/api/v1/saga-definitions": None,
}


def postprocess(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict:
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas["Problem"] = _PROBLEM_SCHEMA
    schemas["EffectType"] = _effect_type_schema()
    generated = set(schemas) - {"CommandSubmitRequest"}
    _commands_one_of(result, schemas)
    _enums(schemas)
    # Only the generated answers: the hand-written schemas say their own required fields.
    _required(schemas, skip=(set(schemas) - generated) | {"Problem", "EffectType"})
    _nullable(schemas)
    _nullable(result.get("paths", {}))
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            _lists(path, method, operation)
            _errors(path, method, operation)
    return result


# --- commands: one schema per effect type --------------------------------------------------


def _payload_schema(schema: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in copy.deepcopy(schema).items() if k != "$schema"}


def _command_variant(effect_type: str) -> dict[str, Any]:
    contract = CONTRACTS[effect_type]
    resource_required = ["type", "id"] + (["version"] if contract.resource_version_required else [])
    return {
        "type": "object",
        "title": f"Command {effect_type}",
        "description": contract.description,
        "properties": {
            "type": {"type": "string", "enum": [effect_type]},
            "resource": {
                "type": "object",
                "properties": {
                    "type": {"type": "string", "enum": [contract.resource_type]},
                    "id": {"type": "string", "minLength": 1, "maxLength": 200},
                    "version": {"type": "integer", "minimum": 0},
                },
                "required": resource_required,
            },
            "payload": _payload_schema(contract.payload_schema),
            "intent": {"$ref": REF + "CommandIntent"},
            "context": {"$ref": REF + "CommandContext"},
            "expires_in": {"type": "integer", "minimum": 1, "maximum": 604800},
        },
        "required": ["type", "resource", "payload"],
        "additionalProperties": False,
        "example": {"type": effect_type, **contract.example},
    }


def _variant_name(effect_type: str) -> str:
    return "Command" + "".join(part.title() for part in re.split(r"[._]", effect_type))


def _commands_one_of(result: dict[str, Any], schemas: dict[str, Any]) -> None:
    schemas["CommandIntent"] = {
        "type": "object",
        "description": "Why: the plan step (not part of the digest).",
        "properties": {
            "summary": {"type": "string", "maxLength": 4000},
            "task_id": {"type": "string", "maxLength": 200},
            "plan_revision": {"type": "integer"},
        },
    }
    schemas["CommandContext"] = {
        "type": "object",
        "description": "Correlation ids stored with the command (not part of the digest).",
        "properties": {
            name: {"type": "string", "maxLength": 200}
            for name in ("runtime", "session_id", "run_id", "call_id", "thread_id", "agent")
        },
    }
    mapping = {}
    for effect_type in CONTRACTS:
        name = _variant_name(effect_type)
        schemas[name] = _command_variant(effect_type)
        mapping[effect_type] = REF + name
    schemas["CommandSubmitRequest"] = {
        "oneOf": [{"$ref": ref} for ref in mapping.values()],
        "discriminator": {"propertyName": "type", "mapping": mapping},
        "description": "A command: its type chooses the resource type and payload schema.",
    }


def _effect_type_schema() -> dict[str, Any]:
    string = {"type": "string"}
    return {
        "type": "object",
        "description": "One side-effect contract (SPEC §3).",
        "properties": {
            "type": {"type": "string", "enum": list(CONTRACTS)},
            "description": string,
            "provider": string,
            "effect_class": {
                "type": "string",
                "enum": ["idempotent_write", "external_write", "financial_write"],
            },
            "owner": string,
            "resource_type": string,
            "resource_version_required": {"type": "boolean"},
            "payload_schema": {"type": "object"},
            "example": {"type": "object"},
            "commit_semantics": string,
            "completion_semantics": string,
            "idempotency": {"type": "object"},
            "approval": {"type": "object"},
            "recovery": {"type": "object"},
            "compensator": {"type": ["string", "null"]},
            "compensation_window_seconds": {"type": ["integer", "null"]},
            "irreversible_boundary": {"type": ["string", "null"]},
            "irreversible": {"type": "boolean"},
            "automatic_compensation": {"type": "boolean"},
            "receipt_fields": {"type": "array", "items": string},
            "personal_fields": {"type": "array", "items": string},
        },
        "required": [
            "type",
            "description",
            "provider",
            "effect_class",
            "owner",
            "resource_type",
            "resource_version_required",
            "payload_schema",
            "example",
            "approval",
            "compensator",
            "irreversible",
        ],
    }


def _enums(schemas: dict[str, Any]) -> None:
    effect = schemas.get("Effect", {}).get("properties", {})
    if "type" in effect:
        effect["type"] = {"type": "string", "enum": list(CONTRACTS)}
    for name in ("resource", "intent", "context"):
        if name in effect:
            effect[name] = {"type": "object", "readOnly": True}
    if "saga" in effect:
        effect["saga"] = {
            "type": ["object", "null"],
            "readOnly": True,
            "properties": {"id": {"type": "string"}, "step": {"type": "string"}},
            "required": ["id", "step"],
        }
    event = schemas.get("EffectEvent", {}).get("properties", {})
    for name in ("from_status", "to_status"):
        if name in event:
            # "" when there was no status before (the submission).
            event[name] = {"type": "string", "enum": ["", *EffectStatus.values]}
    if "data" in event:
        event["data"] = {"type": "object"}
    strings = {"type": "array", "items": {"type": "string"}}
    for name in ("Endpoint", "EndpointCreated"):
        endpoint = schemas.get(name, {}).get("properties", {})
        if "event_types" in endpoint:
            endpoint["event_types"] = {
                "type": "array",
                "items": {"type": "string", "enum": list(EventType.values)},
            }
            endpoint["principals"] = strings
            endpoint["run_ids"] = strings
    approval = schemas.get("Approval", {}).get("properties", {})
    if "state" in approval:
        approval["state"] = {"type": "string", "enum": list(ApprovalState.values)}


def _required(schemas: dict[str, Any], *, skip: set[str]) -> None:
    """An answer carries every field its serializer declares (null when empty): say so, or
    generated clients type every field of an answer as optional."""
    for name, schema in schemas.items():
        if name in skip or name.endswith("Request") or "properties" not in schema:
            continue
        schema["required"] = sorted(schema["properties"])


def _nullable(node: Any) -> None:
    """OpenAPI 3.0's ``nullable: true`` (DRF's pagination schemas still write it) is not
    JSON Schema: in 3.1 it is a ``null`` in ``type``."""
    if isinstance(node, dict):
        if node.pop("nullable", False) and isinstance(node.get("type"), str):
            node["type"] = [node["type"], "null"]
        for value in node.values():
            _nullable(value)
    elif isinstance(node, list):
        for value in node:
            _nullable(value)


# --- lists as answered ------------------------------------------------------------------------


def _json_schema(operation: dict[str, Any], status: str = "200") -> dict[str, Any] | None:
    content = operation["responses"].get(status, {}).get("content", {})
    return content.get("application/json")


def _lists(path: str, method: str, operation: dict[str, Any]) -> None:
    if method != "get":
        return
    body = _json_schema(operation)
    if body is None:
        return
    if path.endswith("/events"):
        # Every event of one effect or saga, oldest first, in one array: no cursor.
        ref = body["schema"].get("$ref", "")
        item = ref.replace("Paginated", "").removesuffix("List")
        if ref:
            body["schema"] = {"type": "array", "items": {"$ref": item}}
        operation["parameters"] = [
            p for p in operation.get("parameters", []) if p.get("name") not in {"cursor", "limit"}
        ]
    elif path in _RESULTS_LISTS:
        item_name = _RESULTS_LISTS[path]
        item = {"$ref": REF + item_name} if item_name else {"type": "object"}
        body["schema"] = {
            "type": "object",
            "properties": {"results": {"type": "array", "items": item}},
            "required": ["results"],
        }


# --- errors -----------------------------------------------------------------------------------


def _errors(path: str, method: str, operation: dict[str, Any]) -> None:
    if not path.startswith("/api/v1/"):
        return
    codes = {401, 403, 429}
    if "{" in path:
        codes.add(404)
    if method in {"post", "put", "patch"}:
        codes |= {400, 413, 415}
        if "{" in path:
            codes.add(409)
    if method == "get" and any(p.get("in") == "query" for p in operation.get("parameters", [])):
        codes.add(400)  # an unknown status filter, a bad cursor or wait
    if method == "post" and _KEYED.match(path):
        codes |= {400, 422}
    responses = operation["responses"]
    for code in sorted(codes):
        responses.setdefault(
            str(code),
            {
                "description": _ERRORS[code],
                "content": {PROBLEM: {"schema": {"$ref": REF + "Problem"}}},
            },
        )
    if 429 in codes:
        responses["429"].setdefault(
            "headers",
            {"Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait."}},
        )
