"""The console for a real incident, walked in Debian's chromium (Playwright) on a desktop and
on a 390 px phone: the hard UNKNOWN resolved with the provider's evidence in at most 4 clicks
and 30 keystrokes, a 150-effect outage settled in at most 5 clicks, one inbox, who is on it,
search and keyboard, the approver's card — and on every page, in both viewports, no
horizontal overflow at 390 px and no serious or critical axe-core violation.

Clicks and keystrokes are counted by the page itself (trusted ``click`` and ``keydown``
events, kept in sessionStorage across navigations), after login. axe-core comes from the npm
registry (``tests/console/package.json``, ``npm ci``); without it the axe checks skip.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from gateway.models import Effect
from tests.console.conftest import (
    BIG_REFUND,
    EMAIL,
    PASSWORD,
    REFUND,
    add_receipt,
    captured_at_provider,
    escalated_unknown,
    open_case,
    set_state,
    start_saga,
    submit,
)
from tests.console.test_browser import browser, settled_by_either, shots  # noqa: F401 - fixtures

AXE = Path(__file__).parent / "node_modules" / "axe-core" / "axe.min.js"

CHARGE = {
    "type": "billing.charge.create",
    "resource": {"type": "order", "id": "ord_ux_1"},
    "payload": {"amount": 4999, "currency": "EUR", "customer_id": "cus_ux_42"},
    "intent": {"summary": "charge the order of incident 121"},
}

VIEWPORTS = {
    "desktop": {"viewport": {"width": 1366, "height": 900}},
    "phone": {
        "viewport": {"width": 390, "height": 844},
        "is_mobile": True,
        "has_touch": True,
        "device_scale_factor": 2,
    },
}

COUNTERS = """
(() => {
  const bump = (key) => {
    try { sessionStorage.setItem(key, String(Number(sessionStorage.getItem(key) || 0) + 1)); }
    catch (e) {}
  };
  document.addEventListener('click', (e) => { if (e.isTrusted) bump('__clicks'); }, true);
  document.addEventListener('keydown', (e) => { if (e.isTrusted) bump('__keys'); }, true);
  window.__violations = [];
  document.addEventListener('securitypolicyviolation',
    (e) => window.__violations.push(e.violatedDirective + ' ' + e.blockedURI));
})();
"""


@pytest.fixture(params=list(VIEWPORTS))
def viewport(request) -> str:
    return request.param


def open_page(browser, live_server, username: str, viewport: str, scheme: str = "dark"):  # noqa: F811
    context = browser.new_context(color_scheme=scheme, **VIEWPORTS[viewport])
    page = context.new_page()
    page.set_default_timeout(15_000)
    page.add_init_script(COUNTERS)
    page.goto(f"{live_server.url}/login")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r"/$"))
    page.evaluate("sessionStorage.clear()")
    return page


def counts(page) -> tuple[int, int]:
    clicks, keys = page.evaluate(
        "[Number(sessionStorage.getItem('__clicks') || 0),"
        " Number(sessionStorage.getItem('__keys') || 0)]"
    )
    return clicks, keys


def overflow(page) -> int:
    """How many CSS pixels the page is wider than the screen (0: none)."""
    return page.evaluate(
        "Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)"
        " - document.documentElement.clientWidth"
    )


def wide_elements(page) -> list[str]:
    """The innermost elements that stick out of the screen (to say what overflows)."""
    return page.evaluate(
        """() => {
          const width = document.documentElement.clientWidth;
          const out = [];
          for (const el of document.querySelectorAll('body *')) {
            const box = el.getBoundingClientRect();
            if (box.right > width + 0.5 && !el.closest('.table-wrap')
                && ![...el.children].some(c => c.getBoundingClientRect().right > width + 0.5)) {
              out.push(el.tagName.toLowerCase() + '.' + el.className + ' ' + Math.round(box.right));
            }
          }
          return out.slice(0, 8);
        }"""
    )


def axe_serious(page) -> list[str]:
    """axe-core's serious and critical violations of the page as it is now."""
    if not AXE.exists():
        pytest.skip(f"{AXE} is missing: cd tests/console && npm ci")
    page.evaluate(AXE.read_text())
    result = page.evaluate(
        "async () => { const r = await axe.run(document, {resultTypes: ['violations']});"
        " return r.violations.filter(v => v.impact === 'serious' || v.impact === 'critical')"
        ".map(v => v.id + ': ' + v.nodes.slice(0, 3).map(n => n.target.join(' ')).join(' | ')); }"
    )
    return result


