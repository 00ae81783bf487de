"""One search box: every id an engineer may hold during an incident finds its effect or
saga; one hit opens it; another tenant's ids find nothing. And the triage's correlation
filter as a control."""

from __future__ import annotations

import pytest

from tests.console.conftest import REFUND, set_state, start_saga, submit


@pytest.fixture
def charged(bot):
    body = {
        "type": "billing.charge.create",
        "resource": {"type": "order", "id": "ord_search_1"},
        "payload": {"amount": 4999, "currency": "EUR", "customer_id": "cus_search_9"},
    }
    return set_state(submit(bot.principal, body), provider_operation_id="op_search_7")


@pytest.mark.parametrize(
    "field",
    ["pk", "idempotency_key", "provider_key", "provider_operation_id", "resource", "customer"],
)
def test_every_id_finds_the_effect(oscar, charged, field):
    q = {
        "pk": charged.pk,
        "idempotency_key": charged.command.idempotency_key,
        "provider_key": charged.command.provider_key,
        "provider_operation_id": "op_search_7",
        "resource": "ord_search_1",
        "customer": "cus_search_9",
    }[field]
    response = oscar.client.get("/search", {"q": q})
    assert response.status_code == 302
    assert response["Location"] == f"/effects/{charged.pk}"


def test_a_saga_id_opens_the_saga(oscar, bot):
    run = start_saga(bot.principal, order_id="ord_s")
    response = oscar.client.get("/search", {"q": run.pk})
    assert response["Location"] == f"/sagas/{run.pk}"


def test_several_hits_are_listed_and_other_tenants_find_nothing(oscar, olga, bot):
    first = submit(bot.principal, REFUND, resource={"type": "order", "id": "ord_twice"})
    second = submit(bot.principal, REFUND, resource={"type": "order", "id": "ord_twice"})
    html = oscar.client.get("/search", {"q": "ord_twice"}).content.decode()
    assert "2 results" in html and first.pk in html and second.pk in html
    html = olga.client.get("/search", {"q": first.pk}).content.decode()
    assert "0 results" in html and first.pk not in html.split("results for")[1].split("</h2>")[1]


def test_correlation_filter_control_becomes_a_context_filter(oscar, bot):
    tagged = set_state(
        submit(bot.principal, REFUND, context={"run_id": "run-77"}), status="UNKNOWN"
    )
    set_state(submit(bot.principal, REFUND), status="UNKNOWN")
    html = oscar.client.get("/", {"ctx_key": "run_id", "ctx_value": "run-77"}).content.decode()
    assert "1 effect needs a human" in html and tagged.pk in html
