"""The top of the effect page: one sentence of what happened and the safe next step, the key
and operation the provider holds (with a link into its console), repeated lookups collapsed,
amounts in major units, and no expiry on a settled effect."""

from __future__ import annotations

from tests.console.conftest import (
    EMAIL,
    REFUND,
    add_failed_lookups,
    add_receipt,
    open_case,
    set_state,
    submit,
)


def _page(person, effect) -> str:
    response = person.client.get(f"/effects/{effect.pk}")
    assert response.status_code == 200
    return response.content.decode()


def test_hard_unknown_names_the_provider_key_and_since_when_lookups_fail(oscar, bot, settings):
    settings.GATEWAY_PROVIDER_URLS = {"billing": "https://billing.example/api"}
    effect = set_state(submit(bot.principal, REFUND), status="UNKNOWN", escalated=True)
    add_failed_lookups(effect, 8)
    open_case(effect, reason="lookup_budget_exhausted")
    html = _page(oscar, effect)
    head = html[: html.index('class="facts"')]
    key = effect.command.provider_key
    assert key.startswith("acme:")
    assert "billing may have done this (refund money to a customer against an order)" in head
    assert "lookups are failing since" in head
    assert f"Check billing for key {key} before you resolve" in head
    # The key the provider holds, copyable, and the provider's own console for it.
    assert f'<code class="mono" id="provider-key">{key}</code>' in head
    assert 'data-copy="provider-key"' in head
    assert (
        "https://billing.example/api/_operations?idempotency_key=" + key.replace(":", "%3A")
    ) in head
    # The resolve form starts with that key.
    assert f"billing key {key}: </textarea>" in html
    # Eight identical lookups are one row with a count.
    assert html.count('class="repeated"') == 1
    assert "×7" in html  # seven inconclusive, then the escalating one


def test_amounts_are_in_major_units_next_to_the_stored_minor_units(oscar, bot):
    effect = set_state(
        submit(bot.principal, {**REFUND, "payload": {**REFUND["payload"], "amount": 4999}}),
        status="CONFIRMED",
    )
    add_receipt(effect, result={"refund_id": "re_1", "amount": 4999, "currency": "EUR"})
    html = _page(oscar, effect)
    assert "49.99 EUR" in html
    assert "(4999 in minor units)" in html
    assert ">4999<" not in html


def test_settled_effect_has_no_expiry_and_says_the_provider_did_it(oscar, bot):
    effect = set_state(submit(bot.principal, REFUND), status="CONFIRMED")
    html = _page(oscar, effect)
    assert "Expires" not in html
    assert "billing did this" in html


def test_irreversible_warning_sits_next_to_the_buttons(oscar, bot):
    effect = set_state(submit(bot.principal, EMAIL), status="UNKNOWN")
    html = _page(oscar, effect)
    warning = html.index("irreversible-warning")
    assert warning < html.index('class="actions"') < html.index('class="facts"')


def test_confirmed_effect_with_a_contradicting_case_says_so(oscar, bot):
    effect = set_state(
        submit(bot.principal, REFUND), status="CONFIRMED", provider_operation_id="op_9"
    )
    open_case(effect, reason="contradiction", text="a later receipt says failed")
    html = _page(oscar, effect)
    assert "but a later answer disagrees" in html
    assert "Check operation op_9 at billing" in html