def check_page(page, viewport: str, where: str) -> None:
    """What every page must be: no overflow on the phone, no serious axe violation, no CSP
    violation."""
    page.wait_for_load_state("networkidle")
    if viewport == "phone":
        assert overflow(page) <= 0, (
            f"{where}: {overflow(page)} px wider than the phone: {wide_elements(page)}"
        )
    assert axe_serious(page) == [], where
    assert page.evaluate("window.__violations") == [], where


def shot(page, shots, name: str, viewport: str, *, full_page: bool = True) -> None:  # noqa: F811
    page.screenshot(path=shots / f"{name}-{viewport}.png", full_page=full_page, scale="css")


# --- 1 + 2: the hard UNKNOWN, with the provider's evidence at hand --------------------------


def test_hard_unknown_is_resolved_with_evidence_in_4_clicks(
    browser,  # noqa: F811
    live_server,
    oscar,
    bot,
    shots,  # noqa: F811
    viewport,
):
    effect = escalated_unknown(bot.principal, CHARGE)
    page = open_page(browser, live_server, "oscar@acme", viewport)
    key = effect.command.provider_key

    # 1: the effect from the queue.
    page.locator(f'tr[data-effect="{effect.pk}"] a').first.click()
    page.wait_for_url(re.compile(effect.pk))
    verdict = page.locator(".verdict")
    assert "billing may have done this" in verdict.inner_text()
    assert f"Check billing for key {key}" in verdict.inner_text()
    assert page.locator("#provider-key").inner_text() == key
    # The verdict and the buttons are on the first screen, on the phone too.
    height = VIEWPORTS[viewport]["viewport"]["height"]
    resolve = page.get_by_text("Resolve with evidence…")
    assert verdict.bounding_box()["y"] < height
    assert resolve.bounding_box()["y"] + resolve.bounding_box()["height"] <= height
    check_page(page, viewport, "effect page, hard UNKNOWN")
    shot(page, shots, "effect-hard-unknown", viewport)

    # 2: open the resolve form (prefilled with the key the provider holds).
    resolve.click()
    evidence = page.get_by_label("Evidence")
    assert evidence.input_value().startswith(f"billing key {key}")
    # 3: what the provider says.
    page.get_by_role("radio", name=re.compile("^confirmed")).check()
    # Tab to the evidence, to its end, and add what billing's console showed.
    page.keyboard.press("Tab")
    page.keyboard.press("End")
    page.keyboard.type("captured, seen")
    # 4: record it.
    page.get_by_role("button", name="Record the resolution").click()
    page.locator(".verdict").get_by_text("billing did this").wait_for()
    clicks, keys = counts(page)
    # Counted by the page: the four clicks above, Tab, End and the 14 characters typed.
    assert 0 < clicks <= 4, clicks
    assert 0 < keys <= 30, keys
    assert (clicks, keys) == (4, 16)
    effect.refresh_from_db()
    assert effect.status == "CONFIRMED"
    from reconciliation.models import ReconciliationRecord

    record = ReconciliationRecord.objects.get(effect=effect, kind="manual")
    assert record.evidence == f"billing key {key}: captured, seen"
    page.context.close()


# --- 3 + 4: one inbox, and a 150-effect outage settled from it --------------------------------


@pytest.mark.worker
def test_150_effect_outage_is_settled_in_5_clicks(
    browser,  # noqa: F811
    live_server,
    oscar,
    bot,
    sandbox,
    shots,  # noqa: F811
    viewport,
    job_queue,
    tmp_path,
):
    from tests.support.processes import Celery

    effects = [
        escalated_unknown(bot.principal, REFUND, resource={"type": "order", "id": f"ord_{n}"})
        for n in range(150)
    ]
    for effect in effects:
        captured_at_provider(sandbox, effect)
    page = open_page(browser, live_server, "oscar@acme", viewport)
    group = page.locator('[data-group="billing/billing.refund.create/escalated"]')
    assert group.locator(".group-count").inner_text() == "150"
    check_page(page, viewport, "triage, outage")
    shot(page, shots, "triage-outage", viewport, full_page=False)

    # The lookups are a background job: a real worker does them while the card shows progress.
    worker = Celery("worker", job_queue, tmp_path / "worker.log", pool="solo")
    try:
        group.get_by_text("Act on all 150…").click()
        group.get_by_role("button", name="Look up all 150 now").click()
        page.locator("#bulk-jobs .job-card").first.wait_for()
        check_page(page, viewport, "triage, bulk job")
        page.locator('#bulk-jobs .job-card[data-state="done"]').wait_for(timeout=120_000)
    finally:
        worker.stop()
    card = page.locator("#bulk-jobs .job-card").first.inner_text()
    assert settled_by_either(card, 150), card  # by the job's lookups or the wakers
    clicks, _ = counts(page)
    assert 0 < clicks <= 5, clicks
    assert Effect.objects.filter(pk__in=[e.pk for e in effects], status="CONFIRMED").count() == 150
    page.get_by_text("Nothing needs a human right now").wait_for()
    page.context.close()


