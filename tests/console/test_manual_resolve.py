"""The console after a hard UNKNOWN: the resolve form asks for the provider operation id and the
contract's receipt fields (prefilled from what lookups saw), a confirmation stores them as a
receipt recorded by a person, the Compensate button is offered only when its command can be
built (else the page says which field is missing and how to supply it), the compensation form
shows what it will send, the Cases page speaks in the verdict's words, and every freeze asks
for a reason and a confirmation."""

from __future__ import annotations

import re

from gateway.models import Command, Receipt
from reconciliation.models import ReconciliationRecord
from tests.console.conftest import (
    add_receipt,
    escalated_unknown,
    open_case,
    set_state,
    submit,
)

CHARGE = {
    "type": "billing.charge.create",
    "resource": {"type": "order", "id": "ord_881", "version": 17},
    "payload": {"amount": 4999, "currency": "EUR", "customer_id": "cus_42"},
    "intent": {"summary": "charge order 881"},
}


def page(person, effect) -> str:
    response = person.client.get(f"/effects/{effect.pk}")
    assert response.status_code == 200
    return response.content.decode()


def buttons(html: str, effect) -> set[str]:
    return set(re.findall(rf'action="/effects/{effect.pk}/([a-z-]+)"', html))


def test_the_resolve_form_asks_for_the_operation_id_and_the_charge_id(oscar, bot):
    effect = escalated_unknown(bot.principal, CHARGE)
    # A lookup once saw the provider's operation (before the provider went away).
    ReconciliationRecord.objects.filter(effect=effect).order_by("id").filter(check_number=3).update(
        provider_operation_id="op_seen_by_lookup"
    )
    html = page(oscar, effect)
    assert 'name="operation_id"' in html
    assert 'value="op_seen_by_lookup"' in html
    assert 'name="field_charge_id"' in html
    assert 'for="resolve-field-charge_id"' in html


def test_confirming_stores_a_receipt_recorded_by_the_operator(oscar, bot):
    effect = escalated_unknown(bot.principal, CHARGE)
    response = oscar.htmx(
        "post",
        f"/effects/{effect.pk}/resolve",
        {
            "outcome": "confirmed",
            "evidence": "billing console, charge captured",
            "operation_id": "op_01PASTED",
            "field_charge_id": "ch_pasted",
        },
    )
    assert response.status_code == 200, response.content
    receipt = Receipt.objects.get(effect=effect)
    assert (receipt.source, receipt.recorded_by) == ("manual", "operator:oscar")
    assert receipt.result == {"charge_id": "ch_pasted"}
    assert receipt.provider_operation_id == "op_01PASTED"
    html = response.content.decode()
    # The page now offers the refund, and shows what it will send.
    assert f'action="/effects/{effect.pk}/compensate"' in html
    sends = html[html.index('id="compensation-sends"') :]
    sends = sends[: sends.index("</dl>")]
    for shown in ("billing.refund.create", "49.99 EUR", "4999 in minor units", "ch_pasted"):
        assert shown in sends


def test_no_compensate_button_when_the_charge_id_is_missing(oscar, bot):
    from reconciliation.services import effect_resolve

    # Confirmed by hand, from a phone call: no operation id, no charge id.
    effect = effect_resolve(
        effect=escalated_unknown(bot.principal, CHARGE),
        principal=oscar.principal,
        outcome="confirmed",
        evidence="the customer's bank statement",
    )
    html = page(oscar, effect)
    assert "compensate" not in buttons(html, effect)
    missing = html[html.index('id="compensation-missing"') :]
    missing = missing[: missing.index("</p>")]
    assert "<code>charge_id</code> is missing" in missing
    assert 'href="#resolve-action"' in missing and "Resolve it with the charge_id" in missing
    # The form it points to is there (a CONFIRMED effect without a provider receipt).
    assert 'id="resolve-action"' in html and "Record the receipt…" in html
    head = html[: html.index('class="facts"')]
    assert "compensate within its window" not in head
    assert "cannot be compensated yet" in head

    # Supplying the charge id there makes the refund buildable.
    response = oscar.htmx(
        "post",
        f"/effects/{effect.pk}/resolve",
        {"outcome": "confirmed", "evidence": "billing console", "field_charge_id": "ch_9"},
    )
    assert response.status_code == 200, response.content
    assert f'action="/effects/{effect.pk}/compensate"' in response.content.decode()
    # Saying it again adds nothing: refused like any resolve of a settled effect.
    again = oscar.htmx(
        "post",
        f"/effects/{effect.pk}/resolve",
        {"outcome": "confirmed", "evidence": "billing console", "field_charge_id": "ch_9"},
    )
    assert again.status_code == 409


def test_a_confirmed_effect_without_any_receipt_cannot_be_compensated_nor_resolved(oscar, bot):
    effect = set_state(submit(bot.principal, CHARGE), status="CONFIRMED")
    html = page(oscar, effect)
    assert "compensate" not in buttons(html, effect) and "resolve" not in buttons(html, effect)
    missing = html[html.index('id="compensation-missing"') :]
    assert "issue the compensation by hand" in missing[: missing.index("</p>")]


