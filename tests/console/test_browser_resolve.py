"""After a hard UNKNOWN, in a real browser (Debian's chromium, desktop 1440 and phone 390): the
charge the provider made while its lookups were unreachable is resolved "confirmed" with the
operation id and the charge id pasted from the provider's console, then compensated; the
refund reaches the sandbox with that charge id and is CONFIRMED. The clicks and keys it takes
are counted and bounded (a paste counts as one key).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from gateway.models import Command, Effect, Receipt
from tests.console.conftest import PASSWORD, captured_at_provider, escalated_unknown

# The module's chromium fixture and its skip marks (no Playwright, no /usr/bin/chromium).
from tests.console.test_browser import browser as browser
from tests.console.test_browser import pytestmark as pytestmark

CHARGE = {
    "type": "billing.charge.create",
    "resource": {"type": "order", "id": "ord_881", "version": 17},
    "payload": {"amount": 4999, "currency": "EUR", "customer_id": "cus_42"},
    "intent": {"summary": "charge order 881"},
}
MAX_CLICKS = 8
MAX_KEYS = 60


@dataclass
class Hands:
    """What the engineer does, counted: each click, each key (a paste is one key)."""

    page: Any
    clicks: int = 0
    keys: int = 0
    log: list[str] = field(default_factory=list)

    def click(self, locator) -> None:
        locator.click()
        self.clicks += 1
        self.log.append("click")

    def press(self, key: str) -> None:
        self.page.keyboard.press(key)
        self.keys += 1
        self.log.append(key)

    def paste(self, text: str) -> None:
        self.page.keyboard.insert_text(text)
        self.keys += 1
        self.log.append("paste")

    def type(self, text: str) -> None:
        self.page.keyboard.type(text)
        self.keys += len(text)
        self.log.append(f"type {len(text)}")


def signed_in(browser, live_server, width: int, height: int):
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.set_default_timeout(10_000)
    page.goto(f"{live_server.url}/login")
    page.get_by_label("Username").fill("oscar@acme")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r"/$"))
    return page


@pytest.mark.parametrize("width, height", [(1440, 900), (390, 844)], ids=["desktop", "phone"])
def test_hard_unknown_resolved_with_the_charge_id_then_refunded(
    browser, live_server, oscar, bot, sandbox, width, height
):
    from gateway.services import effect_dispatch

    charge = escalated_unknown(bot.principal, CHARGE)
    # The provider did charge: what its console shows for the key.
    operation = captured_at_provider(sandbox, charge)
    operation_id, charge_id = operation["id"], operation["result"]["charge_id"]

    page = signed_in(browser, live_server, width, height)
    hands = Hands(page)
    hands.click(page.locator(f'tr[data-effect="{charge.pk}"]').get_by_role("link", name=charge.pk))
    page.wait_for_url(re.compile(rf"/effects/{charge.pk}$"))
    hands.click(page.get_by_text("Resolve with evidence…"))
    hands.click(page.get_by_role("radio", name=re.compile("^confirmed")))
    hands.press("Tab")
    assert page.evaluate("document.activeElement.name") == "evidence"
    hands.press("End")
    hands.type("captured in billing")
    hands.press("Tab")
    assert page.evaluate("document.activeElement.name") == "operation_id"
    hands.paste(operation_id)
    hands.press("Tab")
    assert page.evaluate("document.activeElement.name") == "field_charge_id"
    hands.paste(charge_id)
    hands.click(page.get_by_role("button", name="Record the resolution"))
    page.locator("#flash").get_by_text(re.compile("^Resolved")).wait_for()

    # The refund is offered, and says what it will send.
    hands.click(page.get_by_text("Compensate…"))
    sends = page.locator("#compensation-sends")
    assert charge_id in sends.inner_text() and "4999" in sends.inner_text()
    hands.press("Tab")
    hands.type("customer dispute")
    hands.click(page.get_by_role("button", name="Issue the compensation"))
    page.locator("#flash").get_by_text(re.compile("^Issued compensation")).wait_for()

    assert hands.clicks <= MAX_CLICKS, hands.log
    assert hands.keys <= MAX_KEYS, hands.log

    receipt = Receipt.objects.get(effect_id=charge.pk)
    assert (receipt.source, receipt.recorded_by) == ("manual", "operator:oscar")
    assert receipt.result == {"charge_id": charge_id}
    refund = Effect.objects.get(command=Command.objects.get(compensates_id=charge.pk))
    assert refund.status == "PREPARED"
    effect_dispatch(effect_id=refund.pk, worker="test")
    refund.refresh_from_db()
    assert refund.status == "CONFIRMED"
    (sent,) = sandbox.operations(type="billing.refund.create")
    assert sent["payload"]["charge_id"] == charge_id
    assert sent["status"] == "succeeded"
    # The charge's page shows it compensated by the refund, which ended CONFIRMED.
    page.reload()
    shown = page.locator("#effect").inner_text()
    assert "Compensated" in shown and f"compensation {refund.pk} ended CONFIRMED" in shown
    page.context.close()
