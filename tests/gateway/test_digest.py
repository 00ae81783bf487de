"""The payload digest against independent computations of RFC 8785."""

import hashlib
import json

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.lib.digest import _plain, canonical_json, payload_digest
from gateway.models import Receipt


def test_rfc8785_example_from_the_rfc():
    # RFC 8785 §3.2.2: number serialisation, string escaping and key order in one object.
    value = {
        "numbers": [333333333.33333329, 1e30, 4.50, 2e-3, 0.000000000000000000000000001],
        "string": "\u20ac$\u000f\u000aA'\u0042\u0022\u005c\\\"/",
        "literals": [None, True, False],
    }
    expected = (
        '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
        '"string":"€$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
    )
    assert canonical_json(value).decode("utf-8") == expected


def test_keys_sort_by_utf16_code_units():
    # "\U0001F600" (a surrogate pair in UTF-16) sorts before "\uFB01" in JCS, after it in
    # a naive code-point sort.
    assert canonical_json({"\ufb01": 1, "\U0001f600": 2}).decode() == '{"😀":2,"ﬁ":1}'


def test_digest_of_the_spec_example_matches_an_independent_computation():
    resource = {"type": "order", "id": "ord_881", "version": 17}
    payload = {"amount": 500, "currency": "EUR", "reason": "duplicate charge"}
    # For ASCII text and integers JCS equals sorted keys without whitespace.
    independent = json.dumps(
        {"type": "billing.refund.create", "resource": resource, "payload": payload},
        sort_keys=True,
        separators=(",", ":"),
    )
    expected = "sha256:" + hashlib.sha256(independent.encode()).hexdigest()
    assert payload_digest(type="billing.refund.create", resource=resource, payload=payload) == (
        expected
    )


def test_digest_ignores_key_order_but_not_values():
    a = payload_digest(type="t", resource={"id": "1", "type": "x"}, payload={"a": 1, "b": 2})
    b = payload_digest(type="t", resource={"type": "x", "id": "1"}, payload={"b": 2, "a": 1})
    c = payload_digest(type="t", resource={"type": "x", "id": "1"}, payload={"b": 2, "a": 3})
    assert a == b
    assert a != c


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**60), max_value=2**60)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(_json)
def test_the_fast_encoder_writes_what_rfc8785_writes(value):
    """canonical_json takes the json module's C encoder for plain values: byte for byte what
    rfc8785 writes (control characters, non-ASCII text, big integers, keys outside ASCII),
    or rfc8785's own error."""
    try:
        expected = rfc8785.dumps(value)
    except Exception as exc:
        with pytest.raises(type(exc)):
            canonical_json(value)
        return
    assert canonical_json(value) == expected


def test_string_enums_are_written_as_the_strings_they_are():
    """A receipt's fields hold Django choices (str subclasses): the fast encoder takes them,
    with rfc8785's bytes, and a key that is one sorts as its string."""
    value = {
        "source": Receipt.Source.DISPATCH,
        Receipt.Source.RECONCILER: [Receipt.Source.DISPATCH, 'quote " and \u0007'],
        "Z": 1,
    }
    assert _plain(value)
    assert canonical_json(value) == rfc8785.dumps(value)
    assert canonical_json(value) == rfc8785.dumps(json.loads(json.dumps(value)))


def test_the_fast_encoder_escapes_controls_as_rfc8785_does():
    value = {"a": "".join(map(chr, range(0, 0x80))) + "\u2028\u00e9\U0001f600", "b": [True, None]}
    assert canonical_json(value) == rfc8785.dumps(value)


@pytest.mark.parametrize("number", [2**53, -(2**53), 2**60])
def test_integers_beyond_doubles_are_refused_as_rfc8785_refuses_them(number):
    with pytest.raises(rfc8785.IntegerDomainError):
        canonical_json({"amount": number})
    assert canonical_json({"amount": 2**53 - 1}) == b'{"amount":9007199254740991}'
