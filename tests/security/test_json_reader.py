"""Issue 13 item 6: the strict JSON reader, property-tested. Whatever the bytes, it returns a
value the ledger can store and the digest can name exactly, or raises JsonInputError —
never another exception (that would be a 500)."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.lib import jsonin
from gateway.lib.digest import sha256_digest

# Every code point, NUL and lone surrogates included.
TEXT = st.text(alphabet=st.characters(codec=None, min_codepoint=0), max_size=20)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | TEXT
)
VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(TEXT, children, max_size=4),
    max_leaves=40,
)


def _storable(value) -> None:
    """What PostgreSQL jsonb and RFC 8785 need: UTF-8 without NUL, safe integers, finite."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    assert "\x00" not in text
    text.encode("utf-8")  # no lone surrogate
    sha256_digest(value)


@settings(max_examples=400, deadline=None)
@given(VALUES)
def test_a_value_is_read_back_exactly_or_refused(value):
    text = json.dumps(value)  # escapes NUL and surrogates as \u0000 / \ud800, NaN as NaN
    try:
        loaded = jsonin.loads(text)
    except jsonin.JsonInputError:
        return
    assert loaded == value or json.dumps(loaded) == text  # (NaN != NaN never gets here)
    _storable(loaded)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_raise_anything_else(data):
    with contextlib.suppress(jsonin.JsonInputError):
        _storable(jsonin.loads(data))


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=200), st.sampled_from(["[", '{"a":']))
def test_nesting_beyond_the_limit_is_refused_before_parsing(depth, opener):
    closer = "]" if opener == "[" else "}"
    text = opener * depth + "1" + closer * depth
    try:
        jsonin.loads(text)
    except jsonin.JsonInputError as exc:
        assert depth > jsonin.MAX_DEPTH, exc
    else:
        assert depth <= jsonin.MAX_DEPTH


def test_brackets_inside_strings_do_not_count_as_nesting():
    text = '{"note": "' + "[{" * 100 + '", "list": [[1]]}'
    assert jsonin.loads(text) == {"note": "[{" * 100, "list": [[1]]}
    with pytest.raises(jsonin.JsonInputError, match="nested deeper"):
        jsonin.loads('{"note": "' + "[" * 40 + '", "x": ' + "[" * 40 + "1" + "]" * 40 + "}")


def test_an_integer_typed_schema_field_refuses_floats():
    validator = jsonin.payload_validator(
        {"type": "object", "properties": {"n": {"type": "integer"}}}
    )
    assert list(validator.iter_errors({"n": 9000.0}))
    assert list(validator.iter_errors({"n": True}))
    assert not list(validator.iter_errors({"n": 9000}))