def test_one_inbox_lists_every_kind_of_work_and_no_page_is_a_dead_end(
    browser,  # noqa: F811
    live_server,
    oscar,
    bot,
    shots,  # noqa: F811
    viewport,
):
    from sagas.models import SagaRun

    now = timezone.now()
    confirmed = set_state(
        submit(bot.principal, REFUND), status="CONFIRMED", provider_operation_id="op_77"
    )
    add_receipt(confirmed, provider_status="failed", digest_matches=True)
    open_case(confirmed, reason="contradiction", text="a later receipt says failed")
    failed = set_state(submit(bot.principal, EMAIL), status="COMPENSATION_FAILED")
    run = start_saga(bot.principal, order_id="ord_inbox")
    SagaRun.objects.filter(pk=run.pk).update(state="PAUSED_FAILED")
    set_state(submit(bot.principal, BIG_REFUND), created_at=now - timedelta(minutes=40))
    escalated_unknown(bot.principal, CHARGE)

    page = open_page(browser, live_server, "oscar@acme", viewport)
    queue = page.locator("#queue")
    for text in (
        "open case on a settled effect",
        "compensation failed",
        "escalated after 8 inconclusive lookups",
        "waiting for an approver for more than 15 min",
    ):
        assert text in queue.inner_text(), text
    assert queue.locator(f'[data-saga="{run.pk}"]').is_visible()
    check_page(page, viewport, "triage, inbox")
    shot(page, shots, "triage", viewport)

    # The confirmed effect whose later receipt disagrees: its case is closed from its page.
    page.locator(f'tr[data-effect="{confirmed.pk}"] a').first.click()
    page.get_by_text("Close the case…").click()
    page.get_by_label("What you found").fill("billing shows op_77 captured; the receipt was wrong")
    page.get_by_role("button", name="Close the case").click()
    page.locator("#flash").get_by_text("Closed case").wait_for()
    check_page(page, viewport, "effect page, case closed")
    # The failed compensation: record the manual fix.
    page.goto(f"{live_server.url}/effects/{failed.pk}")
    check_page(page, viewport, "effect page, compensation failed")
    shot(page, shots, "effect-compensation-failed", viewport)
    page.get_by_text("Record the manual fix…").click()
    page.get_by_label("What you did").fill("sent the correction from the mail console")
    page.get_by_role("button", name="Record the fix").click()
    page.locator("#flash").get_by_text("Recorded the fix").wait_for()
    # Back to the queue: both left it.
    page.locator("a[data-triage-link]").click()
    page.wait_for_url(re.compile(r"/(\?.*)?$"))
    assert confirmed.pk not in page.locator("#queue").inner_text()
    assert failed.pk not in page.locator("#queue").inner_text()
    page.context.close()


# --- 5: who is on it -------------------------------------------------------------------------


def test_who_is_on_it_and_who_else_looks(
    browser,  # noqa: F811
    live_server,
    oscar,
    root,
    bot,
    viewport,
):
    effect = escalated_unknown(bot.principal, CHARGE)
    mine = open_page(browser, live_server, "oscar@acme", viewport)
    theirs = open_page(browser, live_server, "root@acme", "desktop")
    mine.goto(f"{live_server.url}/effects/{effect.pk}")
    mine.get_by_role("button", name="Take it").click()
    mine.get_by_text("You are on it").wait_for()
    theirs.goto(f"{live_server.url}/effects/{effect.pk}")
    assert "oscar is on it" in theirs.locator(".presence").inner_text()
    assert "Also looking: oscar" in theirs.locator(".presence").inner_text()
    # Within a poll, oscar's page says root is looking too.
    mine.locator(".presence").get_by_text("Also looking: root").wait_for(timeout=15_000)
    theirs.goto(f"{live_server.url}/")
    row = theirs.locator(f'tr[data-effect="{effect.pk}"]')
    assert "oscar" in row.inner_text()
    check_page(mine, viewport, "effect page, taken")
    mine.get_by_role("button", name="Release").click()
    mine.get_by_role("button", name="Take it").wait_for()
    mine.context.close()
    theirs.context.close()


