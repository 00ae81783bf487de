"""The console in a real browser (Debian's chromium driven by Playwright) against the live
server: login, the triage poll, an action answered in place, approving by digest, the same
forms with JavaScript off, the human queue, freezing an effect type on the controls page, and
freezing a saga and seeing it stop.

Screenshots go to a temporary folder; set ``CONSOLE_SCREENSHOTS=docs/screenshots`` to refresh
the ones the docs show.
"""

from __future__ import annotations

import os
import re
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from gateway.models import Capability, EffectTypeFreeze
from tests.console.conftest import (
    BIG_REFUND,
    EMAIL,
    PASSWORD,
    REFUND,
    SHIPMENT,
    TICKET,
    add_attempt,
    add_orphan,
    add_receipt,
    open_case,
    saga_step_effect,
    set_state,
    start_saga,
    submit,
)

# What a Claude Code session puts in a command's context (gateway.agent_hooks).
CLAUDE_CONTEXT = {
    "runtime": "claude-code",
    "agent": "refund-bot",
    "session_id": "sess-4f1c",
    "run_id": "run-incident-120",
    "call_id": "toolu_01A",
}

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
    # Every freeze asks for a confirmation (hx-confirm): the engineer says yes.
    page.on("dialog", lambda dialog: dialog.accept())
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
        submit(agent, REFUND, context=CLAUDE_CONTEXT),
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


@pytest.fixture
def stopped_saga(bot):
    """A run whose compensation failed (frozen, its owner paged), for the triage queue; None
    while the sagas app is not there."""
    try:
        from sagas.models import SagaRun
    except ImportError:
        return None

    run = start_saga(bot.principal, order_id="ord_77")
    SagaRun.objects.filter(pk=run.pk).update(
        state="COMPENSATION_FAILED",
        frozen=True,
        frozen_reason="the refund of charge ch_91 was rejected: owner paged",
        updated_at=timezone.now() - timedelta(minutes=25),
    )
    return run


def test_triage_polls_and_redraws_only_on_change(
    browser, live_server, oscar, night_shift, stopped_saga, shots
):
    page = page_for(browser, live_server, "oscar@acme")
    assert page.get_by_role("heading", name=re.compile("5 effects need a human")).is_visible()
    if stopped_saga is not None:
        assert page.locator(f'.saga-alerts [data-saga="{stopped_saga.pk}"]').is_visible()
    row = page.locator(f'tr[data-effect="{night_shift["unknown"].pk}"]')
    assert "claude-code · refund-bot" in row.inner_text()
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
    page.get_by_label("Reason to freeze this effect").fill("provider incident INC-7")
    page.get_by_role("button", name="Freeze this effect").click()
    page.locator("#flash .flash-success").wait_for()
    assert "Froze" in page.locator("#flash").inner_text()
    assert page.locator("#effect .chip-frozen").first.is_visible()
    assert page.get_by_role("button", name="Unfreeze").is_visible()
    assert page.locator(".timeline").get_by_text("provider incident INC-7").is_visible()
    page.screenshot(path=shots / "effect-after-freeze.png")

    # Correlation: the run id opens the triage queue filtered by it.
    page.locator(".correlation-list").get_by_role("link", name="run-incident-120").click()
    page.wait_for_url(re.compile(r"context\.run_id=run-incident-120"))
    page.get_by_role("heading", name=re.compile("1 effect needs a human")).wait_for()
    assert page.locator("tr[data-effect]").count() == 1
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
    page.get_by_label("Reason to freeze this effect").fill("provider incident INC-7")
    page.get_by_role("button", name="Freeze this effect").click()
    page.wait_for_url(re.compile(rf"/effects/{effect.pk}$"))
    assert "Froze" in page.locator("#flash").inner_text()
    effect.refresh_from_db()
    assert effect.frozen
    page.context.close()


def test_take_and_resolve_a_case_in_the_human_queue(
    browser, live_server, oscar, root, night_shift, shots
):
    pytest.importorskip("reconciliation.services")
    from reconciliation.models import Case

    unknown = night_shift["unknown"]
    case = open_case(
        unknown,
        "mismatch",
        "the provider recorded something else",
        digest="sha256:" + "0" * 64,
        provider_operation_id="op_01TEST",
    )
    ticket = set_state(
        submit(night_shift["unknown"].command.requested_by, TICKET),
        status="NOT_STARTED",
        escalated=True,
        attempt_count=5,
    )
    taken = open_case(ticket, "retry_budget_exhausted", "5 dispatch attempts, none arrived")
    Case.objects.filter(pk=taken.pk).update(
        state="acknowledged",
        acknowledged_by=root.principal,
        acknowledged_at=timezone.now() - timedelta(minutes=3),
        opened_at=timezone.now() - timedelta(minutes=50),
    )
    add_orphan(oscar.principal.tenant, "op_8812", provider_status="succeeded")
    page = page_for(browser, live_server, "oscar@acme")
    assert page.locator("#cases-badge").inner_text().startswith("2")
    page.get_by_role("link", name=re.compile("^Cases")).click()
    page.wait_for_url(re.compile(r"/cases$"))
    card = page.locator(f"#case-{case.pk}")
    assert "the provider recorded something else" in card.inner_text()
    page.screenshot(path=shots / "cases.png", full_page=True)

    card.get_by_role("button", name="Take the case").click()
    card.get_by_text("Taken by oscar").wait_for()
    assert "You took case" in page.locator("#flash").inner_text()

    card.get_by_text("Resolve with evidence…").click()
    card.get_by_role("radio", name="confirmed — the provider did it").check()
    card.get_by_label("Evidence").fill("refund re_7f3a of 50.00 EUR in the billing dashboard")
    card.get_by_role("button", name=re.compile("^Resolve")).click()
    card.get_by_text("Resolved by oscar").wait_for()
    assert page.locator("#cases-badge").inner_text().startswith("1")
    unknown.refresh_from_db()
    assert unknown.status == "CONFIRMED"
    page.context.close()


