"""Issue 13 item 1: money is integer minor units end to end, and a budget sees exactly what is
sent — a float, a bool or another currency can neither slip past it nor be counted as zero."""

from __future__ import annotations

from collections import Counter

import pytest

from gateway import services
from gateway.capabilities import capability_grant
from gateway.errors import ValidationProblem
from gateway.models import Capability, Command, Effect
from tests.conftest import Persona, issue_token

pytestmark = pytest.mark.django_db


@pytest.fixture
def bot(db) -> Persona:
    issue_token("acme", "pay-bot", "agent")
    persona = Persona("acme", "pay-bot", "agent")
    Capability.objects.filter(principal=persona.principal).delete()
    return persona


def eur_grant(bot: Persona, amount: int = 10_000) -> Capability:
    return capability_grant(
        granted_by="test",
        principal=bot.principal,
        effect_types=["billing.refund.create"],
        budget_amount=amount,
        budget_currency="EUR",
    )


def refund(amount, currency="EUR") -> dict:
    return {
        "type": "billing.refund.create",
        "resource": {"type": "order", "id": "ord_1", "version": 1},
        "payload": {"amount": amount, "currency": currency, "reason": "duplicate"},
    }


@pytest.mark.parametrize("amount", [9000.0, 9000.5, 1e3, True, "9000"])
def test_a_non_integer_amount_is_400_and_spends_nothing(bot, amount):
    cap = eur_grant(bot)
    response = bot.submit(refund(amount), f"r-{amount!r}")
    assert response.status_code == 400, response.content
    assert "payload.amount" in response.json()["errors"]
    cap.refresh_from_db()
    assert (cap.spent_count, cap.spent_amount) == (0, 0)
    assert Command.objects.count() == 0


def test_a_float_in_any_integer_field_is_400(agent):
    stock = {
        "type": "inventory.reservation.create",
        "resource": {"type": "order", "id": "ord_1"},
        "payload": {"sku": "sku_1", "quantity": 2.0},
    }
    response = agent.submit(stock, "stock-float")
    assert response.status_code == 400
    assert "payload.quantity" in response.json()["errors"]
    assert agent.submit({**refund(100), "expires_in": 60.0}, "exp").status_code == 400
    assert Command.objects.count() == 0


def test_the_service_refuses_a_float_even_without_the_api(bot):
    eur_grant(bot)
    body = refund(9000.0)
    with pytest.raises(ValidationProblem):
        services.command_submit(
            principal=bot.principal,
            idempotency_key="direct",
            type=body["type"],
            resource=body["resource"],
            payload=body["payload"],
        )
    assert Command.objects.count() == 0


def test_the_budget_and_currency_checks_see_exactly_what_is_sent(bot):
    cap = eur_grant(bot)
    assert bot.submit(refund(9000.0), "a").status_code == 400
    assert bot.submit(refund(9000, "USD"), "b").status_code == 403
    assert bot.submit(refund(9000), "c").status_code == 201
    assert bot.submit(refund(9000), "d").status_code == 403
    assert bot.submit(refund(1000), "e").status_code == 201
    cap.refresh_from_db()
    assert (cap.spent_count, cap.spent_amount) == (2, 10_000)
    sent = Command.objects.filter(capability=cap)
    assert sorted(services.command_payload(c)["amount"] for c in sent) == [1000, 9000]


@pytest.mark.django_db(transaction=True)
def test_concurrent_submissions_never_overspend_in_any_currency(bot, sandbox, eager_tasks):
    from tests.gateway.test_concurrency import run_in_threads

    cap = eur_grant(bot)
    # 24 racing submissions: integers and floats, EUR and other currencies, 3000 each.
    variants = [(3000, "EUR"), (3000.0, "EUR"), (3000, "USD"), (3000, "GBP")]

    def submit(index: int) -> int:
        amount, currency = variants[index % len(variants)]
        return bot.submit(refund(amount, currency), f"race-{index}").status_code

    codes = Counter(run_in_threads(24, submit))
    assert codes[201] == 3  # 3 × 3000 ≤ 10 000 < 4 × 3000
    assert codes[400] == 6  # every float, whatever the race
    assert codes[403] == 15
    cap.refresh_from_db()
    assert cap.spent_amount == 9000
    # The provider is the oracle: what it executed is exactly what the budget counted.
    assert Effect.objects.filter(status="CONFIRMED").count() == 3
    executed = sandbox.operations()
    assert len(executed) == 3
    assert {(op["payload"]["amount"], op["payload"]["currency"]) for op in executed} == {
        (3000, "EUR")
    }
