"""The sagas API: definitions, starting a run (replay-safe by Idempotency-Key), reading runs
of one's own tenant only, and who may do what (SPEC §5)."""

from __future__ import annotations

import jsonschema
import pytest

from gateway.contracts import CONTRACTS
from gateway.models import Command
from sagas.definitions import DEFINITIONS, SagaDefinition, Step, register
from sagas.models import SagaRun, SagaStep
from tests.sagas.conftest import ORDER_STEPS, RELEASE_STEPS, order_inputs, release_inputs

pytestmark = pytest.mark.django_db


def post(persona, body, key):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    return persona.client.post("/api/v1/sagas", body, format="json", **headers)


ORDER = {"definition": "order.fulfillment", "inputs": order_inputs()}


def test_definitions_list_steps_schema_and_a_valid_example(agent):
    response = agent.client.get("/api/v1/saga-definitions")
    assert response.status_code == 200
    definitions = {d["name"]: d for d in response.json()["results"]}
    assert set(definitions) == {"order.fulfillment", "release.production"}
    for definition in definitions.values():
        jsonschema.Draft202012Validator.check_schema(definition["inputs_schema"])
        jsonschema.validate(definition["example"], definition["inputs_schema"])
    order = definitions["order.fulfillment"]
    assert [s["name"] for s in order["steps"]] == ORDER_STEPS
    assert [s["effect_type"] for s in order["steps"]] == [
        "inventory.reservation.create",
        "billing.charge.create",
        "shipment.create",
        "email.message.send",
    ]
    release = definitions["release.production"]
    assert [s["name"] for s in release["steps"]] == RELEASE_STEPS
    assert [s["effect_type"] for s in release["steps"]] == [
        "deployment.release.promote",
        "deployment.release.verify",
        "deployment.release.promote",
    ]
    # Compensation data comes from each step's contract, never from the saga.
    for step in order["steps"] + release["steps"]:
        contract = CONTRACTS[step["effect_type"]]
        assert step["compensation"]["compensator"] == contract.compensator
        assert step["compensation"]["irreversible"] == contract.irreversible
        assert step["compensation"]["irreversible_boundary"] == contract.irreversible_boundary
        assert step["compensation"]["owner"] == contract.owner
    notify = order["steps"][3]
    assert notify["compensation"]["automatic"] is False
    assert notify["precondition"] == "the receipt of create_shipment has 'tracking_number'"
    assert release["steps"][0]["on_failure"]["triggers"]["precondition_failed"] == "pause"
    assert order["steps"][0]["on_failure"]["triggers"]["precondition_failed"] == "compensate"


def test_a_definition_that_could_never_run_is_refused():
    example = dict(DEFINITIONS["order.fulfillment"].example)
    step = Step(name="x", effect_type="no.such.type", description="", build=lambda c: ({}, {}))
    with pytest.raises(LookupError):
        register(SagaDefinition("t.unknown", "", {"type": "object"}, {}, (step,)))
    good = Step(name="x", effect_type="ticket.create", description="", build=lambda c: ({}, {}))
    schema = DEFINITIONS["order.fulfillment"].inputs_schema
    with pytest.raises(ValueError, match="example"):
        register(SagaDefinition("t.bad", "", schema, {**example, "quantity": 0}, (good,)))
    with pytest.raises(ValueError, match="twice"):
        register(SagaDefinition("order.fulfillment", "", schema, example, (good,)))
    assert "t.bad" not in DEFINITIONS and "t.unknown" not in DEFINITIONS


def test_start_issues_the_first_step_under_a_derived_key(agent):
    response = post(agent, ORDER, "fulfil:ord_881:v1")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["state"] == "RUNNING"
    assert body["definition"] == "order.fulfillment"
    assert body["requested_by"] == "refund-bot"
    first = body["steps"][0]
    assert first["effect_status"] == "PREPARED"
    assert first["idempotency_key"] == f"saga:{body['saga_id']}:reserve_inventory:r1"
    command = Command.objects.get(pk=first["effect_id"])
    assert (command.saga_id, command.saga_step) == (body["saga_id"], "reserve_inventory")
    assert command.idempotency_key == first["idempotency_key"]
    assert [s["effect_id"] for s in body["steps"][1:]] == [None, None, None]
    # The requester sees its inputs; the answer says so.
    assert body["inputs"] == order_inputs()
    assert body["inputs_redacted"] is False


def test_same_key_same_body_replays_and_other_body_is_422(agent):
    first = post(agent, ORDER, "k1")
    again = post(agent, ORDER, "k1")
    assert again.status_code == 200
    assert again["Idempotent-Replayed"] == "true"
    assert again.json()["saga_id"] == first.json()["saga_id"]
    other = post(agent, {**ORDER, "inputs": order_inputs(quantity=3)}, "k1")
    assert other.status_code == 422
    assert other["Content-Type"] == "application/problem+json"
    assert other.json()["type"].endswith("idempotency-key-mismatch")
    assert other.json()["saga_id"] == first.json()["saga_id"]
    assert SagaRun.objects.count() == 1
    assert Command.objects.count() == 1


