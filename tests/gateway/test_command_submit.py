"""SPEC §5 "Submitting a command": every row of the table, and bad input that changes nothing."""

import pytest

from gateway.contracts import CONTRACTS
from gateway.lib.digest import payload_digest
from gateway.models import Command, Effect, EffectEvent

pytestmark = pytest.mark.django_db


def ledger_counts() -> tuple[int, int, int]:
    effect_events = EffectEvent.objects.filter(effect__isnull=False).count()
    return Command.objects.count(), Effect.objects.count(), effect_events


def test_new_key_is_201_with_the_effect(agent, refund_body):
    response = agent.submit(refund_body, "refund:ord_881:incident_120:v1")
    assert response.status_code == 201
    body = response.json()
    assert body["effect_id"].startswith("eff_")
    assert body["status"] == "PREPARED"
    assert body["idempotency_key"] == "refund:ord_881:incident_120:v1"
    assert body["payload_digest"] == payload_digest(
        type=refund_body["type"], resource=refund_body["resource"], payload=refund_body["payload"]
    )
    assert body["intent"]["summary"] == refund_body["intent"]["summary"]
    assert body["tenant"] == "acme"
    assert body["attempts"] == 0
    assert body["approval"] == {
        "required": False,
        "state": "not_required",
        "approved_by": None,
        "approved_digest": None,
        "approved_at": None,
    }
    assert body["receipt"] is None
    assert body["compensation"]["owner"] == "billing-oncall"
    assert body["compensates"] is None and body["saga"] is None
    for field in ("expires_at", "created_at", "updated_at", "resource", "frozen"):
        assert field in body


def test_same_key_same_digest_replays_200_with_the_same_effect(agent, refund_body):
    first = agent.submit(refund_body, "k1")
    before = ledger_counts()
    for _ in range(3):
        again = agent.submit(refund_body, "k1")
        assert again.status_code == 200
        assert again.headers["Idempotent-Replayed"] == "true"
        assert again.json()["effect_id"] == first.json()["effect_id"]
    assert ledger_counts() == before
    assert "Idempotent-Replayed" not in first.headers


def test_intent_text_is_not_part_of_the_digest(agent, refund_body):
    first = agent.submit(refund_body, "k1")
    reworded = {**refund_body, "intent": {"summary": "same refund, other words"}}
    again = agent.submit(reworded, "k1")
    assert again.status_code == 200
    assert again.json()["effect_id"] == first.json()["effect_id"]


def test_same_key_other_payload_is_422_and_changes_nothing(agent, refund_body):
    first = agent.submit(refund_body, "k1")
    before = ledger_counts()
    changed = {**refund_body, "payload": {**refund_body["payload"], "amount": 800}}
    response = agent.submit(changed, "k1")
    assert response.status_code == 422
    assert response.headers["Content-Type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"].endswith("idempotency-key-mismatch")
    assert problem["status"] == 422
    assert problem["title"] and "new key" in problem["detail"]
    assert problem["effect_id"] == first.json()["effect_id"]
    assert ledger_counts() == before


def test_missing_idempotency_key_is_400(agent, refund_body):
    response = agent.submit(refund_body, None)
    assert response.status_code == 400
    assert response.json()["errors"] == {"Idempotency-Key": ["required"]}
    assert ledger_counts() == (0, 0, 0)


@pytest.mark.parametrize("key", ["réf-1", "ключ", "tab\there", "k\u2028"])
def test_a_key_outside_printable_ascii_is_400_and_writes_nothing(agent, refund_body, key):
    """The key travels on to the provider in its Idempotency-Key header, which holds
    printable ASCII only: a key no dispatch could send is refused here, not stuck later."""
    response = agent.submit(refund_body, key)
    assert response.status_code == 400
    assert list(response.json()["errors"]) == ["Idempotency-Key"]
    assert ledger_counts() == (0, 0, 0)


