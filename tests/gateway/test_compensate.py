"""Compensation is a new, audited command; the original stays, linked (SPEC §4, §5)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from gateway import services
from gateway.contracts import CONTRACTS
from gateway.models import Command, Effect, EffectEvent

pytestmark = pytest.mark.django_db

RESERVATION = {
    "type": "inventory.reservation.create",
    **CONTRACTS["inventory.reservation.create"].example,
}
EMAIL = {"type": "email.message.send", **CONTRACTS["email.message.send"].example}


def confirmed(persona, body, key, sandbox) -> str:
    effect_id = persona.submit(body, key).json()["effect_id"]
    services.effect_dispatch(effect_id=effect_id, worker="test")
    assert Effect.objects.get(pk=effect_id).status == "CONFIRMED"
    return effect_id


def test_compensation_is_a_new_command_and_settles_the_original(agent, sandbox):
    original = confirmed(agent, RESERVATION, "res-1", sandbox)
    response = agent.client.post(
        f"/api/v1/effects/{original}/compensate", {"reason": "order cancelled"}, format="json"
    )
    assert response.status_code == 201, response.json()
    compensation = response.json()
    assert compensation["type"] == "inventory.reservation.release"
    assert compensation["compensates"] == original
    assert compensation["idempotency_key"] == f"compensation:{original}"
    reservation_op = sandbox.operations(type="inventory.reservation.create")[0]
    assert compensation["payload"]["reservation_id"] == reservation_op["result"]["reservation_id"]
    assert Effect.objects.get(pk=original).status == "COMPENSATING"

    services.effect_dispatch(effect_id=compensation["effect_id"], worker="test")
    original_body = agent.client.get(f"/api/v1/effects/{original}").json()
    assert original_body["status"] == "COMPENSATED"
    assert original_body["compensation"]["compensated_by"] == compensation["effect_id"]
    # Both operations happened at the provider, once each; nothing was erased.
    assert len(sandbox.operations(type="inventory.reservation.create")) == 1
    assert len(sandbox.operations(type="inventory.reservation.release")) == 1
    assert Command.objects.count() == 2
    kinds = list(
        EffectEvent.objects.filter(effect_id=original).order_by("id").values_list("kind", flat=True)
    )
    assert kinds[-2:] == ["compensation_issued", "compensation_settled"]


def test_asking_twice_replays_the_same_compensation(agent, sandbox):
    original = confirmed(agent, RESERVATION, "res-1", sandbox)
    first = agent.client.post(
        f"/api/v1/effects/{original}/compensate", {"reason": "x"}, format="json"
    )
    second = agent.client.post(
        f"/api/v1/effects/{original}/compensate", {"reason": "x"}, format="json"
    )
    assert second.status_code == 200
    assert second.json()["effect_id"] == first.json()["effect_id"]
    assert Command.objects.filter(compensates_id=original).count() == 1


def test_a_rejected_compensation_is_compensation_failed(agent, sandbox):
    original = confirmed(agent, RESERVATION, "res-1", sandbox)
    sandbox.add_fault("reject", times=1, status=410, error="already_shipped")
    compensation = agent.client.post(
        f"/api/v1/effects/{original}/compensate", {"reason": "x"}, format="json"
    ).json()
    services.effect_dispatch(effect_id=compensation["effect_id"], worker="test")
    assert Effect.objects.get(pk=compensation["effect_id"]).status == "REJECTED"
    assert Effect.objects.get(pk=original).status == "COMPENSATION_FAILED"


def test_irreversible_email_is_never_compensated_by_an_agent(agent, operator, sandbox):
    original = confirmed(agent, EMAIL, "mail-1", sandbox)
    refused = agent.client.post(
        f"/api/v1/effects/{original}/compensate", {"reason": "oops"}, format="json"
    )
    assert refused.status_code == 403
    assert Effect.objects.get(pk=original).status == "CONFIRMED"
    correction = operator.client.post(
        f"/api/v1/effects/{original}/compensate", {"reason": "wrong customer"}, format="json"
    )
    assert correction.status_code == 201
    assert correction.json()["payload"]["subject"].startswith("Correction:")


def test_outside_the_window_compensation_is_manual(agent, sandbox):
    original = confirmed(agent, RESERVATION, "res-1", sandbox)
    Effect.objects.filter(pk=original).update(confirmed_at=timezone.now() - timedelta(days=8))
    response = agent.client.post(
        f"/api/v1/effects/{original}/compensate", {"reason": "late"}, format="json"
    )
    assert response.status_code == 409
    assert "window" in response.json()["detail"]
    assert Command.objects.count() == 1


def test_only_a_confirmed_effect_is_compensated(agent, sandbox):
    effect_id = agent.submit(RESERVATION, "res-1").json()["effect_id"]
    response = agent.client.post(
        f"/api/v1/effects/{effect_id}/compensate", {"reason": "x"}, format="json"
    )
    assert response.status_code == 409
    assert (
        agent.client.post(f"/api/v1/effects/{effect_id}/compensate", {}, format="json").status_code
        == 400
    )
