"""The dashboard in Debian's chromium (Playwright), on a desktop and on a 390 px phone, in the
dark and the light scheme: every chart drawn (a canvas per chart and per sparkline) in the
scheme's own colours, no horizontal overflow on the phone, no serious or critical axe-core
finding, no Content-Security-Policy violation, and the table beside each chart holding the
numbers SQL counts over the ledger's rows."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from gateway.rollup import rollup_recent
from tests.console.conftest import REFUND, set_state, submit
from tests.console.test_browser import browser, shots  # noqa: F401 - fixtures
from tests.console.test_console_flows import check_page, open_page, shot
from tests.console.test_dashboard import ledger  # noqa: F401 - fixture

# What static/dashboard.css gives --chart-0 in each scheme.
SERIES_0 = {"dark": "#8cc4ff", "light": "#0b5cad"}


def _sql_status_counts(tenant_id: int, since, end) -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT to_status, count(*) FROM gateway_effectevent WHERE tenant_id = %s"
            " AND to_status <> '' AND created_at >= %s AND created_at < %s GROUP BY 1",
            [tenant_id, since, end],
        )
        return dict(cursor.fetchall())


@pytest.mark.parametrize("scheme", ["dark", "light"])
@pytest.mark.parametrize("viewport", ["desktop", "phone"])
def test_the_dashboard_in_both_sizes_and_schemes(
    browser,  # noqa: F811
    live_server,
    oscar,
    bot,
    ledger,  # noqa: F811
    shots,  # noqa: F811
    viewport,
    scheme,
):
    now = timezone.now()
    set_state(submit(bot.principal, REFUND), status="UNKNOWN", status_changed_at=now)
    rollup_recent()
    page = open_page(browser, live_server, "oscar@acme", viewport, scheme=scheme)
    if viewport == "phone":
        page.get_by_role("button", name="Menu").click()
    page.get_by_role("link", name="Dashboard").click()
    page.wait_for_url("**/dashboard")
    page.get_by_role("link", name="last day").click()
    page.wait_for_url("**/dashboard?range=day")
    charts = page.locator("[data-chart]").count()
    sparks = page.locator("[data-spark]").count()
    assert charts == 4 and sparks >= 1
    page.wait_for_function(
        f"document.querySelectorAll('[data-chart] canvas, [data-spark] canvas').length"
        f" === {charts + sparks}"
    )
    colour = page.evaluate(
        "getComputedStyle(document.querySelector('[data-chart]'))"
        ".getPropertyValue('--chart-0').trim()"
    )
    assert colour == SERIES_0[scheme]
    check_page(page, viewport, f"dashboard {viewport} {scheme}")
    # The table alternative, as the browser shows it, against SQL over the events.
    table = page.evaluate(
        """() => {
          const t = document.getElementById('statuses-table');
          const columns = [...t.tHead.rows[0].cells].slice(1).map(c => c.textContent.trim());
          const sums = Object.fromEntries(columns.map(c => [c, 0]));
          for (const row of t.tBodies[0].rows) {
            columns.forEach((c, i) => { sums[c] += Number(row.cells[i + 1].textContent); });
          }
          return sums;
        }"""
    )
    since = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=23)
    end = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    assert table == _sql_status_counts(oscar.principal.tenant_id, since, end)
    page.get_by_text("Table: effects entering each status, per step").click()
    check_page(page, viewport, f"dashboard {viewport} {scheme}, table open")
    shot(page, shots, f"dashboard-{scheme}", viewport)
    page.context.close()


def test_an_empty_ledger_draws_without_a_script_error(browser, live_server, olga):  # noqa: F811
    errors: list[str] = []
    page = open_page(browser, live_server, "olga@globex", "desktop")
    page.on("pageerror", lambda error: errors.append(str(error)))
    for name in ("hour", "day", "week"):
        page.goto(f"{live_server.url}/dashboard?range={name}")
        page.wait_for_function("document.querySelectorAll('[data-chart] canvas').length >= 3")
        assert page.get_by_text("No attempt finished in the").is_visible()
        assert page.get_by_text("The triage queue is empty.").is_visible()
    assert errors == []
    check_page(page, "desktop", "empty dashboard")
    page.context.close()
