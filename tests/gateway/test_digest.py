"""The payload digest against independent computations of RFC 8785."""

import hashlib
import json

from gateway.lib.digest import canonical_json, payload_digest


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