def test_unknown_type_is_400_with_the_field_error(agent, refund_body):
    response = agent.submit({**refund_body, "type": "billing.refund.teleport"}, "k1")
    assert response.status_code == 400
    assert "type" in response.json()["errors"]
    assert ledger_counts() == (0, 0, 0)


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"amount": -5, "currency": "EUR", "reason": "x"}, "payload.amount"),
        ({"amount": 5, "currency": "euro", "reason": "x"}, "payload.currency"),
        ({"amount": "5", "currency": "EUR", "reason": "x"}, "payload.amount"),
        ({"currency": "EUR", "reason": "x"}, "payload"),
        ({"amount": 5, "currency": "EUR", "reason": "x", "iban": "DE00"}, "payload"),
    ],
)
def test_invalid_payload_is_400_with_field_errors(agent, refund_body, payload, field):
    response = agent.submit({**refund_body, "payload": payload}, "k1")
    assert response.status_code == 400
    assert field in response.json()["errors"]
    assert ledger_counts() == (0, 0, 0)


@pytest.mark.parametrize(
    ("resource", "field"),
    [
        ({"type": "customer", "id": "ord_881"}, "resource.type"),
        ({"type": "order"}, "resource.id"),
        ({"type": "order", "id": "ord_881", "version": "17"}, "resource.version"),
        ({"type": "order", "id": "ord_881", "owner": "x"}, "resource"),
        ("ord_881", "resource"),
    ],
)
def test_bad_resource_is_400(agent, refund_body, resource, field):
    response = agent.submit({**refund_body, "resource": resource}, "k1")
    assert response.status_code == 400
    assert field in response.json()["errors"]
    assert ledger_counts() == (0, 0, 0)


def test_promotion_without_expected_revision_is_400(agent):
    body = {
        "type": "deployment.release.promote",
        "resource": {"type": "service", "id": "catalog"},
        "payload": {"environment": "staging", "sha": "a1b2c3d4", "release": "r1"},
    }
    response = agent.submit(body, "k1")
    assert response.status_code == 400
    assert "resource.version" in response.json()["errors"]


def test_role_that_may_not_submit_is_403(approver, refund_body):
    response = approver.submit(refund_body, "k1")
    assert response.status_code == 403
    assert response.json()["type"].endswith("not-permitted")
    assert ledger_counts() == (0, 0, 0)


def test_frozen_principal_is_403(agent, refund_body):
    agent.principal.frozen = True
    agent.principal.save()
    assert agent.submit(refund_body, "k1").status_code == 403


def test_two_tenants_use_one_key_independently(agent, rival_agent, refund_body):
    mine = agent.submit(refund_body, "shared-key")
    theirs = rival_agent.submit(
        {**refund_body, "payload": {**refund_body["payload"], "amount": 900}}, "shared-key"
    )
    assert mine.status_code == 201 and theirs.status_code == 201
    assert mine.json()["effect_id"] != theirs.json()["effect_id"]
    # The key sent to the provider is scoped by tenant, so their operations cannot collide.
    assert mine.json()["provider_idempotency_key"] != theirs.json()["provider_idempotency_key"]


def test_no_token_is_401(client, refund_body):
    response = client.post(
        "/api/v1/commands",
        refund_body,
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="k1",
    )
    assert response.status_code == 401
    assert response.headers["Content-Type"] == "application/problem+json"


def test_revoked_or_wrong_token_is_401(agent, refund_body):
    agent.client.credentials(HTTP_AUTHORIZATION="Bearer egw_not-a-real-token")
    assert agent.submit(refund_body, "k1").status_code == 401


@pytest.mark.parametrize(
    "raw",
    ['{"type": "billing.refund.create",', "[1, 2, 3]", '"just a string"', "null"],
)
def test_malformed_or_non_object_json_is_400(agent, raw):
    response = agent.client.post(
        "/api/v1/commands", raw, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k1"
    )
    assert response.status_code == 400
    assert response.headers["Content-Type"] == "application/problem+json"
    assert ledger_counts() == (0, 0, 0)


