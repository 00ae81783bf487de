"""What OpenAI's strict mode and MCP Inspector's ``--strict`` portability rules refuse in a tool's
input schema, for the MCP tests and ``scripts/check_real_clients.py``."""

from __future__ import annotations

from typing import Any


def strict_mode_problems(schema: Any, path: str = "$") -> list[str]:
    """A ``type`` that is an array, an object that does not list every property as required or
    allows others, anywhere in ``schema``."""
    problems: list[str] = []
    if isinstance(schema, dict):
        if isinstance(schema.get("type"), list):
            problems.append(f"{path}: type is an array {schema['type']}")
        properties = schema.get("properties")
        if isinstance(properties, dict):
            if sorted(schema.get("required", [])) != sorted(properties):
                problems.append(f"{path}: not every property is required")
            if schema.get("additionalProperties") is not False:
                problems.append(f"{path}: additionalProperties is not false")
            for name, sub in properties.items():
                problems += strict_mode_problems(sub, f"{path}.{name}")
        for index, branch in enumerate(schema.get("anyOf", ())):
            problems += strict_mode_problems(branch, f"{path}|{index}")
        if isinstance(schema.get("items"), dict):
            problems += strict_mode_problems(schema["items"], f"{path}[]")
    return problems