def test_bad_requests_are_400_with_field_errors(agent):
    missing_key = post(agent, ORDER, None)
    assert missing_key.status_code == 400
    assert "Idempotency-Key" in missing_key.json()["errors"]
    bad_inputs = post(agent, {**ORDER, "inputs": order_inputs(quantity=0, currency="euro")}, "k2")
    assert bad_inputs.status_code == 400
    assert bad_inputs["Content-Type"] == "application/problem+json"
    assert set(bad_inputs.json()["errors"]) == {"inputs.quantity", "inputs.currency"}
    unknown = post(agent, {"definition": "order.teleport", "inputs": {}}, "k3")
    assert unknown.status_code == 400
    assert "definition" in unknown.json()["errors"]
    not_object = post(agent, {"definition": "order.fulfillment", "inputs": [1]}, "k4")
    assert not_object.status_code == 400
    assert not_object.json()["errors"] == {"inputs": ["must be an object"]}
    assert SagaRun.objects.count() == 0


def test_an_approver_cannot_start_a_saga(approver):
    response = post(approver, ORDER, "k1")
    assert response.status_code == 403
    assert SagaRun.objects.count() == 0


def test_another_tenants_run_does_not_exist(agent, rival_agent, rival_operator):
    saga_id = post(agent, ORDER, "k1").json()["saga_id"]
    assert rival_agent.client.get(f"/api/v1/sagas/{saga_id}").status_code == 404
    assert rival_operator.client.post(f"/api/v1/sagas/{saga_id}/cancel").status_code == 404
    assert rival_operator.client.post(f"/api/v1/sagas/{saga_id}/freeze").status_code == 404
    assert rival_agent.client.get("/api/v1/sagas").json()["results"] == []
    # The same key in another tenant is another run.
    assert post(rival_agent, ORDER, "k1").status_code == 201


def test_inputs_with_personal_data_are_redacted_for_other_agents(agent, other_agent, operator):
    saga_id = post(agent, ORDER, "k1").json()["saga_id"]
    seen = other_agent.client.get(f"/api/v1/sagas/{saga_id}").json()
    assert seen["inputs_redacted"] is True
    assert seen["inputs"]["email"] == "[redacted]"
    assert seen["inputs"]["address"] == "[redacted]"
    assert seen["inputs"]["sku"] == "SKU-RED-MUG"
    assert operator.client.get(f"/api/v1/sagas/{saga_id}").json()["inputs"] == order_inputs()
    stored = SagaRun.objects.get(pk=saga_id)
    assert "ada@example.com" not in stored.inputs_sealed


def test_list_is_newest_first_filtered_and_paginated(agent, django_assert_max_num_queries):
    ids = [post(agent, ORDER, f"o{i}").json()["saga_id"] for i in range(3)]
    release = post(
        agent, {"definition": "release.production", "inputs": release_inputs()}, "r1"
    ).json()["saga_id"]
    with django_assert_max_num_queries(6):
        listed = agent.client.get("/api/v1/sagas").json()
    assert [s["saga_id"] for s in listed["results"]] == [release, *reversed(ids)]
    only = agent.client.get("/api/v1/sagas?definition=release.production").json()
    assert [s["saga_id"] for s in only["results"]] == [release]
    SagaRun.objects.filter(pk=ids[0]).update(state="CANCELLED")
    cancelled = agent.client.get("/api/v1/sagas?state=CANCELLED").json()
    assert [s["saga_id"] for s in cancelled["results"]] == [ids[0]]
    page = agent.client.get("/api/v1/sagas?limit=2").json()
    assert len(page["results"]) == 2 and page["next"]
    rest = agent.client.get(page["next"]).json()
    assert [s["saga_id"] for s in rest["results"]] == [ids[1], ids[0]]
    assert agent.client.get("/api/v1/sagas?state=BOGUS").status_code == 400
    assert agent.client.get("/api/v1/sagas?definition=nope").status_code == 400


def test_detail_and_events_of_a_run(agent):
    saga_id = post(agent, ORDER, "k1").json()["saga_id"]
    events = agent.client.get(f"/api/v1/sagas/{saga_id}/events").json()
    assert [e["kind"] for e in events] == ["started", "step_issued"]
    assert events[0]["to_state"] == "RUNNING"
    assert events[0]["actor"] == "agent:refund-bot"
    assert events[1]["step"] == "reserve_inventory"
    assert SagaStep.objects.filter(run_id=saga_id).count() == 1


def test_only_operators_resume_freeze_and_unfreeze(agent, operator):
    saga_id = post(agent, ORDER, "k1").json()["saga_id"]
    for verb in ("resume", "freeze", "unfreeze"):
        response = agent.client.post(f"/api/v1/sagas/{saga_id}/{verb}")
        assert response.status_code == 403, verb
    frozen = operator.client.post(
        f"/api/v1/sagas/{saga_id}/freeze", {"reason": "looking"}, format="json"
    )
    assert frozen.status_code == 200
    assert frozen.json()["frozen"] is True
    assert frozen.json()["frozen_reason"] == "looking"
    refused = operator.client.post(f"/api/v1/sagas/{saga_id}/resume")
    assert refused.status_code == 409
    assert "unfreeze" in refused.json()["detail"]


def test_openapi_schema_includes_the_saga_endpoints(agent):
    schema = agent.client.get("/api/schema/")
    assert schema.status_code == 200
    text = schema.content.decode()
    for path in (
        "/api/v1/sagas",
        "/api/v1/sagas/{id}/cancel",
        "/api/v1/sagas/{id}/resume",
        "/api/v1/saga-definitions",
        "/api/v1/saga-tasks",
    ):
        assert path in text, path
