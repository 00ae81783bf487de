"""The declaration of a REST provider: how to send one effect to any REST API and how to find
it again, as data (JSON, or anything that loads into the same dict).

``RestSpec.from_dict`` checks a declaration twice before anything uses it: against its own
JSON Schema (``SPEC_SCHEMA``: shapes, types, names of fields) and then against the rules a
schema cannot say (placeholders that exist, JSON pointers that parse, status codes that mean
one thing each, a key search that can find what the write sent). Every problem is reported
at once, each one naming its field (``write.path: ...``); a declaration never half-loads.

Templates: a URL path or header value holds ``{name}`` placeholders; a JSON body holds
``{{name}}`` in its string leaves. Names: ``payload.<field>``, ``resource.<field>`` (dotted,
digits index lists), ``payload`` and ``resource`` whole, ``effect.id``, ``effect.type``,
``effect.idempotency_key``, ``effect.payload_digest``; lookup paths use ``{operation_id}`` and
``{idempotency_key}``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

_POINTER = {
    "type": "string",
    "pattern": r"^(/([^~]|~[01])*)*$",
    "errorMessage": "is not a JSON pointer (RFC 6901): it must be empty or start with '/', "
    "and '~' may only appear as ~0 or ~1",
}
_CODES = {
    "type": "array",
    "items": {"type": "integer", "minimum": 400, "maximum": 599},
    "uniqueItems": True,
}
_STATUS_VALUES = {
    "type": "array",
    "items": {"type": ["string", "integer", "boolean"]},
    "uniqueItems": True,
}
_ANSWER = {
    "type": "object",
    "required": ["operation_id"],
    "additionalProperties": False,
    "properties": {
        "operation_id": _POINTER,
        "status": _POINTER,
        "digest": _POINTER,
        "result": {"type": "object", "additionalProperties": _POINTER},
    },
}
_HEADER_NAME = {"type": "string", "pattern": r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"}
_PATH = {
    "type": "string",
    "pattern": r"^/[^\s]*$",
    "errorMessage": "must start with '/' (relative to the provider's base URL) and hold no spaces",
}

SPEC_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "REST provider declaration",
    "type": "object",
    "required": ["write", "answer", "lookup"],
    "additionalProperties": False,
    "properties": {
        "description": {"type": "string"},
        "write": {
            "type": "object",
            "required": ["method", "path", "idempotency_header"],
            "additionalProperties": False,
            "properties": {
                "method": {"enum": ["POST", "PUT", "PATCH", "DELETE"]},
                "path": _PATH,
                "body": {},
                "headers": {"type": "object", "additionalProperties": {"type": "string"}},
                "idempotency_header": {
                    "anyOf": [_HEADER_NAME, {"type": "null"}],
                    "errorMessage": "must be an HTTP header name, or null (the provider has no "
                    "idempotency: at-most-once)",
                },
                "effect_headers": {"type": "boolean"},
            },
        },
        "answer": _ANSWER,
        "statuses": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "done": _STATUS_VALUES,
                "in_progress": _STATUS_VALUES,
                "failed": _STATUS_VALUES,
            },
        },
        "codes": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"refused": _CODES, "try_later": _CODES, "key_conflict": _CODES},
        },
        "lookup": {
            "type": "object",
            "minProperties": 1,
            "errorMessage": "declare by_operation_id, by_key or both",
            "additionalProperties": False,
            "properties": {
                "by_operation_id": {
                    "type": "object",
                    "required": ["path"],
                    "additionalProperties": False,
                    "properties": {"path": _PATH, "answer": _ANSWER},
                },
                "by_key": {
                    "type": "object",
                    "required": ["path"],
                    "additionalProperties": False,
                    "dependentRequired": {"items": ["key", "answer"], "key": ["items"]},
                    "errorMessage": "a search declares items, key and answer together",
                    "properties": {
                        "path": _PATH,
                        "items": _POINTER,
                        "key": _POINTER,
                        "answer": _ANSWER,
                    },
                },
            },
        },
    },
}

DEFAULT_REFUSED = (400, 409, 422)
DEFAULT_TRY_LATER = (429,)
EFFECT_FIELDS = ("id", "type", "idempotency_key", "payload_digest")
LOOKUP_NAMES = ("operation_id", "idempotency_key")

PATH_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
BODY_PLACEHOLDER = re.compile(r"\{\{([^{}]*)\}\}")
_DATA_NAME = re.compile(r"^(payload|resource)(\.[A-Za-z0-9_-]+)*$")


class RestSpecError(ValueError):
    """A declaration that cannot be used, with every problem found, each naming its field."""

    def __init__(self, problems: list[str], *, source: str = "") -> None:
        self.problems = problems
        where = f"{source}: " if source else ""
        super().__init__(f"{where}invalid REST provider declaration:\n  " + "\n  ".join(problems))


def resolve_pointer(document: Any, pointer: str) -> Any:
    """The value at an RFC 6901 pointer; KeyError when the document has none there."""
    value = document
    if pointer == "":
        return value
    for raw in pointer[1:].split("/"):
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(value, dict) and token in value:
            value = value[token]
        elif isinstance(value, list) and token.isdigit() and str(int(token)) == token:
            if int(token) >= len(value):
                raise KeyError(pointer)
            value = value[int(token)]
        else:
            raise KeyError(pointer)
    return value


def path_placeholders(template: str) -> list[str]:
    return [name.strip() for name in PATH_PLACEHOLDER.findall(template)]


def body_placeholders(template: Any) -> Iterator[tuple[str, str]]:
    """(where, name) for every ``{{name}}`` in the string leaves of a JSON body template."""
    for where, leaf in _leaves(template, "write.body"):
        for name in BODY_PLACEHOLDER.findall(leaf):
            yield where, name.strip()


def _leaves(template: Any, where: str) -> Iterator[tuple[str, str]]:
    if isinstance(template, str):
        yield where, template
    elif isinstance(template, dict):
        for key, value in template.items():
            yield from _leaves(value, f"{where}.{key}")
    elif isinstance(template, list):
        for index, value in enumerate(template):
            yield from _leaves(value, f"{where}[{index}]")


def is_write_name(name: str) -> bool:
    if name.startswith("effect."):
        return name.removeprefix("effect.") in EFFECT_FIELDS
    return bool(_DATA_NAME.match(name))


@dataclass(frozen=True)
class AnswerSpec:
    """Where an answer (or one item of a search) holds the operation."""

    operation_id: str
    status: str | None = None
    digest: str | None = None
    result: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AnswerSpec:
        return cls(
            operation_id=data["operation_id"],
            status=data.get("status"),
            digest=data.get("digest"),
            result=dict(data.get("result", {})),
        )


@dataclass(frozen=True)
class LookupSpec:
    """One lookup request: a path template and where the answer holds the operation. With
    ``items``, the answer is a list (a search): ``items`` points at the array, ``key`` at the
    idempotency key in each of its items."""

    path: str
    answer: AnswerSpec
    items: str | None = None
    key: str | None = None


@dataclass(frozen=True)
class RestSpec:
    """A validated declaration of one REST provider's write, answers and lookups."""

    method: str
    path: str
    body: Any
    headers: Mapping[str, str]
    idempotency_header: str | None
    effect_headers: bool
    answer: AnswerSpec
    done: tuple[Any, ...]
    in_progress: tuple[Any, ...]
    failed: tuple[Any, ...]
    refused: frozenset[int]
    try_later: frozenset[int]
    key_conflict: frozenset[int]
    by_operation_id: LookupSpec | None
    by_key: LookupSpec | None
    description: str = ""

    @property
    def at_most_once(self) -> bool:
        """No idempotency header: the provider cannot recognise a resend, so nothing may be
        sent again until a lookup has settled an uncertain send."""
        return self.idempotency_header is None

    def placeholders(self) -> list[tuple[str, str]]:
        """(where, name) of every placeholder the write request uses."""
        found = [("write.path", name) for name in path_placeholders(self.path)]
        for header, template in self.headers.items():
            found += [(f"write.headers.{header}", name) for name in path_placeholders(template)]
        return found + list(body_placeholders(self.body))

    def problems_with(self, payload_schema: Mapping[str, Any]) -> list[str]:
        """The write's ``payload.<field>`` placeholders whose field the contract's payload
        schema does not declare (its top-level ``properties``): for a start-up check that
        names the contract. A schema without ``properties`` is not checked."""
        properties = payload_schema.get("properties")
        if not isinstance(properties, Mapping):
            return []
        problems = []
        for where, name in self.placeholders():
            parts = name.split(".")
            if parts[0] == "payload" and len(parts) > 1 and parts[1] not in properties:
                problems.append(f"{where}: the payload schema has no field {parts[1]!r}")
        return problems

    @classmethod
    def from_file(cls, path: str | Path) -> RestSpec:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise RestSpecError([f"cannot read it: {exc}"], source=str(path)) from exc
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "") -> RestSpec:
        problems = [_describe(error) for error in _schema_errors(data)]
        if problems:
            raise RestSpecError(problems, source=source)
        problems = list(_rule_problems(data))
        if problems:
            raise RestSpecError(problems, source=source)
        return cls._build(data)

    @classmethod
    def _build(cls, data: Mapping[str, Any]) -> RestSpec:
        write, statuses, codes = data["write"], data.get("statuses", {}), data.get("codes", {})
        answer = AnswerSpec.from_dict(data["answer"])
        by_id = by_key = None
        if "by_operation_id" in data["lookup"]:
            raw = data["lookup"]["by_operation_id"]
            by_id = LookupSpec(raw["path"], _answer_or(raw, answer))
        if "by_key" in data["lookup"]:
            raw = data["lookup"]["by_key"]
            by_key = LookupSpec(
                raw["path"], _answer_or(raw, answer), raw.get("items"), raw.get("key")
            )
        return cls(
            method=write["method"],
            path=write["path"],
            body=write.get("body"),
            headers=dict(write.get("headers", {})),
            idempotency_header=write["idempotency_header"],
            effect_headers=write.get("effect_headers", True),
            answer=answer,
            done=tuple(statuses.get("done", ())),
            in_progress=tuple(statuses.get("in_progress", ())),
            failed=tuple(statuses.get("failed", ())),
            refused=frozenset(codes.get("refused", DEFAULT_REFUSED)),
            try_later=frozenset(codes.get("try_later", DEFAULT_TRY_LATER)),
            key_conflict=frozenset(codes.get("key_conflict", ())),
            by_operation_id=by_id,
            by_key=by_key,
            description=data.get("description", ""),
        )


