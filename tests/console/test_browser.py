"""The console in a real browser (Debian's chromium driven by Playwright) against the live
server: login, the triage poll, an action answered in place, approving by digest, and the
same forms with JavaScript off.

Screenshots go to a temporary folder; set ``CONSOLE_SCREENSHOTS=docs/screenshots`` to refresh
the ones the docs show.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from tests.console.conftest import (
    BIG_REFUND,
    EMAIL,
    PASSWORD,
    REFUND,
    SHIPMENT,
    TICKET,
    add_attempt,
    add_receipt,
    set_state,
    submit,
)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install playwright==1.65.2)"
)
pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(),
    reason=f"{CHROMIUM} is missing: apt-get install chromium (or make browser)",
)


@pytest.fixture(scope="module")
def browser():
    # Playwright's sync API keeps an event loop running in this thread while it is open; the
    # ORM calls of the tests (and of the database teardown) are still plain synchronous code.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield browser
            browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def shots(tmp_path) -> Path:
    folder = os.environ.get("CONSOLE_SCREENSHOTS")
    path = Path(folder) if folder else tmp_path
    path.mkdir(parents=True, exist_ok=True)
    return path


def page_for(browser, live_server, username: str, **options):
    context = browser.new_context(
        viewport={"width": 1366, "height": 900}, color_scheme="dark", **options
    )
    page = context.new_page()
    page.set_default_timeout(10_000)
    page.goto(f"{live_server.url}/login")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r"/$"))
    return page


@pytest.fixture
def night_shift(bot):
    """A queue an on-call engineer might find at 3 a.m."""
    now = timezone.now()
    agent = bot.principal
    unknown = set_state(
        submit(agent, REFUND),
        status="UNKNOWN",
        mismatch=True,
        attempt_count=1,
        created_at=now - timedelta(minutes=42),
        status_changed_at=now - timedelta(minutes=38),
    )
    add_attempt(unknown)
    add_receipt(
        unknown,
        payload_digest="sha256:" + "0" * 64,
        digest_matches=False,
        result={"refund_id": "re_7f3a", "amount": 5000, "currency": "EUR", "state": "accepted"},
    )
    set_state(
        submit(agent, SHIPMENT),
        status="IN_PROGRESS",
        attempt_count=1,
        created_at=now - timedelta(hours=3),
        status_changed_at=now - timedelta(hours=2, minutes=50),
    )
    set_state(
        submit(agent, TICKET),
        status="NOT_STARTED",
        escalated=True,
        attempt_count=5,
        created_at=now - timedelta(hours=1),
    )
    set_state(
        submit(agent, EMAIL),
        status="COMPENSATION_FAILED",
        attempt_count=1,
        created_at=now - timedelta(days=2),
    )
    set_state(submit(agent, REFUND, resource={"type": "order", "id": "ord_9"}), status="UNKNOWN")
    waiting = submit(agent, BIG_REFUND, resource={"type": "order", "id": "ord_42", "version": 3})
    return {"unknown": unknown, "waiting": waiting}


def test_triage_polls_and_redraws_only_on_change(browser, live_server, oscar, night_shift, shots):
    page = page_for(browser, live_server, "oscar@acme")
    assert page.get_by_role("heading", name=re.compile("5 effects need a human")).is_visible()
    page.screenshot(path=shots / "triage.png", full_page=True)

    # Someone else freezes an effect: within a poll or two the row says so, without a reload.
    set_state(night_shift["unknown"], frozen=True)
    row = page.locator(f'tr[data-effect="{night_shift["unknown"].pk}"]')
    row.locator(".chip-frozen").wait_for(timeout=15_000)

    # Filters swap the table and push the URL; the page itself is not reloaded.
    page.get_by_label("Status").select_option("UNKNOWN")
    page.wait_for_url(re.compile(r"status=UNKNOWN"))
    page.get_by_role("heading", name=re.compile("2 effects need a human")).wait_for()
    page.context.close()


def test_effect_page_diff_and_an_action_in_place(browser, live_server, oscar, night_shift, shots):
    effect = night_shift["unknown"]
    page = page_for(browser, live_server, "oscar@acme")
    page.goto(f"{live_server.url}/effects/{effect.pk}")
    differing = page.locator("table.compare tr.differs th")
    assert sorted(differing.all_inner_texts()) == ["payload.amount", "payload_digest"]
    page.screenshot(path=shots / "effect-diff.png", full_page=True)

    page.get_by_text("Freeze…").click()
    page.get_by_label("Reason (optional)").fill("provider incident INC-7")
    page.get_by_role("button", name="Freeze", exact=True).click()
    page.locator("#flash .flash-success").wait_for()
    assert "Froze" in page.locator("#flash").inner_text()
    assert page.locator("#effect .chip-frozen").first.is_visible()
    assert page.get_by_role("button", name="Unfreeze").is_visible()
    assert page.locator(".timeline").get_by_text("provider incident INC-7").is_visible()
    page.screenshot(path=shots / "effect-after-freeze.png")
    page.context.close()


def test_approve_by_digest_in_the_inbox(browser, live_server, alice, night_shift, shots):
    effect = night_shift["waiting"]
    page = page_for(browser, live_server, "alice@acme")
    page.goto(f"{live_server.url}/approvals")
    card = page.locator(f"#approval-{effect.pk}")
    assert "250.00 EUR" in card.inner_text()
    page.screenshot(path=shots / "approvals.png", full_page=True)

    card.get_by_label("Digest you read").fill("sha256:" + "a" * 64)
    card.get_by_role("button", name="Approve").click()
    error = page.locator(f"#approval-{effect.pk}-error [role=alert]")
    error.wait_for()
    assert "not the command's digest" in error.inner_text()
    card.screenshot(path=shots / "approvals-wrong-digest.png")
    effect.refresh_from_db()
    assert effect.status == "AWAITING_APPROVAL"

    digest = page.locator(f"#approval-{effect.pk}-digest").inner_text()
    card.get_by_label("Digest you read").fill(digest)
    card.get_by_role("button", name="Approve").click()
    card.get_by_text("Now PREPARED: approved by alice").wait_for()
    assert page.locator("#approvals-badge").inner_text().startswith("0")
    effect.refresh_from_db()
    assert effect.status == "PREPARED"
    page.context.close()


def test_forms_work_without_javascript(browser, live_server, oscar, night_shift):
    effect = night_shift["unknown"]
    page = page_for(browser, live_server, "oscar@acme", java_script_enabled=False)
    page.get_by_label("Status").select_option("UNKNOWN")
    page.get_by_role("button", name="Apply").click()
    page.wait_for_url(re.compile(r"status=UNKNOWN"))
    page.get_by_role("link", name=effect.pk).click()
    page.get_by_text("Freeze…").click()
    page.get_by_role("button", name="Freeze", exact=True).click()
    page.wait_for_url(re.compile(rf"/effects/{effect.pk}$"))
    assert "Froze" in page.locator("#flash").inner_text()
    effect.refresh_from_db()
    assert effect.frozen
    page.context.close()
