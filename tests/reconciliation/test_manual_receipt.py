"""A manual resolution is a receipt: ``POST /effects/{id}/resolve`` with the provider operation id
and the contract's receipt fields stores a receipt recorded by a person, from which the
compensation is built as from a provider's; a compensation that cannot be built is refused
naming the missing field; and once the provider answers again its receipt is appended and
checked against the person's (a mismatch case when they disagree)."""

from __future__ import annotations

import pytest

from gateway import services as ledger
from gateway.checkpoints import receipt_problems
from gateway.models import Command, Effect, EffectEvent, Receipt
from reconciliation import services
from reconciliation.models import Case
from reconciliation.services.manual import manual_receipts_pending, manual_receipts_verify
from tests.reconciliation.conftest import fresh, operations

PROBLEM = "application/problem+json"
CHARGE = {
    "type": "billing.charge.create",
    "resource": {"type": "order", "id": "ord_881", "version": 17},
    "payload": {"amount": 4999, "currency": "EUR", "customer_id": "cus_42"},
}


def resolve(persona, effect, **body):
    return persona.client.post(f"/api/v1/effects/{effect.pk}/resolve", body, format="json")


def compensate(persona, effect, reason="the customer disputed the charge"):
    return persona.client.post(
        f"/api/v1/effects/{effect.pk}/compensate", {"reason": reason}, format="json"
    )


@pytest.fixture
def hard_charge(recon_requester, recon_sandbox, recon_dispatch):
    """A charge the provider made whose answer was lost, then 8 lookups that got no answer:
    UNKNOWN, escalated, with an open case. Returns (effect, the provider's operation)."""
    submission = ledger.command_submit(
        principal=recon_requester.principal, idempotency_key="charge:1", **CHARGE
    )
    recon_sandbox.add_fault("commit_then_drop", times=1)
    effect = recon_dispatch(submission.effect)
    assert effect.status == "UNKNOWN"
    recon_sandbox.add_fault("lookup_unreachable", times=None)
    for _ in range(8):
        services.effect_reconcile(effect_id=effect.pk)
    effect = fresh(effect)
    assert effect.escalated and not effect.provider_operation_id
    (operation,) = operations(recon_sandbox, effect)
    return effect, operation


def test_resolve_confirmed_stores_a_manual_receipt_the_refund_is_built_from(
    hard_charge, recon_operator, recon_sandbox, recon_dispatch
):
    effect, operation = hard_charge
    charge_id = operation["result"]["charge_id"]

    response = resolve(
        recon_operator,
        effect,
        outcome="confirmed",
        evidence="seen in the billing console",
        operation_id=operation["id"],
        result={"charge_id": charge_id},
    )

    assert response.status_code == 200, response.content
    assert response.json()["status"] == "CONFIRMED"
    effect = fresh(effect)
    assert effect.provider_operation_id == operation["id"]
    receipt = Receipt.objects.get(effect=effect)
    assert receipt.source == "manual"
    assert receipt.recorded_by == recon_operator.principal.label
    assert receipt.evidence == "seen in the billing console"
    assert receipt.result == {"charge_id": charge_id}
    assert receipt.provider_operation_id == operation["id"]
    assert receipt_problems(effect.tenant_id) == []  # sealed, who and why included

    refund = compensate(recon_operator, effect)
    assert refund.status_code == 201, refund.content
    issued = Effect.objects.select_related("command").get(pk=refund.json()["effect_id"])
    assert ledger.command_payload(issued.command)["charge_id"] == charge_id
    recon_sandbox.clear_faults()
    assert recon_dispatch(issued).status == "CONFIRMED"
    (sent,) = recon_sandbox.operations(type="billing.refund.create")
    assert sent["payload"]["charge_id"] == charge_id


def test_compensation_that_cannot_be_built_is_a_409_naming_the_missing_field(
    hard_charge, recon_operator
):
    effect, _ = hard_charge
    assert (
        resolve(recon_operator, effect, outcome="confirmed", evidence="phone call").status_code
        == 200
    )

    response = compensate(recon_operator, effect)

    assert response.status_code == 409
    assert response["Content-Type"] == PROBLEM
    body = response.json()
    assert body["missing"] == ["charge_id"]
    assert "charge_id" in body["detail"] and "Resolve it with the charge_id" in body["detail"]
    assert fresh(effect).status == "CONFIRMED"
    assert not Command.objects.filter(compensates_id=effect.pk).exists()


def test_a_manual_receipt_without_the_field_is_completed_by_resolving_again(
    hard_charge, recon_operator
):
    effect, operation = hard_charge
    resolve(recon_operator, effect, outcome="confirmed", evidence="phone call")

    again = resolve(
        recon_operator,
        effect,
        outcome="confirmed",
        evidence="statement line 14",
        result={"charge_id": operation["result"]["charge_id"]},
    )

    assert again.status_code == 200, again.content
    assert Receipt.objects.filter(effect=effect, source="manual").count() == 2
    assert EffectEvent.objects.filter(effect=effect, kind="receipt_recorded").exists()
    assert compensate(recon_operator, effect).status_code == 201
    # Not started cannot be recorded for a confirmed effect.
    refused = resolve(recon_operator, fresh(effect), outcome="not_started", evidence="x")
    assert refused.status_code == 409


def test_a_field_the_contract_does_not_declare_is_400(hard_charge, recon_operator):
    effect, _ = hard_charge
    response = resolve(
        recon_operator, effect, outcome="confirmed", evidence="x", result={"refund_id": "re_1"}
    )
    assert response.status_code == 400
    assert "result.refund_id" in response.json()["errors"]
    assert fresh(effect).status == "UNKNOWN"


def test_the_provider_agreeing_later_appends_its_receipt_and_opens_nothing(
    hard_charge, recon_operator, recon_sandbox
):
    effect, operation = hard_charge
    resolve(
        recon_operator,
        effect,
        outcome="confirmed",
        evidence="billing console",
        operation_id=operation["id"],
        result={"charge_id": operation["result"]["charge_id"]},
    )
    # Still unreachable: asked, nothing written, asked again next sweep.
    assert manual_receipts_verify() == 0
    assert manual_receipts_pending() == [effect.pk]
    recon_sandbox.clear_faults()

    assert manual_receipts_verify() == 1

    sources = list(
        Receipt.objects.filter(effect=effect).order_by("received_at").values_list("source")
    )
    assert sources == [("manual",), ("reconciler",)]
    assert EffectEvent.objects.filter(effect=effect, kind="receipt_verified").exists()
    assert not Case.objects.filter(effect=effect, state="open").exists()
    assert manual_receipts_pending() == []


def test_the_provider_disagreeing_later_opens_a_mismatch_case(
    hard_charge, recon_operator, recon_sandbox
):
    effect, operation = hard_charge
    resolve(
        recon_operator,
        effect,
        outcome="confirmed",
        evidence="typed from a screenshot",
        operation_id=operation["id"],
        result={"charge_id": "ch_typo"},
    )
    recon_sandbox.clear_faults()

    assert services.reconcile_due(time_budget=5) >= 1

    case = Case.objects.get(effect=effect, state="open")
    assert case.reason == "mismatch"
    assert "charge_id" in case.reason_text and "ch_typo" in case.reason_text
    manual = Receipt.objects.get(effect=effect, source="manual")
    assert manual.result == {"charge_id": "ch_typo"}  # kept as it was: appended, not replaced
    provider = Receipt.objects.get(effect=effect, source="reconciler")
    assert provider.result["charge_id"] == operation["result"]["charge_id"]
    assert fresh(effect).status == "CONFIRMED"
