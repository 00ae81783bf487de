"""``/api/schema/`` describes what the API really takes and answers (issue 15, item 6): the
per-type command ``oneOf``, the problem answers, the list shapes. Real answers of a running
API are validated against it, so a mismatch fails here rather than in a generated client."""

from __future__ import annotations

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from rest_framework.test import APIClient

from gateway.contracts import CONTRACTS

pytestmark = pytest.mark.django_db


@pytest.fixture
def schema(client):
    response = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    return response.json()


def conforms(schema: dict, body, component: str | None = None, *, ref: dict | None = None):
    """Raise unless ``body`` matches ``#/components/schemas/<component>`` (or ``ref``)."""
    registry = Registry().with_resource(
        "urn:openapi", Resource.from_contents(schema, default_specification=DRAFT202012)
    )
    target = _rebase(ref or {"$ref": f"#/components/schemas/{component}"})
    errors = list(Draft202012Validator(target, registry=registry).iter_errors(body))
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors[:5]]


def _rebase(node):
    if isinstance(node, dict):
        return {
            k: ("urn:openapi" + v if k == "$ref" and v.startswith("#") else _rebase(v))
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_rebase(v) for v in node]
    return node


def response_schema(schema: dict, path: str, method: str, status: str) -> dict:
    content = schema["paths"][path][method]["responses"][status]["content"]
    return next(iter(content.values()))["schema"]


def test_each_effect_type_has_its_own_command_schema(schema):
    body = schema["components"]["schemas"]["CommandSubmitRequest"]
    assert body["discriminator"]["propertyName"] == "type"
    mapping = body["discriminator"]["mapping"]
    assert set(mapping) == set(CONTRACTS)
    for effect_type, ref in mapping.items():
        variant = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]
        contract = CONTRACTS[effect_type]
        assert variant["properties"]["type"]["enum"] == [effect_type]
        assert variant["properties"]["resource"]["properties"]["type"]["enum"] == [
            contract.resource_type
        ]
        payload = {k: v for k, v in contract.payload_schema.items() if k != "$schema"}
        assert variant["properties"]["payload"] == payload
        # The contract's own example is a valid command of this variant.
        conforms(schema, {"type": effect_type, **contract.example}, ref=body)
    conforms(schema, {"type": "ticket.create", **CONTRACTS["ticket.create"].example}, ref=body)
    with pytest.raises(AssertionError):
        conforms(
            schema,
            {**CONTRACTS["ticket.create"].example, "type": "billing.refund.create"},
            ref=body,
        )


def test_answers_declare_every_field_they_carry(schema):
    effect = schema["components"]["schemas"]["Effect"]
    assert set(effect["required"]) == set(effect["properties"])
    endpoint = schema["components"]["schemas"]["Endpoint"]
    assert "event_types" in endpoint["required"]
    assert "effect.awaiting_approval" in endpoint["properties"]["event_types"]["items"]["enum"]


def test_every_operation_describes_its_error_answers(schema):
    for path, operations in schema["paths"].items():
        if not path.startswith("/api/v1/"):
            continue
        for method, operation in operations.items():
            responses = operation["responses"]
            for code in ("401", "403", "429"):
                assert code in responses, (method, path, code)
                assert "application/problem+json" in responses[code]["content"]
            if "{" in path:
                assert "404" in responses, (method, path)
            if method == "post":
                assert {"400", "415"} <= set(responses), (method, path)
    commands = schema["paths"]["/api/v1/commands"]["post"]["responses"]
    assert {"200", "201", "400", "401", "403", "422", "429"} <= set(commands)


def test_live_answers_match_the_schema(
    schema, agent, operator, approver, ticket_body, refund_body, sandbox, eager_tasks
):
    created = agent.submit(ticket_body, "schema-1")
    assert created.status_code == 201
    conforms(schema, created.json(), ref=response_schema(schema, "/api/v1/commands", "post", "201"))
    effect_id = created.json()["effect_id"]
    replay = agent.submit(ticket_body, "schema-1")
    conforms(schema, replay.json(), ref=response_schema(schema, "/api/v1/commands", "post", "200"))
    waiting = agent.submit(
        {**refund_body, "payload": {**refund_body["payload"], "amount": 90_000}}, "schema-2"
    )
    conforms(schema, waiting.json(), "Effect")

    endpoint = operator.client.post(
        "/api/v1/webhook-endpoints",
        {"url": "http://127.0.0.1:9/x", "run_ids": ["run-1"]},
        format="json",
    )
    conforms(
        schema,
        endpoint.json(),
        ref=response_schema(schema, "/api/v1/webhook-endpoints", "post", "201"),
    )
    own = agent.client.post(
        "/api/v1/webhook-endpoints", {"url": "http://127.0.0.1:9/mine"}, format="json"
    )
    conforms(
        schema, own.json(), ref=response_schema(schema, "/api/v1/webhook-endpoints", "post", "201")
    )
    answers = {
        ("/api/v1/effects/{id}/tool-uses", "get"): agent.client.get(
            f"/api/v1/effects/{effect_id}/tool-uses"
        ),
        ("/api/v1/webhook-endpoints/{id}", "get"): agent.client.get(
            f"/api/v1/webhook-endpoints/{own.json()['id']}"
        ),
        ("/api/v1/webhook-endpoints/{id}/messages", "get"): operator.client.get(
            f"/api/v1/webhook-endpoints/{endpoint.json()['id']}/messages"
        ),
        ("/api/v1/effects", "get"): agent.client.get("/api/v1/effects"),
        ("/api/v1/effects/{id}", "get"): agent.client.get(f"/api/v1/effects/{effect_id}"),
        ("/api/v1/effects/{id}/events", "get"): agent.client.get(
            f"/api/v1/effects/{effect_id}/events"
        ),
        ("/api/v1/effect-types", "get"): agent.client.get("/api/v1/effect-types"),
        ("/api/v1/webhook-endpoints", "get"): operator.client.get("/api/v1/webhook-endpoints"),
    }
    for (path, method), response in answers.items():
        assert response.status_code == 200, (path, response.content)
        conforms(schema, response.json(), ref=response_schema(schema, path, method, "200"))
    assert isinstance(answers[("/api/v1/effects/{id}/events", "get")].json(), list)

    problems = {
        ("/api/v1/commands", "post", "400"): agent.submit({"type": "ticket.create"}, "schema-3"),
        ("/api/v1/commands", "post", "422"): agent.submit(
            {**ticket_body, "payload": {**ticket_body["payload"], "title": "other"}}, "schema-1"
        ),
        ("/api/v1/effects/{id}", "get", "404"): agent.client.get("/api/v1/effects/eff_nope"),
        ("/api/v1/webhook-endpoints", "get", "403"): approver.client.get(
            "/api/v1/webhook-endpoints"
        ),
        ("/api/v1/effects", "get", "401"): APIClient().get(
            "/api/v1/effects", HTTP_AUTHORIZATION="Bearer egw_nope"
        ),
    }
    for (path, method, status), response in problems.items():
        assert str(response.status_code) == status, (path, response.content)
        assert response["Content-Type"] == "application/problem+json"
        conforms(schema, response.json(), ref=response_schema(schema, path, method, status))
