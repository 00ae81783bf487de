"""The one strict JSON reader for everything the gateway accepts from outside.

Python's ``json`` module accepts more than the ledger can store or the digest can name
exactly, and each excess used to surface as a 500 deep in a view or the database:

* ``9000.0`` is an integer to JSON Schema (draft 2020-12 counts any number with a zero
  fraction as one), but not to Python: a float amount escaped the budget, which counted only
  ``int``. Money is integer minor units end to end, so the payload validator below counts only
  exact integers as ``integer``.
* Integers beyond 2**53 − 1 are read exactly here but canonicalised (RFC 8785) as IEEE
  doubles: two different amounts could share one digest. I-JSON (RFC 7493) limits them; so
  do we. The same bound keeps every integer inside the BIGINT columns.
* ``\\u0000`` and lone surrogates (``\\ud800``) decode to Python strings that PostgreSQL
  (text and jsonb) and UTF-8 refuse.
* Deep nesting makes the C scanner recurse: the depth is checked *before* parsing, by one
  linear pass over the text, so no body can reach the recursion limit.
* Duplicate member names are ambiguous (which one did the approver see?) and refused.

Every refusal is a :class:`JsonInputError`; the API maps it to a 400.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import jsonschema
from jsonschema import validators

MAX_DEPTH = 32
MAX_SAFE_INTEGER = 2**53 - 1

# Strings are removed before the depth is counted: brackets inside them do not nest. The
# pattern has no nested or overlapping quantifiers, so it runs in linear time.
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BAD_CHARACTER = re.compile("[\x00\ud800-\udfff]")


class JsonInputError(ValueError):
    """The input is not JSON the gateway accepts; ``where`` names the place (a dotted path)."""

    def __init__(self, message: str, where: str = "body") -> None:
        super().__init__(message)
        self.where = where


def nesting_depth(text: str) -> int:
    """The deepest nesting of arrays/objects in JSON ``text``, counted without parsing it."""
    depth = deepest = 0
    for char in _STRING.sub("", text):
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name, value in pairs:
        if name in result:
            raise JsonInputError(f"the member {name!r} appears twice in one object")
        result[name] = value
    return result


def _no_constants(name: str) -> Any:
    raise JsonInputError(f"{name} is not a JSON number")


def _path(where: str, part: Any) -> str:
    return f"{where}.{part}" if where else str(part)


def check_value(value: Any, *, where: str = "", max_depth: int = MAX_DEPTH) -> None:
    """Refuse what the ledger cannot store or the digest cannot name exactly (module doc).

    Also used on values that did not come through :func:`loads` (form fields, tool calls).
    Iterative, so a deep value cannot exhaust the stack before its depth is seen.
    """
    stack: list[tuple[Any, str, int]] = [(value, where, 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth >= max_depth:
                raise JsonInputError(f"nested deeper than {max_depth} levels", path or "body")
            children = item.items() if isinstance(item, dict) else enumerate(item)
            for name, child in children:
                if isinstance(name, str):
                    _check_string(name, path or "body")
                stack.append((child, _path(path, name), depth + 1))
        elif isinstance(item, str):
            _check_string(item, path or "body")
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if abs(item) > MAX_SAFE_INTEGER:
                raise JsonInputError(
                    f"integers must lie within ±{MAX_SAFE_INTEGER} (RFC 7493)", path or "body"
                )
        elif isinstance(item, float) and not math.isfinite(item):
            raise JsonInputError("numbers must be finite", path or "body")


def _check_string(text: str, where: str) -> None:
    bad = _BAD_CHARACTER.search(text)
    if bad is not None:
        what = "NUL" if bad.group() == "\x00" else "a lone surrogate"
        raise JsonInputError(f"strings must not contain {what} (U+{ord(bad.group()):04X})", where)


def loads(raw: bytes | str, *, max_depth: int = MAX_DEPTH) -> Any:
    """Parse ``raw`` (UTF-8 bytes or text) strictly; raise JsonInputError on anything else."""
    if isinstance(raw, bytes | bytearray):
        try:
            text = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JsonInputError(f"the body is not UTF-8 (byte {exc.start})") from None
    else:
        text = raw
    if text.startswith("\ufeff"):
        raise JsonInputError("the body must not start with a byte order mark")
    # No deeper than it has opening brackets (counted in C): the scan, a Python loop over the
    # text (20 µs of a 200-byte body, as much as the parse), only for a body with enough.
    if text.count("[") + text.count("{") > max_depth and nesting_depth(text) > max_depth:
        raise JsonInputError(f"nested deeper than {max_depth} levels")
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except JsonInputError:
        raise
    except (ValueError, RecursionError) as exc:
        raise JsonInputError(f"not valid JSON: {exc}") from None
    check_value(value, max_depth=max_depth)
    return value


def _is_integer(checker: Any, instance: Any) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


#: Draft 2020-12 with ``integer`` meaning an exact integer: ``9000.0`` is refused (module doc).
StrictValidator = validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)


def payload_validator(schema: dict[str, Any]) -> Any:
    return StrictValidator(schema)