def test_a_stale_action_redraws_the_page_and_says_who_changed_it(
    browser,  # noqa: F811
    live_server,
    oscar,
    root,
    bot,
    viewport,
):
    effect = escalated_unknown(bot.principal, CHARGE)
    page = open_page(browser, live_server, "oscar@acme", viewport)
    page.goto(f"{live_server.url}/effects/{effect.pk}")
    page.get_by_text("Resolve with evidence…").click()
    page.get_by_role("radio", name=re.compile("^not started")).check()
    page.get_by_label("Evidence").fill("not in billing")
    # Meanwhile root settles it.
    from reconciliation.services import effect_resolve

    effect_resolve(
        effect=effect, principal=root.principal, outcome="confirmed", evidence="ch_1 captured"
    )
    page.get_by_role("button", name="Record the resolution").click()
    page.locator(".changed-by").get_by_text("Meanwhile admin:root changed it").wait_for()
    assert "CONFIRMED" in page.locator(".changed-by").inner_text()
    page.context.close()


# --- 6: search and keyboard ------------------------------------------------------------------


def test_search_and_keyboard(
    browser,  # noqa: F811
    live_server,
    oscar,
    bot,
    sandbox,
    viewport,
):
    first = set_state(submit(bot.principal, REFUND), status="UNKNOWN")
    second = set_state(submit(bot.principal, CHARGE), status="UNKNOWN")
    page = open_page(browser, live_server, "oscar@acme", viewport)
    # ? lists the shortcuts.
    page.keyboard.press("?")
    assert page.locator("#shortcuts").is_visible()
    page.keyboard.press("Escape")
    # / searches: the provider's key of the charge opens it.
    page.keyboard.press("/")
    page.keyboard.type(second.command.provider_key)
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(second.pk))
    check_page(page, viewport, "effect page, found by search")
    # j j Enter in triage opens the second row.
    page.goto(f"{live_server.url}/")
    page.keyboard.press("j")
    page.keyboard.press("j")
    assert page.locator("tr.selected").get_attribute("data-effect") == second.pk
    page.keyboard.press("k")
    assert page.locator("tr.selected").get_attribute("data-effect") == first.pk
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(first.pk))
    # r reconciles (the sandbox never saw the key: NOT_STARTED, sent again).
    page.keyboard.press("r")
    page.locator("#flash").get_by_text("Asked the provider").wait_for()
    first.refresh_from_db()
    assert first.status == "NOT_STARTED"
    # A search with several results lists them.
    page.goto(f"{live_server.url}/search?q=ord_881")
    check_page(page, viewport, "search results")
    page.context.close()


def test_filters_are_kept_on_the_way_back(browser, live_server, oscar, bot, viewport):  # noqa: F811
    effect = set_state(submit(bot.principal, REFUND), status="UNKNOWN")
    set_state(submit(bot.principal, EMAIL), status="COMPENSATION_FAILED")
    page = open_page(browser, live_server, "oscar@acme", viewport)
    if viewport == "phone":
        # The phone's first screen is the queue: the filters open behind one button.
        page.get_by_role("button", name="Filters").click()
    page.get_by_label("Status").select_option("UNKNOWN")
    page.wait_for_url(re.compile(r"status=UNKNOWN"))
    page.locator(f'tr[data-effect="{effect.pk}"] a').first.click()
    page.locator("a[data-triage-link]").click()
    page.wait_for_url(re.compile(r"status=UNKNOWN"))
    page.get_by_role("heading", name=re.compile("1 effect needs a human")).wait_for()
    page.context.close()


# --- 7: the phone's nav, every page without overflow and without serious axe findings -----------