def _answer_or(raw: Mapping[str, Any], default: AnswerSpec) -> AnswerSpec:
    return AnswerSpec.from_dict(raw["answer"]) if "answer" in raw else default


_VALIDATOR = Draft202012Validator(SPEC_SCHEMA)


def _schema_errors(data: Any) -> list[ValidationError]:
    return sorted(_VALIDATOR.iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path])


def _describe(error: ValidationError) -> str:
    where = ".".join(str(part) for part in error.absolute_path) or "(the declaration)"
    custom = error.schema.get("errorMessage") if isinstance(error.schema, dict) else None
    if custom and error.validator in ("pattern", "anyOf"):
        return f"{where}: {error.instance!r} {custom}"
    if custom and error.validator in ("minProperties", "dependentRequired"):
        return f"{where}: {custom}"
    return f"{where}: {error.message}"


def _rule_problems(data: Mapping[str, Any]) -> Iterator[str]:
    """What the schema cannot say: each placeholder names something, codes and statuses mean
    one thing each, and what a lookup searches for is something the write sent."""
    write = data["write"]
    in_path = path_placeholders(write["path"])
    for name in in_path:
        if not is_write_name(name):
            yield _unknown("write.path", name)
    in_headers: list[str] = []
    for header, template in write.get("headers", {}).items():
        for name in path_placeholders(template):
            in_headers.append(name)
            if not is_write_name(name):
                yield _unknown(f"write.headers.{header}", name)
    in_body: list[str] = []
    for where, name in body_placeholders(write.get("body")):
        in_body.append(name)
        if not is_write_name(name):
            yield _unknown(where, name, double=True)
    sent = in_path + in_headers + in_body  # every placeholder the write request carries
    if write.get("effect_headers", True):
        sent += ["effect.id", "effect.payload_digest"]  # X-Effect-Id, X-Payload-Digest
    yield from _lookup_problems(data["lookup"], in_path_or_body=in_path + in_body)
    yield from _meaning_problems(data)
    lookup_by_key = data["lookup"].get("by_key")
    if (
        lookup_by_key
        and write["idempotency_header"] is None
        and ("effect.idempotency_key" not in sent)
    ):
        yield (
            "lookup.by_key: the write sends no idempotency header and never sends "
            "{effect.idempotency_key} (in write.path, write.headers or write.body), so no "
            "lookup by key can find what it created"
        )
    if "digest" in data["answer"] and "effect.payload_digest" not in sent:
        yield (
            "answer.digest: the provider can only record the digest the write sends: put "
            "{{effect.payload_digest}} in write.body (or a header or the path)"
        )