def test_freeze_an_effect_type_on_the_controls_page(browser, live_server, oscar, bot, shots):
    from gateway.capabilities import capability_grant

    grant = capability_grant(
        granted_by="admin:root",
        principal=bot.principal,
        effect_types=["billing.refund.*"],
        resource_selector="order:ord_*",
        budget_count=20,
        budget_amount=100_000,
        budget_currency="EUR",
        expires_in=7 * 86400,
    )
    Capability.objects.filter(pk=grant.pk).update(spent_count=4, spent_amount=12_500)
    page = page_for(browser, live_server, "oscar@acme")
    page.get_by_role("link", name="Controls").click()
    page.wait_for_url(re.compile(r"/controls$"))
    row = page.locator('tr[data-type="ticket.create"]')
    assert "dispatching" in row.inner_text()
    page.screenshot(path=shots / "controls.png", full_page=True)

    row.get_by_text("Freeze…").click()
    row.get_by_label("Reason to freeze ticket.create").fill("ticketing provider incident INC-12")
    row.get_by_role("button", name="Freeze ticket.create").click()
    page.locator("#flash .flash-success").wait_for()
    assert "Froze ticket.create" in page.locator("#flash").inner_text()
    row = page.locator('tr[data-type="ticket.create"]')
    row.locator(".chip-frozen").wait_for()
    assert "ticketing provider incident INC-12" in row.inner_text()
    assert page.locator("#types-heading .count").inner_text().startswith("1")
    freeze = EffectTypeFreeze.objects.get(tenant_id=oscar.principal.tenant_id)
    assert (freeze.type, freeze.frozen_by_id) == ("ticket.create", oscar.principal.pk)
    page.locator("#flash .flash-close").click()
    page.locator("#types").screenshot(path=shots / "controls-type-frozen.png")

    row.get_by_role("button", name="Unfreeze").click()
    page.locator('tr[data-type="ticket.create"] .chip-frozen').wait_for(state="detached")
    assert not EffectTypeFreeze.objects.exists()
    page.context.close()


def test_freeze_a_saga_and_see_it_stop(browser, live_server, oscar, bot, sandbox, shots):
    pytest.importorskip("sagas.services", reason="the sagas app is not there")
    from gateway.services import effect_dispatch
    from sagas.models import SagaStep
    from sagas.services import saga_advance

    run = start_saga(bot.principal)
    page = page_for(browser, live_server, "oscar@acme")
    page.get_by_role("link", name="Sagas").click()
    page.wait_for_url(re.compile(r"/sagas$"))
    page.screenshot(path=shots / "sagas.png", full_page=True)
    page.get_by_role("link", name=run.pk).click()
    page.wait_for_url(re.compile(rf"/sagas/{run.pk}$"))
    page.screenshot(path=shots / "saga.png", full_page=True)

    page.get_by_text("Freeze…").click()
    page.get_by_label("Reason to freeze the saga").fill("warehouse API incident INC-31")
    page.get_by_role("button", name="Freeze the saga").click()
    page.locator("#saga-frozen-note").wait_for()
    assert "warehouse API incident INC-31" in page.locator("#saga-frozen-note").inner_text()
    assert "Froze" in page.locator("#flash").inner_text()

    # The dispatcher sends nothing of a frozen saga: the waiting step stays where it is.
    waiting = saga_step_effect(run, "reserve_inventory")
    assert effect_dispatch(effect_id=waiting.pk, worker="test") is False
    assert sandbox.operations() == []
    assert saga_step_effect(run, "reserve_inventory").status == "PREPARED"

    # Had the step been sent before the freeze and happened, the run goes no further either.
    first = set_state(
        waiting,
        status="CONFIRMED",
        confirmed_at=timezone.now(),
        provider_operation_id="op_res_1",
    )
    add_receipt(first, result={"reservation_id": "res_77", "state": "held"})
    assert saga_advance(saga_id=run.pk) is False
    assert not SagaStep.objects.filter(run=run, name="charge_payment").exists()
    # The page redraws itself (the 5 s poll) and shows where the run stopped.
    page.locator('li.step-done[data-step="reserve_inventory"]').wait_for(timeout=15_000)
    charge = page.locator('li.step[data-step="charge_payment"]')
    assert "not issued" in charge.inner_text()
    assert page.locator("#saga-frozen-note").is_visible()
    page.locator("#flash .flash-close").click()
    page.screenshot(path=shots / "saga-frozen.png", full_page=True)

    page.get_by_text("Unfreeze…").click()
    page.get_by_role("button", name="Unfreeze the saga").click()
    page.locator("#saga-frozen-note").wait_for(state="detached")
    assert saga_advance(saga_id=run.pk)
    charge.locator(".badge").wait_for(timeout=15_000)
    assert "not issued" not in charge.inner_text()
    page.context.close()


