"""release.production end to end: promotions with expected revisions, a stale revision refused
as a precondition failure, and resume after the fix that never re-sends a confirmed step."""

from __future__ import annotations

import pytest

from gateway.models import Effect
from sagas.models import SagaStep
from sagas.services import saga_advance
from tests.sagas.conftest import RELEASE_STEPS, op_types, release_inputs, saga, sends, steps

pytestmark = pytest.mark.django_db

PROMOTE, VERIFY, ROLLBACK = (
    "deployment.release.promote",
    "deployment.release.verify",
    "deployment.release.rollback",
)


def approve(settle, approver, effect_id: str):
    effect = Effect.objects.select_related("command").get(pk=effect_id)
    response = settle(
        approver.client.post,
        f"/api/v1/effects/{effect_id}/approve",
        {"payload_digest": effect.command.payload_digest, "comment": "release window"},
        format="json",
    )
    assert response.status_code == 200, response.json()


def test_happy_path_promotes_verifies_and_promotes_with_expected_revisions(
    start, settle, agent, approver, sandbox
):
    sandbox.set_resource_version(
        provider="deploy", type="service", id="catalog@staging", version=41
    )
    sandbox.set_resource_version(
        provider="deploy", type="service", id="catalog@production", version=57
    )
    body = start("release.production", release_inputs())

    # Production promotions need an approver: the run waits for one.
    assert body["state"] == "RUNNING"
    production = steps(body)["promote_production"]
    assert production["effect_status"] == "AWAITING_APPROVAL"
    assert op_types(sandbox) == [PROMOTE, VERIFY]

    approve(settle, approver, production["effect_id"])

    body = saga(agent, body["saga_id"])
    assert body["state"] == "COMPLETED"
    ops = sandbox.operations()
    assert [op["type"] for op in ops] == [PROMOTE, VERIFY, PROMOTE]
    assert [op["resource"] for op in ops] == [
        {"type": "service", "id": "catalog@staging", "version": 41},
        {"type": "service", "id": "catalog@staging"},
        {"type": "service", "id": "catalog@production", "version": 57},
    ]
    assert [op["payload"]["environment"] for op in ops] == ["staging", "staging", "production"]
    assert all(op["payload"]["sha"] == "a1b2c3d4e5f6" for op in ops)
    assert ops[1]["payload"]["checks"] == ["smoke", "error-rate"]
    for name in RELEASE_STEPS:
        assert steps(body)[name]["effect_status"] == "CONFIRMED"
        effect = Effect.objects.select_related("command").get(pk=steps(body)[name]["effect_id"])
        assert len(sends(sandbox, effect.command.provider_key)) == 1


def test_a_stale_expected_revision_is_a_precondition_failure(start, agent, sandbox):
    # Someone deployed to staging out of band: it is at 45, the release expects 41.
    sandbox.set_resource_version(
        provider="deploy", type="service", id="catalog@staging", version=45
    )
    body = start("release.production", release_inputs())

    assert body["state"] == "PAUSED_FAILED"
    promote = steps(body)["promote_staging"]
    assert promote["effect_status"] == "REJECTED"
    assert promote["failure"]["trigger"] == "precondition_failed"
    assert "stale" in promote["failure"]["reason"]
    assert body["failure"] == {
        "step": "promote_staging",
        "trigger": "precondition_failed",
        "reason": promote["failure"]["reason"],
    }
    # Refused by the provider (409), nothing committed, nothing issued after it.
    assert sandbox.operations() == []
    assert [e["action"] for e in sandbox.log(provider="deploy")] == ["conflict"]
    assert steps(body)["verify_staging"]["effect_id"] is None


def test_resume_after_the_fix_never_resends_a_confirmed_step(
    start, settle, agent, operator, approver, sandbox
):
    sandbox.set_resource_version(
        provider="deploy", type="service", id="catalog@production", version=58
    )
    body = start("release.production", release_inputs())
    saga_id = body["saga_id"]
    approve(settle, approver, steps(body)["promote_production"]["effect_id"])
    body = saga(agent, saga_id)
    assert body["state"] == "PAUSED_FAILED"
    assert body["failure"]["step"] == "promote_production"
    assert op_types(sandbox) == [PROMOTE, VERIFY]
    confirmed_keys = [
        Effect.objects.select_related("command")
        .get(pk=steps(body)[name]["effect_id"])
        .command.provider_key
        for name in ("promote_staging", "verify_staging")
    ]

    # The fix: the out-of-band production deploy is rolled back to the expected revision.
    sandbox.set_resource_version(
        provider="deploy", type="service", id="catalog@production", version=57
    )
    response = settle(
        operator.client.post,
        f"/api/v1/sagas/{saga_id}/resume",
        {"reason": "production is back at 57"},
        format="json",
    )
    assert response.status_code == 200, response.json()
    body = response.json()
    production = steps(body)["promote_production"]
    assert production["revision"] == 2
    assert production["idempotency_key"] == f"saga:{saga_id}:promote_production:r2"
    assert production["effect_status"] == "AWAITING_APPROVAL"  # a new key, a new approval
    [earlier] = production["earlier_revisions"]
    assert earlier["effect_status"] == "REJECTED"
    assert earlier["failure"]["trigger"] == "precondition_failed"
    assert body["state"] == "RUNNING"
    assert body["failure"] is None

    approve(settle, approver, production["effect_id"])
    body = saga(agent, saga_id)
    assert body["state"] == "COMPLETED"
    assert op_types(sandbox) == [PROMOTE, VERIFY, PROMOTE]
    for key in confirmed_keys:
        assert len(sends(sandbox, key)) == 1
    assert SagaStep.objects.filter(run_id=saga_id, name="promote_staging").count() == 1
    assert SagaStep.objects.filter(run_id=saga_id, name="verify_staging").count() == 1
    # Resuming a completed run changes nothing.
    assert operator.client.post(f"/api/v1/sagas/{saga_id}/resume").status_code == 409


def test_an_approver_saying_no_to_production_rolls_staging_back(
    start, settle, agent, approver, sandbox
):
    body = start("release.production", release_inputs())
    production = steps(body)["promote_production"]["effect_id"]
    response = settle(
        approver.client.post,
        f"/api/v1/effects/{production}/reject",
        {"reason": "not during the sale"},
        format="json",
    )
    assert response.status_code == 200

    body = saga(agent, body["saga_id"])
    assert body["state"] == "COMPENSATED"
    assert body["failure"]["trigger"] == "rejected"
    assert op_types(sandbox) == [PROMOTE, VERIFY, ROLLBACK]
    rollback = sandbox.operations(type=ROLLBACK)[0]
    # The promotion moved staging one revision on; the rollback expects that revision.
    assert rollback["resource"] == {"type": "service", "id": "catalog@staging", "version": 42}
    assert rollback["payload"]["to_sha"] == "0f9e8d7c6b5a"
    by_name = steps(body)
    assert by_name["verify_staging"]["compensation"]["decision"] == "not_needed"
    assert by_name["promote_staging"]["effect_status"] == "COMPENSATED"


def test_a_paused_run_waits_for_a_person(start, agent, sandbox):
    """Pausing waits for a person: advancing the run again re-issues nothing."""
    sandbox.set_resource_version(provider="deploy", type="service", id="catalog@staging", version=1)
    body = start("release.production", release_inputs())
    assert saga_advance(saga_id=body["saga_id"]) is False
    assert SagaStep.objects.filter(run_id=body["saga_id"]).count() == 1
    assert saga(agent, body["saga_id"])["state"] == "PAUSED_FAILED"