def _lookup_problems(lookup: Mapping[str, Any], *, in_path_or_body: list[str]) -> Iterator[str]:
    by_id = lookup.get("by_operation_id")
    if by_id is not None:
        names = path_placeholders(by_id["path"])
        if "operation_id" not in names:
            yield "lookup.by_operation_id.path: must hold the {operation_id} placeholder"
        for name in names:
            if name != "operation_id":
                yield _unknown("lookup.by_operation_id.path", name, allowed="{operation_id}")
    by_key = lookup.get("by_key")
    if by_key is not None:
        names = path_placeholders(by_key["path"])
        for name in names:
            if name != "idempotency_key":
                yield _unknown("lookup.by_key.path", name, allowed="{idempotency_key}")
        if "items" not in by_key and "idempotency_key" not in names:
            yield (
                "lookup.by_key.path: must hold the {idempotency_key} placeholder (or declare "
                "items and key: a search whose items are matched on the key)"
            )
        if "items" in by_key and "effect.idempotency_key" not in in_path_or_body:
            yield (
                "lookup.by_key.key: a search matches the key in what the provider stored, "
                "but write.path and write.body never send {effect.idempotency_key}"
            )


def _meaning_problems(data: Mapping[str, Any]) -> Iterator[str]:
    codes = data.get("codes", {})
    named = {
        "refused": codes.get("refused", DEFAULT_REFUSED),
        "try_later": codes.get("try_later", DEFAULT_TRY_LATER),
        "key_conflict": codes.get("key_conflict", ()),
    }
    for kind in ("refused", "key_conflict"):
        for code in named[kind]:
            if code >= 500:
                yield (
                    f"codes.{kind}: {code} is a server error, which may come after the "
                    "provider acted: it is never a refusal"
                )
    yield from _overlaps("codes", named)
    statuses = data.get("statuses", {})
    yield from _overlaps("statuses", statuses)
    if "status" in data["answer"] and not statuses.get("done"):
        yield "statuses.done: answer.status is declared, so name the status values that mean done"
    if statuses and "status" not in data["answer"]:
        yield "statuses: declared, but answer.status does not say where the status is"


def _overlaps(where: str, named: Mapping[str, Any]) -> Iterator[str]:
    kinds = list(named)
    for i, first in enumerate(kinds):
        for second in kinds[i + 1 :]:
            both = [v for v in named[first] if v in named[second]]
            if both:
                yield f"{where}: {both} appear in both {first} and {second}"


def _unknown(where: str, name: str, *, double: bool = False, allowed: str = "") -> str:
    shown = f"{{{{{name}}}}}" if double else f"{{{name}}}"
    known = allowed or (
        "payload, payload.<field>, resource, resource.<field>, "
        + ", ".join(f"effect.{f}" for f in EFFECT_FIELDS)
    )
    return f"{where}: unknown placeholder {shown} (known: {known})"
