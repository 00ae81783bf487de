"""Loading a REST provider declaration: the shipped examples load, and every kind of mistake is a
clear error at load time that names its field, all problems at once."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from gateway.providers.rest import adapter_from_config, render_body, render_path
from gateway.providers.rest_spec import RestSpec, RestSpecError, resolve_pointer

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "guides" / "providers" / "examples"


def deployments() -> dict[str, Any]:
    return json.loads((EXAMPLES / "deployments.json").read_text())


def problems(data: Any) -> list[str]:
    with pytest.raises(RestSpecError) as caught:
        RestSpec.from_dict(data, source="test.json")
    assert str(caught.value).startswith("test.json: invalid REST provider declaration")
    return caught.value.problems


@pytest.mark.parametrize("name", ["tickets.json", "deployments.json"])
def test_the_examples_load(name):
    spec = RestSpec.from_file(EXAMPLES / name)
    assert spec.by_key is not None and spec.by_operation_id is not None


def test_defaults_when_codes_are_not_declared():
    data = deployments()
    del data["codes"]
    spec = RestSpec.from_dict(data)
    assert spec.refused == {400, 409, 422} and spec.try_later == {429}
    assert spec.key_conflict == frozenset() and spec.effect_headers and spec.at_most_once


def test_a_bad_json_pointer_names_its_field():
    data = deployments()
    data["answer"]["operation_id"] = "deploy/uid"
    data["lookup"]["by_key"]["key"] = "/ref~2"
    rule = "is not a JSON pointer (RFC 6901): it must be empty or start with '/', and '~' may "
    rule += "only appear as ~0 or ~1"
    assert problems(data) == [
        f"answer.operation_id: 'deploy/uid' {rule}",
        f"lookup.by_key.key: '/ref~2' {rule}",
    ]


def test_an_unknown_placeholder_names_its_field_and_what_is_known():
    data = deployments()
    data["write"]["body"]["sha"] = "{{paylod.sha}}"
    data["write"]["path"] = "/deploys/{effect.version}"
    data["lookup"]["by_operation_id"]["path"] = "/deploys/{uid}"
    found = problems(data)
    assert found[0].startswith("write.path: unknown placeholder {effect.version} (known: payload")
    assert found[1].startswith("write.body.sha: unknown placeholder {{paylod.sha}}")
    assert found[2] == "lookup.by_operation_id.path: must hold the {operation_id} placeholder"
    assert found[3] == (
        "lookup.by_operation_id.path: unknown placeholder {uid} (known: {operation_id})"
    )


def test_structure_errors_name_the_field():
    data = deployments()
    del data["write"]["idempotency_header"]
    data["codes"]["refused"] = ["409"]
    data["write"]["method"] = "GET"
    data["extra"] = 1
    assert problems(data) == [
        "(the declaration): Additional properties are not allowed ('extra' was unexpected)",
        "codes.refused.0: '409' is not of type 'integer'",
        "write: 'idempotency_header' is a required property",
        "write.method: 'GET' is not one of ['POST', 'PUT', 'PATCH', 'DELETE']",
    ]


def test_what_a_schema_says_in_its_own_words_is_said_plainly():
    data = deployments()
    data["write"]["idempotency_header"] = "Idempotency Key"
    del data["lookup"]["by_key"]["key"]
    assert problems(data) == [
        "lookup.by_key: a search declares items, key and answer together",
        "write.idempotency_header: 'Idempotency Key' must be an HTTP header name, or null (the "
        "provider has no idempotency: at-most-once)",
    ]
    assert problems({**deployments(), "lookup": {}}) == [
        "lookup: declare by_operation_id, by_key or both"
    ]


def test_a_search_needs_the_key_in_what_the_write_sends():
    data = deployments()
    del data["write"]["body"]["ref"]
    found = problems(data)
    assert any(p.startswith("lookup.by_key: the write sends no idempotency header") for p in found)
    assert any(p.startswith("lookup.by_key.key: a search matches the key") for p in found)


def test_codes_and_statuses_mean_one_thing_each():
    data = deployments()
    data["codes"] = {"refused": [422, 500], "try_later": [422]}
    data["statuses"]["failed"] = ["failed", "running"]
    assert problems(data) == [
        "codes.refused: 500 is a server error, which may come after the provider acted: it is "
        "never a refusal",
        "codes: [422] appear in both refused and try_later",
        "statuses: ['running'] appear in both in_progress and failed",
    ]


def test_a_declared_status_needs_its_done_values():
    data = deployments()
    del data["statuses"]
    assert problems(data) == [
        "statuses.done: answer.status is declared, so name the status values that mean done"
    ]


def test_placeholders_are_checked_against_a_contracts_payload_schema():
    spec = RestSpec.from_dict(deployments())
    schema = {"type": "object", "properties": {"sha": {}, "environment": {}}}
    assert spec.problems_with(schema) == [
        "write.body.note: the payload schema has no field 'release'"
    ]
    assert (
        spec.problems_with({**schema, "properties": {**schema["properties"], "release": {}}}) == []
    )


def test_an_unreadable_file_is_a_declaration_error(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(RestSpecError, match=r"broken\.json: invalid REST provider declaration"):
        RestSpec.from_file(broken)


def test_body_template_keeps_types_and_leaves_out_absent_members():
    template = {
        "amount": "{{payload.amount}}",
        "tags": ["{{payload.tags}}", "fixed"],
        "note": "for {{resource.id}}: {{payload.amount}}",
        "optional": "{{payload.absent}}",
        "nested": {"first": "{{payload.items.0}}", "whole": "{{ payload }}"},
    }
    payload = {"amount": 1250, "tags": ["a", "b"], "items": [{"sku": "x"}]}
    context = {"payload": payload, "resource": {"id": "r/1"}, "effect": {}}
    assert render_body(template, context) == {
        "amount": 1250,
        "tags": [["a", "b"], "fixed"],
        "note": "for r/1: 1250",
        "nested": {"first": {"sku": "x"}, "whole": payload},
    }
    assert render_path("/things/{resource.id}?q={payload.amount}", context) == (
        "/things/r%2F1?q=1250"
    )


def test_json_pointers_follow_rfc_6901():
    document = {"a/b": {"m~n": [10, 20]}, "": 1}
    assert resolve_pointer(document, "/a~1b/m~0n/1") == 20
    assert resolve_pointer(document, "/") == 1
    assert resolve_pointer(document, "") is document
    for missing in ("/a~1b/m~0n/2", "/a~1b/m~0n/01", "/x"):
        with pytest.raises(KeyError):
            resolve_pointer(document, missing)


def test_loading_never_changes_the_callers_dict():
    data = deployments()
    before = copy.deepcopy(data)
    RestSpec.from_dict(data)
    assert data == before


def test_a_provider_configuration_builds_its_adapter(tmp_path):
    spec_file = tmp_path / "deployments.json"
    spec_file.write_text(json.dumps(deployments()))
    adapter = adapter_from_config(
        "deploy",
        {
            "base_url": "https://deploy.internal/api/",
            "spec_file": str(spec_file),
            "timeout": 4,
            "headers": {"Authorization": "Bearer secret"},
        },
    )
    assert adapter.base_url == "https://deploy.internal/api" and adapter.timeout == 4
    assert adapter.spec.at_most_once
    inline = adapter_from_config("deploy", {"base_url": "http://x", "spec": deployments()})
    assert inline.spec == adapter.spec


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"base_url": "http://x"}, "provider deploy: give exactly one of spec and spec_file"),
        ({"spec": {}, "base_url": 3}, "provider deploy: base_url must be a URL string"),
        ({"spec": {}, "base_url": "x", "token": "t"}, "provider deploy: unknown field(s) token"),
        ({"spec": {}, "base_url": "http://x", "timeout": 0}, "timeout must be a positive"),
        ({"spec": {}, "base_url": "http://x", "headers": {"A": 1}}, "headers must map"),
    ],
)
def test_a_bad_provider_configuration_names_the_field(config, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        adapter_from_config("deploy", config)


def test_an_inline_declaration_error_names_the_provider():
    data = deployments()
    del data["answer"]
    with pytest.raises(RestSpecError, match=r"provider deploy: invalid.*\n  \(the declaration\)"):
        adapter_from_config("deploy", {"base_url": "http://x", "spec": data})
