"""Saved views, exports, the audit list and the theme in Debian's chromium (Playwright), on a
desktop and a 390 px phone: a view saved from the triage filters and applied from the list,
a filtered list downloaded and parsed back, the audit list filtered, and the theme chosen,
kept across pages and applied before the first paint — each page with no horizontal overflow
on the phone, no serious or critical axe-core finding in either theme, and no CSP violation.
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

from gateway import services
from gateway.models import SavedView
from tests.console.conftest import REFUND, TICKET, set_state, submit
from tests.console.test_browser import browser, shots  # noqa: F401 - fixtures
from tests.console.test_console_flows import (
    check_page,
    counts,
    open_page,
    shot,
    viewport,  # noqa: F401 - fixture
)

# What <html data-theme> was when the body first appeared: the theme of the first paint.
FIRST_PAINT = """
(() => {
  const observer = new MutationObserver(() => {
    if (document.body && !('firstPaintTheme' in window)) {
      window.firstPaintTheme = document.documentElement.getAttribute('data-theme') || 'system';
      observer.disconnect();
    }
  });
  observer.observe(document, {childList: true, subtree: true});
})();
"""

DARK_BG = "rgb(14, 17, 22)"
LIGHT_BG = "rgb(246, 247, 249)"


def background(page) -> str:
    return page.evaluate("getComputedStyle(document.body).backgroundColor")


def open_views(page) -> None:
    page.locator(".views-menu > summary", has_text="Saved views").click()


def open_export(page) -> None:
    page.locator(".views-menu > summary", has_text="Export").click()


def test_save_a_view_and_apply_it(browser, live_server, oscar, bot, viewport, shots):  # noqa: F811
    refunds = [set_state(submit(bot.principal, REFUND), status="UNKNOWN") for _ in range(2)]
    ticket = set_state(submit(bot.principal, TICKET), status="UNKNOWN")
    page = open_page(browser, live_server, "oscar@acme", viewport)
    # The filter changes the queue in place (htmx) and the address bar; the view saves that.
    if page.locator(".filters-button").is_visible():  # the phone's filters, behind one button
        page.locator(".filters-button").click()
    page.get_by_label("Type").select_option("billing.refund.create")
    page.wait_for_url(re.compile(r"type=billing.refund.create"))
    open_views(page)
    page.get_by_label("Save the current filters as").fill("refunds")
    page.get_by_label("Share with my tenant").check()
    page.get_by_role("button", name="Save view").click()
    page.wait_for_load_state("networkidle")
    view = SavedView.objects.get()
    assert (view.name, view.query, view.shared) == ("refunds", "type=billing.refund.create", True)
    assert "Saved the view" in page.locator("#flash").inner_text()
    # From the unfiltered queue, the view is one click away.
    page.goto(f"{live_server.url}/")
    assert page.locator(f"tr[data-effect='{ticket.pk}']").count() == 1
    page.evaluate("sessionStorage.clear()")
    open_views(page)
    page.get_by_role("link", name="refunds").click()
    page.wait_for_url(re.compile(r"\?type=billing.refund.create$"))
    shown = page.locator("tr[data-effect]").evaluate_all(
        "rows => rows.map(r => r.getAttribute('data-effect'))"
    )
    assert sorted(shown) == sorted(e.pk for e in refunds)
    assert counts(page)[0] <= 2
    open_views(page)
    shot(page, shots, "saved-views", viewport, full_page=False)
    check_page(page, viewport, "/ with a saved view")
    page.context.close()


def test_export_the_filtered_queue(browser, live_server, oscar, bot, viewport):  # noqa: F811
    refunds = [set_state(submit(bot.principal, REFUND), status="UNKNOWN") for _ in range(3)]
    set_state(submit(bot.principal, TICKET), status="UNKNOWN")
    page = open_page(browser, live_server, "oscar@acme", viewport)
    if page.locator(".filters-button").is_visible():  # the phone's filters, behind one button
        page.locator(".filters-button").click()
    page.get_by_label("Type").select_option("billing.refund.create")
    page.wait_for_url(re.compile(r"type=billing.refund.create"))
    open_export(page)
    check_page(page, viewport, "/ with the export menu open")
    with page.expect_download() as download:
        page.locator("a[data-export][href^='/export/triage.csv']").click()
    assert download.value.suggested_filename.startswith("acme-triage-")
    rows = list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text())))
    assert sorted(row["effect_id"] for row in rows) == sorted(e.pk for e in refunds)
    page.context.close()


def test_audit_list_filter_and_export(browser, live_server, oscar, bot, viewport, shots):  # noqa: F811
    first = submit(bot.principal, REFUND)
    second = submit(bot.principal, TICKET)
    services.effect_set_frozen(effect=first, principal=oscar.principal, frozen=True, reason="hold")
    services.effect_set_frozen(effect=second, principal=oscar.principal, frozen=True, reason="too")
    page = open_page(browser, live_server, "oscar@acme", viewport)
    page.goto(f"{live_server.url}/audit")
    check_page(page, viewport, "/audit")
    page.get_by_label("Action").fill("frozen")
    page.get_by_label("Effect id").fill(first.pk)
    page.get_by_role("button", name="Apply").click()
    page.wait_for_url(re.compile(r"/audit\?.*action=frozen"))
    rows = page.locator("tr[data-event]")
    assert rows.count() == 1
    assert "hold" in rows.first.inner_text() and "operator:oscar" in rows.first.inner_text()
    shot(page, shots, "audit", viewport)
    open_export(page)
    with page.expect_download() as download:
        page.locator("a[data-export][href^='/export/audit.jsonl']").click()
    lines = [json.loads(line) for line in Path(download.value.path()).read_text().splitlines()]
    assert [(line["action"], line["effect_id"]) for line in lines] == [("frozen", first.pk)]
    page.context.close()


def test_audit_list_in_both_themes_and_both_system_schemes(
    browser,  # noqa: F811
    live_server,
    oscar,
    bot,
    viewport,  # noqa: F811
):
    effect = submit(bot.principal, REFUND)
    services.effect_set_frozen(effect=effect, principal=oscar.principal, frozen=True, reason="x")
    for scheme in ("dark", "light"):
        page = open_page(browser, live_server, "oscar@acme", viewport, scheme=scheme)
        for theme in ("system", "light", "dark"):
            page.goto(f"{live_server.url}/audit")
            page.locator("[data-theme-choice]").select_option(theme)
            check_page(page, viewport, f"/audit, {scheme} system, theme {theme}")
            page.goto(f"{live_server.url}/")
            open_views(page)
            check_page(page, viewport, f"/, {scheme} system, theme {theme}")
        page.context.close()


def test_theme_toggle_is_kept_and_applied_before_the_first_paint(
    browser,  # noqa: F811
    live_server,
    oscar,
    viewport,  # noqa: F811
):
    page = open_page(browser, live_server, "oscar@acme", viewport, scheme="dark")
    page.add_init_script(FIRST_PAINT)
    assert background(page) == DARK_BG
    toggle = page.get_by_label("Theme")
    assert toggle.input_value() == "system"
    toggle.select_option("light")
    assert page.evaluate("document.documentElement.getAttribute('data-theme')") == "light"
    assert background(page) == LIGHT_BG
    # Kept across pages, and on <html> before the body existed: no flash of the dark theme.
    page.goto(f"{live_server.url}/audit")
    assert page.evaluate("window.firstPaintTheme") == "light"
    assert background(page) == LIGHT_BG
    assert page.get_by_label("Theme").input_value() == "light"
    check_page(page, viewport, "/audit in the light theme on a dark system")
    # Back to the system's.
    page.get_by_label("Theme").select_option("system")
    page.reload()
    assert page.evaluate("window.firstPaintTheme") == "system"
    assert background(page) == DARK_BG
    page.context.close()