def test_oversize_body_is_400_and_changes_nothing(agent, refund_body, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4096
    big = {**refund_body, "intent": {"summary": "x" * 10_000}}
    response = agent.submit(big, "k1")
    assert response.status_code == 400
    assert response.json()["type"].endswith("body-too-large")
    assert ledger_counts() == (0, 0, 0)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"expires_in": "soon"}, "expires_in"),
        ({"expires_in": 0}, "expires_in"),
        ({"intent": "refund it"}, "intent"),
        ({"payload": [1, 2]}, "payload"),
        ({"type": 42}, "type"),
    ],
)
def test_wrong_types_are_400(agent, refund_body, changes, field):
    response = agent.submit({**refund_body, **changes}, "k1")
    assert response.status_code == 400
    assert field in response.json()["errors"]
    assert ledger_counts() == (0, 0, 0)


def test_text_plain_is_415(agent):
    response = agent.client.post(
        "/api/v1/commands", "hello", content_type="text/plain", HTTP_IDEMPOTENCY_KEY="k1"
    )
    assert response.status_code == 415


@pytest.mark.parametrize("effect_type", sorted(CONTRACTS))
def test_every_contract_example_is_accepted(agent, effect_type):
    example = CONTRACTS[effect_type].example
    body = {"type": effect_type, "resource": example["resource"], "payload": example["payload"]}
    response = agent.submit(body, f"example:{effect_type}")
    assert response.status_code == 201, response.json()


def test_refund_over_threshold_waits_for_approval(agent, refund_body):
    big = {**refund_body, "payload": {**refund_body["payload"], "amount": 50_000}}
    body = agent.submit(big, "k-big").json()
    assert body["status"] == "AWAITING_APPROVAL"
    assert body["approval"]["required"] is True
    assert body["approval"]["state"] == "pending"


def test_personal_fields_are_sealed_and_redacted_for_others(agent, approver):
    email = CONTRACTS["email.message.send"].example
    body = {"type": "email.message.send", **email}
    created = agent.submit(body, "mail-1").json()
    assert created["payload"]["to"] == "ada@example.com"  # the requester sees its own payload
    command = Command.objects.get(pk=created["effect_id"])
    assert "ada@example.com" not in command.payload_sealed
    assert command.payload_redacted["to"] == "[redacted]"
    seen = approver.client.get(f"/api/v1/effects/{created['effect_id']}").json()
    assert seen["payload"]["to"] == "[redacted]"
    assert seen["payload_redacted"] is True
    events = EffectEvent.objects.filter(effect_id=created["effect_id"])
    assert all("ada@example.com" not in str(event.data) for event in events)


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "orm-path"])
def test_the_command_keeps_the_contract_version_it_was_submitted_under(
    agent, refund_body, settings, monkeypatch, fast
):
    from dataclasses import replace

    from gateway import fastpath

    settings.GATEWAY_FAST_PATH = fast
    written = []
    submit = fastpath.submit

    def counted(**kwargs):
        written.append(submit(**kwargs))
        return written[-1]

    monkeypatch.setattr(fastpath, "submit", counted)
    refund = CONTRACTS["billing.refund.create"]
    monkeypatch.setitem(CONTRACTS, refund.type, replace(refund, version=3))
    response = agent.submit(refund_body, "versioned")
    assert response.status_code == 201
    assert response.json()["contract_version"] == 3
    command = Command.objects.get(pk=response.json()["effect_id"])
    assert command.contract_version == 3
    assert bool(written) == fast  # the path under test wrote it
    # A later version of the contract changes nothing stored, nor the replay's answer.
    monkeypatch.setitem(CONTRACTS, refund.type, replace(refund, version=4))
    replay = agent.submit(refund_body, "versioned")
    assert replay.status_code == 200 and replay.json()["contract_version"] == 3
    assert Command.objects.get(pk=command.pk).contract_version == 3
