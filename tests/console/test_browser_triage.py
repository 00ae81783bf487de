"""Who needs a human, in Debian's chromium (Playwright) at 1440 px and on a 390 px phone:
timeouts at a provider whose lookups answer are settling by themselves ("Needs a human: 0")
while the real reconciler asks the real sandbox provider; the groups in risk order; the
phone's first screen shows the first group (the filters behind one button); the skip link
reaches the first row; no serious axe finding and no CSP violation on triage and providers.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone

from gateway import services as ledger
from gateway.models import Effect
from reconciliation import services as reconciliation
from tests.console.conftest import EMAIL, REFUND, TICKET, set_state, submit
from tests.console.test_browser import browser, shots  # noqa: F401 - fixtures
from tests.console.test_console_flows import VIEWPORTS as FLOW_VIEWPORTS
from tests.console.test_console_flows import check_page, open_page

# A wider desktop than test_console_flows', the same phone.
VIEWPORTS = {
    "desktop": {"viewport": {"width": 1440, "height": 900}},
    "phone": FLOW_VIEWPORTS["phone"],
}


@pytest.fixture(params=list(VIEWPORTS))
def viewport(request, monkeypatch) -> str:
    # open_page reads the viewports of test_console_flows: these are the ones asked for here.
    monkeypatch.setattr("tests.console.test_console_flows.VIEWPORTS", VIEWPORTS)
    return request.param


def dispatched(effect: Effect) -> Effect:
    ledger.effect_dispatch(effect_id=effect.pk, worker="test-worker")
    return Effect.objects.select_related("command").get(pk=effect.pk)


def test_needs_a_human_is_0_while_the_reconciler_settles_timeouts(
    browser,  # noqa: F811
    live_server,
    oscar,
    bot,
    sandbox,
    viewport,
    shots,  # noqa: F811
):
    # billing commits six refunds and drops each connection: six UNKNOWN effects, each with a
    # lookup scheduled; the reconciler's lookups answer and settle two of them at once.
    sandbox.add_fault("commit_then_drop", times=6, provider="billing")
    effects = [
        dispatched(submit(bot.principal, REFUND, resource={"type": "order", "id": f"ord_t{n}"}))
        for n in range(6)
    ]
    assert {e.status for e in effects} == {"UNKNOWN"}
    assert all(e.next_check_at is not None for e in effects)
    for effect in effects[:2]:
        reconciliation.effect_reconcile(effect_id=effect.pk)

    page = open_page(browser, live_server, "oscar@acme", viewport)
    assert page.title().startswith("Triage: 0 need a human")
    assert page.locator("#needs-human").inner_text() == "Needs a human: 0"
    assert page.locator("#settling-count").inner_text() == "settling by itself: 4"
    assert page.locator("#triage-badge").inner_text().startswith("0")
    group = page.locator('li[data-group="billing/billing.refund.create/settling"]')
    assert "lookups answering — settling by itself" in group.inner_text()
    assert group.get_attribute("data-needs-human") == "false"
    strip = page.locator('.strip-item[data-provider="billing"]')
    assert strip.locator('[data-channel="lookups"]').get_attribute("data-answering") == "yes"
    assert strip.locator('[data-channel="sends"]').get_attribute("data-answering") == "no"
    assert page.locator("tr[data-effect]").count() == 0
    check_page(page, viewport, "triage while settling")
    page.screenshot(path=shots / f"triage-settling-{viewport}.png", full_page=True)

    # The reconciler settles the rest at their due time; the page's poll redraws by itself.
    Effect.objects.filter(pk__in=[e.pk for e in effects[2:]]).update(
        next_check_at=timezone.now() - timedelta(seconds=1)
    )
    for effect in effects[2:]:
        reconciliation.effect_reconcile(effect_id=effect.pk)
    page.locator('#settling-count[data-count="0"]').wait_for(timeout=15_000)
    assert page.locator("#needs-human").inner_text() == "Needs a human: 0"
    assert Effect.objects.filter(pk__in=[e.pk for e in effects], status="CONFIRMED").count() == 6
    # Exactly once, by the provider's own log: one operation per key, none sent again.
    creates = Counter(op["idempotency_key"] for op in sandbox.log() if op["action"] == "commit")
    assert creates == Counter({e.command.provider_key: 1 for e in effects})
    check_page(page, viewport, "triage after settling")
    page.context.close()


@pytest.fixture
def mixed_queue(bot):
    """Four groups that need a human, made in the reverse of their risk order."""
    now = timezone.now()
    agent = bot.principal
    set_state(submit(agent, TICKET), status="UNKNOWN", created_at=now - timedelta(hours=5))
    set_state(submit(agent, EMAIL), status="UNKNOWN", created_at=now - timedelta(hours=4))
    set_state(submit(agent, REFUND), status="UNKNOWN", created_at=now - timedelta(hours=3))
    return set_state(
        submit(agent, TICKET, resource={"type": "queue", "id": "billing"}),
        status="CONFIRMED",
        mismatch=True,
        created_at=now - timedelta(hours=1),
    )


def test_risk_order_first_screen_and_skip_link(
    browser,  # noqa: F811
    live_server,
    oscar,
    mixed_queue,
    viewport,
    shots,  # noqa: F811
):
    page = open_page(browser, live_server, "oscar@acme", viewport)
    order = page.locator(".groups li.group").evaluate_all(
        "items => items.map(i => i.getAttribute('data-group'))"
    )
    assert order == [
        "tickets/ticket.create/mismatch",
        "billing/billing.refund.create/unknown",
        "mail/email.message.send/unknown",
        "tickets/ticket.create/unknown",
    ]
    assert page.locator("#needs-human").inner_text() == "Needs a human: 4"
    first_group = page.locator(".groups li.group").first.bounding_box()
    assert first_group is not None
    height = VIEWPORTS[viewport]["viewport"]["height"]
    print(f"{viewport}: the first group ends at y = {first_group['y'] + first_group['height']:.0f}")
    assert first_group["y"] + first_group["height"] <= height
    if viewport == "phone":
        # The filters wait behind one button, which opens them.
        assert not page.locator("#filters").is_visible()
        page.get_by_role("button", name="Filters").click()
        assert page.get_by_label("Status").is_visible()
        check_page(page, viewport, "triage, filters open")
        page.get_by_role("button", name="Filters").click()
    else:
        assert page.locator("#filters").is_visible()
        assert not page.get_by_role("button", name="Filters").is_visible()
    shot_name = f"triage-risk-{viewport}.png"
    page.screenshot(path=shots / shot_name, full_page=False)

    # From a fresh load, two Tabs and Enter: the first row's link has the focus.
    page.reload()
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to the first row"
    page.keyboard.press("Enter")
    focused = page.evaluate("document.activeElement.id")
    assert focused == "first-row"
    assert page.evaluate("document.activeElement.closest('tr').dataset.effect")
    page.keyboard.press("Enter")
    page.wait_for_url("**/effects/**")
    check_page(page, viewport, "effect from the first row")
    page.context.close()


def test_providers_page_in_both_viewports(
    browser,  # noqa: F811
    live_server,
    oscar,
    bot,
    sandbox,
    viewport,
    shots,  # noqa: F811
):
    sandbox.add_fault("commit_then_drop", times=1, provider="billing")
    dispatched(submit(bot.principal, REFUND))
    dispatched(submit(bot.principal, TICKET))
    page = open_page(browser, live_server, "oscar@acme", viewport)
    if viewport == "phone":
        page.get_by_role("button", name="Menu").click()
    page.get_by_role("link", name="Providers", exact=True).click()
    page.wait_for_url("**/providers")
    billing = page.locator('tr[data-provider="billing"]')
    assert "not answering since" in billing.inner_text()
    assert "closed" in billing.inner_text()  # no failure to connect: the breaker is shut
    assert (
        "answering, no failure in the last hour"
        in page.locator('tr[data-provider="tickets"]').inner_text()
    )
    check_page(page, viewport, "/providers")
    page.screenshot(path=shots / f"providers-{viewport}.png", full_page=True)
    page.context.close()


def test_the_compensation_form_says_what_it_sends(
    browser,  # noqa: F811
    live_server,
    oscar,
    bot,
    viewport,
):
    from tests.console.conftest import add_receipt
    from tests.console.test_console_flows import CHARGE

    effect = set_state(
        submit(bot.principal, CHARGE), status="CONFIRMED", confirmed_at=timezone.now()
    )
    add_receipt(effect, result={"charge_id": "ch_browser_1", "state": "captured"})
    page = open_page(browser, live_server, "oscar@acme", viewport)
    page.goto(f"{live_server.url}/effects/{effect.pk}")
    page.get_by_text("Compensate…").click()
    sends = page.locator("#compensation-sends")
    text = sends.inner_text()
    for shown in ("billing.refund.create", "49.99 EUR", "4999 in minor units", "ch_browser_1"):
        assert shown in text, text
    # Keys are read whole on a phone: no key of the list is wrapped onto two lines.
    wrapped = sends.locator("dt").evaluate_all(
        "dts => dts.filter(dt => dt.getClientRects().length > 1 ||"
        " dt.getBoundingClientRect().height > 2 * parseFloat(getComputedStyle(dt).lineHeight))"
        ".map(dt => dt.textContent)"
    )
    assert wrapped == []
    check_page(page, viewport, "compensation form open")
    page.context.close()