def test_every_page_in_both_viewports(
    browser,  # noqa: F811
    live_server,
    oscar,
    alice,
    bot,
    shots,  # noqa: F811
    viewport,
):
    unknown = escalated_unknown(bot.principal, CHARGE)
    diff = set_state(submit(bot.principal, REFUND), status="UNKNOWN", mismatch=True)
    add_receipt(
        diff,
        payload_digest="sha256:" + "0" * 64,
        digest_matches=False,
        result={"refund_id": "re_7f3a", "amount": 5000, "currency": "EUR", "state": "accepted"},
    )
    waiting = submit(bot.principal, BIG_REFUND)
    run = start_saga(bot.principal, order_id="ord_pages")
    open_case(diff, reason="mismatch", text="the provider recorded something else")
    page = open_page(browser, live_server, "oscar@acme", viewport)
    if viewport == "phone":
        # The nav is a menu: every page, Controls included, is one tap away.
        assert not page.get_by_role("link", name="Controls").is_visible()
        page.get_by_role("button", name="Menu").click()
        assert page.get_by_role("link", name="Controls").is_visible()
    for path, name in (
        ("/", "triage"),
        (f"/effects/{unknown.pk}", "effect"),
        (f"/effects/{diff.pk}", "effect-diff"),
        (f"/effects/{waiting.pk}", "effect-waiting"),
        ("/approvals", "approvals"),
        ("/cases", "cases"),
        ("/sagas", "sagas"),
        (f"/sagas/{run.pk}", "saga"),
        ("/controls", "controls"),
        ("/search?q=ord_881", "search"),
        ("/triage/jobs", "bulk-jobs"),
        ("/providers", "providers"),
    ):
        page.goto(f"{live_server.url}{path}")
        check_page(page, viewport, path)
        if name in ("effect", "effect-diff", "approvals", "cases", "saga", "controls"):
            shot(page, shots, name, viewport)
    # Open forms count too: the resolve form and the approval card.
    page.goto(f"{live_server.url}/effects/{unknown.pk}")
    page.get_by_text("Resolve with evidence…").click()
    check_page(page, viewport, "resolve form open")
    page.context.close()
    # The approver's inbox, and a wrong digest answered without the right one.
    page = open_page(browser, live_server, "alice@acme", viewport)
    page.goto(f"{live_server.url}/approvals")
    card = page.locator(f"#approval-{waiting.pk}")
    assert "250.00 EUR" in card.inner_text()
    card.get_by_label("Digest you read").fill("sha256:" + "1" * 64)
    card.get_by_role("button", name="Approve").click()
    error = card.locator(".card-error")
    error.get_by_text("not this command's digest").wait_for()
    assert waiting.command.payload_digest.removeprefix("sha256:") not in error.inner_text()
    check_page(page, viewport, "approvals, wrong digest")
    shot(page, shots, "approvals-wrong-digest", viewport)
    page.context.close()
    # The login page, signed out.
    context = browser.new_context(color_scheme="dark", **VIEWPORTS[viewport])
    page = context.new_page()
    page.add_init_script(COUNTERS)
    page.goto(f"{live_server.url}/login")
    check_page(page, viewport, "/login")
    context.close()


def test_light_scheme_has_no_serious_axe_violation(browser, live_server, oscar, bot):  # noqa: F811
    unknown = escalated_unknown(bot.principal, CHARGE)
    page = open_page(browser, live_server, "oscar@acme", "desktop", scheme="light")
    for path in (
        "/",
        f"/effects/{unknown.pk}",
        "/approvals",
        "/cases",
        "/sagas",
        "/controls",
        "/providers",
    ):
        page.goto(f"{live_server.url}{path}")
        check_page(page, "desktop", f"light {path}")
    page.context.close()


def test_axe_is_installed_from_the_registry():
    """The axe checks above skip without it; this says so loudly instead of passing quietly."""
    if not AXE.exists():
        pytest.skip("axe-core is not installed: cd tests/console && npm ci")
    package = json.loads((AXE.parent / "package.json").read_text())
    assert package["name"] == "axe-core"


# --- 9: polish ------------------------------------------------------------------------------


def test_polls_do_not_dim_buttons_and_lost_contact_clears_itself(
    browser,  # noqa: F811
    live_server,
    oscar,
    bot,
):
    set_state(submit(bot.principal, REFUND), status="UNKNOWN")
    page = open_page(browser, live_server, "oscar@acme", "desktop")
    # A poll marks the whole queue as an htmx request: its buttons keep their look.
    page.evaluate("document.getElementById('queue').classList.add('htmx-request')")
    button = page.locator("#queue .btn").first
    assert button.evaluate("b => getComputedStyle(b).opacity") == "1"
    page.evaluate("document.getElementById('queue').classList.remove('htmx-request')")
    # The flash region is in the flow: it pushes the page down instead of covering it.
    assert page.evaluate("getComputedStyle(document.getElementById('flash')).position") == "sticky"
    # The gateway cannot be reached: the page says so; a poll that gets through clears it.
    page.route(re.compile(r".*since=.*"), lambda route: route.abort())
    page.locator("#flash").get_by_text("Lost contact with the gateway").wait_for(timeout=15_000)
    page.unroute(re.compile(r".*since=.*"))
    page.locator("#flash [data-lost]").wait_for(state="detached", timeout=15_000)
    page.context.close()


def test_good_news_clears_itself(browser, live_server, oscar, bot):  # noqa: F811
    effect = set_state(submit(bot.principal, REFUND), status="UNKNOWN")
    page = open_page(browser, live_server, "oscar@acme", "desktop")
    page.goto(f"{live_server.url}/effects/{effect.pk}")
    page.get_by_role("button", name="Take it").click()
    toast = page.locator("#flash .flash-success")
    toast.wait_for()
    toast.wait_for(state="detached", timeout=12_000)
    page.context.close()
