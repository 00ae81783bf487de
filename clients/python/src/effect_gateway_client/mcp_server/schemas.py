"""Tool input schemas in the one form every client takes.

Two readers disagree with plain JSON Schema:

- OpenAI's strict mode (the Agents SDK's function tools, ChatGPT connectors) wants every
  property of an object listed in ``required`` and ``additionalProperties: false``; an
  optional field is spelled as one that may be null. A field a model must fill without a null
  option gets an invented value.
- Several MCP clients read ``type`` as one string: ``"type": ["string", "null"]`` makes them
  refuse the tool or drop the constraint (MCP Inspector's ``--strict`` warns about it).

So an optional field becomes ``{"anyOf": [<its schema>, {"type": "null"}]}``, every object
lists all its properties as required and allows no others, and no ``type`` is an array. The
gateway reads null as absent (a command's digest is the same with the field absent or null),
and the server drops nulls before it submits.
"""

from __future__ import annotations

from typing import Any

_NULL = {"type": "null"}
# Keywords that describe a property rather than constrain its value: kept beside the anyOf.
_ANNOTATIONS = ("description", "title", "examples")


def portable(schema: Any) -> Any:
    """``schema`` in the form above (a new object; the argument is not changed)."""
    if not isinstance(schema, dict):
        return schema
    schema = _split_type_union(dict(schema))
    if "anyOf" in schema:
        schema["anyOf"] = [portable(branch) for branch in schema["anyOf"]]
    if isinstance(schema.get("items"), dict):
        schema["items"] = portable(schema["items"])
    properties = schema.get("properties")
    if isinstance(properties, dict):
        required = set(schema.get("required", ()))
        schema["properties"] = {
            name: portable(sub) if name in required else nullable(portable(sub))
            for name, sub in properties.items()
        }
        schema["required"] = list(properties)
        schema["additionalProperties"] = False
    return schema


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` or null: an ``anyOf`` with a null branch, its annotations kept outside."""
    if "anyOf" in schema:
        branches = schema["anyOf"]
        if _NULL not in branches:
            schema = {**schema, "anyOf": [*branches, _NULL]}
        return schema
    notes = {key: schema[key] for key in _ANNOTATIONS if key in schema}
    value = {key: item for key, item in schema.items() if key not in _ANNOTATIONS}
    return {"anyOf": [value, _NULL], **notes}


def _split_type_union(schema: dict[str, Any]) -> dict[str, Any]:
    """``"type": ["x", "null"]`` as ``anyOf`` branches of one type each."""
    kinds = schema.get("type")
    if not isinstance(kinds, list):
        return schema
    others = [kind for kind in kinds if kind != "null"]
    rest = {key: value for key, value in schema.items() if key != "type"}
    if len(others) == 1:
        single = {**rest, "type": others[0]}
        return nullable(single) if "null" in kinds else single
    notes = {key: rest.pop(key) for key in _ANNOTATIONS if key in rest}
    branches = [{**rest, "type": kind} for kind in others]
    if "null" in kinds:
        branches.append(_NULL)
    return {"anyOf": branches, **notes}


def lenient(schema: Any) -> Any:
    """A portable schema as the server checks arguments against it: a field that may be null
    may also be left out (clients outside strict mode send only what they fill)."""
    if not isinstance(schema, dict):
        return schema
    schema = dict(schema)
    if "anyOf" in schema:
        schema["anyOf"] = [lenient(branch) for branch in schema["anyOf"]]
    if isinstance(schema.get("items"), dict):
        schema["items"] = lenient(schema["items"])
    properties = schema.get("properties")
    if isinstance(properties, dict):
        schema["properties"] = {name: lenient(sub) for name, sub in properties.items()}
        schema["required"] = [
            name for name in schema.get("required", ()) if not _accepts_null(properties[name])
        ]
    return schema


def _accepts_null(schema: Any) -> bool:
    return isinstance(schema, dict) and _NULL in schema.get("anyOf", ())
