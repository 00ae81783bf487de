"""People (operators, admins) submit under grants with budgets and expiry, like agents; a
person's command that no grant covers waits for another approver instead of being sent."""

from __future__ import annotations

import pytest

from gateway import services
from gateway.capabilities import capability_grant
from gateway.models import Capability, Effect
from tests.conftest import Persona

pytestmark = pytest.mark.django_db

REFUND = {
    "type": "billing.refund.create",
    "resource": {"type": "order", "id": "ord_881", "version": 17},
    "payload": {"amount": 9_000, "currency": "USD", "reason": "goodwill"},
}


def dispatch(effect_id: str) -> Effect:
    services.effect_dispatch(effect_id=effect_id, worker="test")
    return Effect.objects.get(pk=effect_id)


def approve(approver: Persona, effect: dict):
    return approver.client.post(
        f"/api/v1/effects/{effect['effect_id']}/approve",
        {"payload_digest": effect["payload_digest"]},
        format="json",
    )


@pytest.mark.parametrize("role", ["operator", "admin"])
def test_a_persons_refund_without_a_grant_waits_for_another_approver(role, approver, sandbox):
    person = Persona("acme", f"{role}-person", role)
    submitted = person.submit(REFUND, "r1")
    assert submitted.status_code == 201
    effect = submitted.json()
    assert effect["status"] == "AWAITING_APPROVAL"
    assert dispatch(effect["effect_id"]).status == "AWAITING_APPROVAL"
    assert sandbox.log() == []  # nothing sent
    event = Effect.objects.get(pk=effect["effect_id"]).events.get(kind="submitted")
    assert "no grant" in event.reason
    if role == "admin":  # an admin may approve, but never their own command
        assert approve(person, effect).status_code == 403
    assert approve(approver, effect).status_code == 200
    assert dispatch(effect["effect_id"]).status == "CONFIRMED"
    assert len(sandbox.operations()) == 1


def test_a_persons_grant_with_a_budget_runs_and_is_spent(operator, sandbox):
    cap = capability_grant(
        granted_by="test",
        principal=operator.principal,
        effect_types=["billing.refund.*"],
        budget_count=2,
        budget_amount=20_000,
        budget_currency="USD",
        expires_in=3600,
    )
    first = operator.submit(REFUND, "r1").json()
    assert first["status"] != "AWAITING_APPROVAL"
    assert dispatch(first["effect_id"]).status == "CONFIRMED"
    cap.refresh_from_db()
    assert (cap.spent_count, cap.spent_amount) == (1, 9_000)
    assert operator.submit(REFUND, "r2").status_code == 201
    over = {**REFUND, "payload": {**REFUND["payload"], "amount": 5_000}}
    refused = operator.submit(over, "r3")  # 18,000 spent of 20,000: 5,000 does not fit
    assert refused.status_code == 403
    assert "budget" in refused.json()["detail"]
    assert Capability.objects.get(pk=cap.pk).spent_amount == 18_000


def test_an_admin_cannot_grant_themselves_a_way_around_approval(admin):
    refused = admin.client.post(
        "/api/v1/capabilities",
        {"principal": "root", "effect_types": ["*"]},
        format="json",
    )
    assert refused.status_code == 403
    assert not Capability.objects.filter(principal=admin.principal).exists()
    assert admin.submit(REFUND, "r1").json()["status"] == "AWAITING_APPROVAL"


def test_a_persons_expired_grant_means_an_approver_again(operator, sandbox):
    from datetime import timedelta

    from django.utils import timezone

    cap = capability_grant(
        granted_by="test", principal=operator.principal, effect_types=["billing.refund.*"]
    )
    Capability.objects.filter(pk=cap.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert operator.submit(REFUND, "r1").json()["status"] == "AWAITING_APPROVAL"


def test_an_operators_compensation_is_not_held_for_an_approver(agent, operator, sandbox):
    from gateway.contracts import CONTRACTS

    body = {
        "type": "inventory.reservation.create",
        **CONTRACTS["inventory.reservation.create"].example,
    }
    original = agent.submit(body, "res-1").json()["effect_id"]
    assert dispatch(original).status == "CONFIRMED"
    answer = operator.client.post(
        f"/api/v1/effects/{original}/compensate", {"reason": "booked twice"}, format="json"
    )
    assert answer.status_code == 201
    compensation = answer.json()["effect_id"]
    assert Effect.objects.get(pk=compensation).status == "PREPARED"
    assert dispatch(compensation).status == "CONFIRMED"