def test_compensate_button_and_verdict_when_the_receipt_has_the_charge_id(oscar, bot):
    effect = set_state(submit(bot.principal, CHARGE), status="CONFIRMED")
    add_receipt(effect, result={"charge_id": "ch_1", "state": "captured"})
    html = page(oscar, effect)
    assert "compensate" in buttons(html, effect)
    assert 'id="compensation-missing"' not in html
    assert "compensate within its window" in html
    assert "Record the receipt" not in html  # the provider's receipt is not amended by hand


def test_compensating_through_the_console_refused_when_it_cannot_be_built(oscar, bot):
    effect = set_state(submit(bot.principal, CHARGE), status="CONFIRMED")
    response = oscar.htmx(
        "post", f"/effects/{effect.pk}/compensate", {"reason": "customer disputes it"}
    )
    assert response.status_code == 409
    assert "charge_id" in response.content.decode()
    assert not Command.objects.filter(compensates_id=effect.pk).exists()


def test_the_compensation_preview_is_redacted_for_who_may_not_see_it(oscar, bot):
    # An email's correction repeats the address: personal, shown only to who may see it.
    from gateway.console.effects import compensation_preview
    from gateway.contracts import get_contract

    email = {
        "type": "email.message.send",
        "resource": {"type": "customer", "id": "cus_42"},
        "payload": {"to": "ada@example.com", "subject": "Your order", "body": "It shipped."},
    }
    effect = set_state(submit(bot.principal, email), status="CONFIRMED")
    contract = get_contract(effect.type)
    hidden = compensation_preview(effect, contract, None, may_see=False)
    shown = compensation_preview(effect, contract, None, may_see=True)
    assert hidden is not None and shown is not None
    assert hidden.payload["to"] == "[redacted]" and shown.payload["to"] == "ada@example.com"
    html = page(oscar, effect)  # an operator may see it: the form says exactly what it sends
    sends = html[html.index('id="compensation-sends"') :]
    assert "ada@example.com" in sends[: sends.index("</dl>")]


def test_cases_show_the_verdict_not_raw_nulls(oscar, bot):
    effect = escalated_unknown(bot.principal, CHARGE)
    # A lookup that got no answer names no status and no digest.
    from reconciliation.models import Case

    Case.objects.filter(effect=effect).update(
        evidence={"http_status": None, "provider_digest": None, "check_count": 8}
    )
    html = oscar.client.get("/cases").content.decode()
    assert "Nobody knows whether billing did this" in html
    assert "http_status" not in html and "provider_digest" not in html
    assert "check_count" in html  # what is known stays, folded under Evidence


def test_every_freeze_asks_for_a_reason_and_a_confirmation(oscar, bot):
    effect = submit(bot.principal, CHARGE)
    effect_html = page(oscar, effect)
    controls = oscar.client.get("/controls").content.decode()
    forms = re.findall(
        r'<form[^>]*hx-confirm="Freeze [^"]*"[^>]*>.*?</form>', effect_html + controls, re.S
    )
    # The effect, each effect type, each other principal: the same partial every time.
    assert any("/freeze" in f and f"/effects/{effect.pk}/" in f for f in forms)
    assert any("/controls/types/billing.charge.create/freeze" in f for f in forms)
    assert any("/controls/principals/refund-bot/freeze" in f for f in forms)
    for form in forms:
        assert re.search(r'name="reason" required', form), form
    # The server asks for the reason too.
    refused = oscar.htmx("post", "/controls/principals/refund-bot/freeze", {"reason": ""})
    assert refused.status_code == 400
    bot.principal.refresh_from_db()
    assert not bot.principal.frozen
    refused = oscar.htmx("post", f"/effects/{effect.pk}/freeze", {"reason": ""})
    assert refused.status_code == 400


def test_an_open_case_on_a_manually_confirmed_effect_is_named(oscar, bot):
    effect = set_state(submit(bot.principal, CHARGE), status="CONFIRMED")
    open_case(effect, reason="mismatch", text="charge_id ch_real, not ch_typo")
    html = page(oscar, effect)
    assert "but a later answer disagrees" in html


def test_a_case_is_resolved_with_the_operation_id_and_the_charge_id(oscar, bot):
    from reconciliation.models import Case

    effect = escalated_unknown(bot.principal, CHARGE)
    case = Case.objects.get(effect=effect)
    html = oscar.client.get("/cases").content.decode()
    assert f'id="case-{case.pk}-operation-id"' in html
    assert f'id="case-{case.pk}-field-charge_id"' in html
    response = oscar.htmx(
        "post",
        f"/cases/{case.pk}/resolve",
        {
            "outcome": "confirmed",
            "evidence": "billing console",
            "operation_id": "op_case",
            "field_charge_id": "ch_case",
        },
    )
    assert response.status_code == 200, response.content
    receipt = Receipt.objects.get(effect=effect)
    assert (receipt.source, receipt.provider_operation_id) == ("manual", "op_case")
    assert receipt.result == {"charge_id": "ch_case"}
