"""docs/reference/api.md: the HTTP API from the OpenAPI schema drf-spectacular generates from
the views (the schema ``GET /api/schema/`` serves), rendered as Markdown: no JavaScript, no CDN.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from scripts.docs_reference.markdown import cell, code, header, slug, table

INTRO = """
The gateway's API for agents and tools: JSON over HTTP under `/api/v1/`, authenticated with a
bearer token (`Authorization: Bearer egw_…`, from `manage.py issue_token`) or, for the
console's own calls, the session cookie. Errors are RFC 9457 `application/problem+json`.
A running gateway serves the same schema as JSON at `/api/schema/` and browsable at
`/api/docs/` (Swagger UI, served from the gateway itself).
"""

METHODS = ("get", "post", "put", "patch", "delete")
Schema = Mapping[str, Any]


def openapi() -> dict[str, Any]:
    """The OpenAPI document, as `manage.py spectacular` writes it."""
    from drf_spectacular.drainage import GENERATOR_STATS
    from drf_spectacular.generators import SchemaGenerator

    # The generator's warnings are `manage.py spectacular --validate`'s business, not the
    # docs build's output.
    with GENERATOR_STATS.silence():
        return SchemaGenerator().get_schema(request=None, public=True)


def schema_anchor(name: str) -> str:
    return f"schema-{slug(name)}"


def operation_anchor(method: str, path: str) -> str:
    return f"{method}-{slug(path)}"


def type_of(schema: Schema) -> str:
    """A schema as a short type: a link for a named schema, `array of X`, `A or B`, enums."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{schema_anchor(name)})"
    for combinator, joiner in (("oneOf", " or "), ("anyOf", " or "), ("allOf", " and ")):
        if combinator in schema:
            return joiner.join(type_of(part) for part in schema[combinator])
    if "enum" in schema:
        return "one of " + ", ".join(code(value) for value in schema["enum"] if value is not None)
    kinds = schema.get("type", "any")
    names = kinds if isinstance(kinds, list) else [kinds]
    shown = []
    for kind in names:
        if kind == "array":
            shown.append("array of " + type_of(schema.get("items", {})))
        elif kind == "null":
            shown.append("null")
        else:
            shown.append(kind + (f" ({schema['format']})" if "format" in schema else ""))
    return " or ".join(shown)


def _parameters(parameters: Iterable[Schema]) -> str:
    rows = [
        [
            code(parameter["name"]),
            parameter["in"],
            type_of(parameter.get("schema", {})),
            "yes" if parameter.get("required") else "",
            parameter.get("description", ""),
        ]
        for parameter in parameters
    ]
    return "Parameters:\n\n" + table(["name", "in", "type", "required", "meaning"], rows)


def _body(body: Schema) -> str:
    lines = [
        f"- {code(media)}: {type_of(content.get('schema', {}))}"
        for media, content in body.get("content", {}).items()
    ]
    required = " (required)" if body.get("required") else ""
    return f"Request body{required}:\n\n" + "\n".join(lines) + "\n"


def _responses(responses: Mapping[str, Schema]) -> str:
    rows = []
    for status, response in responses.items():
        content = response.get("content", {})
        bodies = ", ".join(
            f"{type_of(value.get('schema', {}))} ({code(media)})"
            for media, value in content.items()
        )
        rows.append([code(status), response.get("description", ""), bodies or "no body"])
    return "Responses:\n\n" + table(["status", "meaning", "body"], rows)


def _operation(method: str, path: str, operation: Schema) -> str:
    title = f"### `{method.upper()} {path}` {{#{operation_anchor(method, path)}}}\n"
    parts = [title]
    text = (operation.get("description") or operation.get("summary") or "").strip()
    if text:
        parts.append(text + "\n")
    if operation.get("parameters"):
        parts.append(_parameters(operation["parameters"]))
    if operation.get("requestBody"):
        parts.append(_body(operation["requestBody"]))
    parts.append(_responses(operation.get("responses", {})))
    return "\n".join(parts)


def _group(path: str) -> str:
    """The resource an endpoint belongs to: `/api/v1/effects/{id}/approve` → `effects`."""
    segments = [part for part in path.split("/") if part and not part.startswith("{")]
    return segments[2] if len(segments) > 2 and segments[:2] == ["api", "v1"] else segments[0]


def _endpoints(paths: Mapping[str, Mapping[str, Schema]]) -> list[str]:
    groups: dict[str, list[tuple[str, str, Schema]]] = {}
    for path, item in paths.items():
        for method in METHODS:
            if method in item:
                groups.setdefault(_group(path), []).append((method, path, item[method]))
    index_rows, sections = [], []
    for group, operations in sorted(groups.items()):
        sections.append(f"## {group} {{#{slug(group)}}}\n")
        previous = ""
        for method, path, operation in operations:
            summary = (operation.get("description") or "").strip().split("\n")[0]
            link = f"[`{method.upper()} {path}`](#{operation_anchor(method, path)})"
            # A viewset's description is every one of its operations': say it once a group.
            index_rows.append([link, "" if summary == previous else summary])
            previous = summary
            sections.append(_operation(method, path, operation))
    return [table(["endpoint", "what it does"], index_rows), *sections]


def _property_rows(schema: Schema, prefix: str = "", depth: int = 0) -> list[list[str]]:
    """A row per property, and per nested property (`payload.amount`) a few levels down."""
    required = set(schema.get("required", []))
    rows = []
    for prop, value in schema.get("properties", {}).items():
        meaning = ("read-only. " if value.get("readOnly") else "") + value.get("description", "")
        rows.append(
            [code(prefix + prop), type_of(value), "yes" if prop in required else "", meaning]
        )
        if depth < 2 and "properties" in value:
            rows.extend(_property_rows(value, f"{prefix}{prop}.", depth + 1))
    return rows


def _schema(name: str, schema: Schema) -> str:
    parts = [f"### {name} {{#{schema_anchor(name)}}}\n"]
    if schema.get("description"):
        parts.append(cell(schema["description"]) + "\n")
    if schema.get("properties"):
        rows = _property_rows(schema)
        parts.append(table(["property", "type", "required", "meaning"], rows))
    elif "properties" not in schema:
        parts.append(f"Type: {type_of(schema)}.\n")
    return "\n".join(parts)


def render() -> str:
    document = openapi()
    info = document["info"]
    schemas = document.get("components", {}).get("schemas", {})
    return "\n".join(
        [
            header("HTTP API", INTRO, "the OpenAPI schema (drf-spectacular, from the views)"),
            f"{info['title']} {info['version']}, OpenAPI {document['openapi']}: "
            f"{info.get('description', '')}\n",
            *_endpoints(document["paths"]),
            "## Schemas {#schemas}\n",
            *(_schema(name, schema) for name, schema in sorted(schemas.items())),
        ]
    )