def test_no_page_breaks_the_content_security_policy(
    browser, live_server, oscar, night_shift, stopped_saga
):
    page = page_for(browser, live_server, "oscar@acme")
    # Every later navigation records CSP violations and any eval htmx was refused.
    page.add_init_script(
        "window.__violations = [];"
        "document.addEventListener('securitypolicyviolation', e =>"
        "  window.__violations.push(e.violatedDirective + ' ' + e.blockedURI));"
        "document.addEventListener('htmx:evalDisallowedError', () =>"
        "  window.__violations.push('htmx wanted eval'));"
    )
    effect = night_shift["unknown"]
    seen: list[str] = []
    for path in ("/effects/" + effect.pk, "/approvals", "/cases", "/sagas", "/controls", "/"):
        page.goto(f"{live_server.url}{path}")
        page.wait_for_load_state("networkidle")
        if path == "/":
            page.wait_for_timeout(5_500)  # a 5-second poll fires
        seen += page.evaluate("window.__violations")
    assert seen == []
    page.context.close()


@pytest.mark.worker
def test_a_500_effect_outage_is_settled_in_two_clicks_by_a_background_job(
    browser, live_server, oscar, bot, sandbox, job_queue, tmp_path, shots
):
    """500 charges escalated while billing was down, all made at the provider: "Look up all
    500 now" answers at once with the job's card; a real worker looks each one up once."""
    from collections import Counter

    from gateway.models import Effect
    from tests.console.conftest import captured_at_provider, escalated_unknown
    from tests.support.processes import Celery

    started = time.monotonic()
    effects = [
        escalated_unknown(bot.principal, resource={"type": "order", "id": f"ord_{n}"})
        for n in range(500)
    ]
    for effect in effects:
        captured_at_provider(sandbox, effect)
    print(f"500 escalated effects made in {time.monotonic() - started:.1f} s")
    worker = Celery("worker", job_queue, tmp_path / "worker.log", pool="solo")
    try:
        page = page_for(browser, live_server, "oscar@acme")
        group = page.locator('li[data-group="billing/billing.refund.create/escalated"]')
        clicks = 0
        group.get_by_text("Act on all 500…").click()
        clicks += 1
        with page.expect_response(lambda r: "/triage/bulk/reconcile" in r.url) as answer:
            group.get_by_role("button", name="Look up all 500 now").click()
            clicks += 1
        response = answer.value
        response.finished()
        seconds = response.request.timing["responseEnd"] / 1000
        print(f"the click was answered in {seconds * 1000:.0f} ms")
        assert response.status == 200
        assert seconds < 3.0, seconds
        card = page.locator("#bulk-jobs .job-card").first
        card.wait_for()
        assert "/ 500" in card.inner_text()
        page.locator('#bulk-jobs .job-card[data-state="done"]').wait_for(timeout=240_000)
        text = page.locator("#bulk-jobs .job-card").first.inner_text()
        # The job's lookups and the workers' wakers (which look up an effect re-armed for
        # now at once) share the effects: each is confirmed once, by one or the other.
        assert settled_by_either(text, 500), text
        assert "0 still unknown" in text and "started by oscar" in text
        page.screenshot(path=shots / "triage-bulk-job.png", full_page=True)
        assert clicks <= 3
    finally:
        worker.stop()
    assert Effect.objects.filter(pk__in=[e.pk for e in effects], status="CONFIRMED").count() == 500
    lookups = Counter(
        op["idempotency_key"] for op in sandbox.log() if op["action"].startswith("lookup")
    )
    # Each effect was looked up (by the job or a waker; a lookup is a read): none is missing,
    # and no effect was looked up more than once by each of the two.
    assert set(lookups) == {e.command.provider_key for e in effects}
    assert max(lookups.values()) <= 2
    page.context.close()


def settled_by_either(summary: str, total: int) -> bool:
    """A bulk job's summary: every effect confirmed by its lookup or already by the reconciler."""
    found = re.search(
        rf"{total} settled: (\d+) confirmed by lookup"
        r"(?:, (\d+) already settled by the reconciler)?",
        summary,
    )
    return found is not None and int(found.group(1)) + int(found.group(2) or 0) == total
