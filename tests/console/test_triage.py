"""The triage queue: what needs a human, filters, keyset pages, and the 5 s poll."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from gateway.console import triage
from gateway.models import Effect
from tests.console.conftest import (
    EMAIL,
    REFUND,
    SHIPMENT,
    TICKET,
    open_case,
    set_state,
    submit,
)


def effect_ids(html: str) -> list[str]:
    return re.findall(r'<tr data-effect="([^"]+)"', html)


@pytest.fixture
def queue(bot):
    """One effect of every kind the queue shows, and two it must not show."""
    now = timezone.now()
    agent = bot.principal
    return {
        "unknown": set_state(submit(agent, REFUND), status="UNKNOWN", attempt_count=1),
        "overdue": set_state(
            submit(agent, TICKET),
            status="IN_PROGRESS",
            status_changed_at=now - timedelta(minutes=20),
            next_check_at=now + timedelta(minutes=5),
        ),
        "due_lookup": set_state(
            submit(agent, SHIPMENT),
            status="IN_PROGRESS",
            next_check_at=now - timedelta(seconds=30),
        ),
        "mismatch": set_state(submit(agent, EMAIL), status="CONFIRMED", mismatch=True),
        "escalated": set_state(submit(agent, TICKET), status="NOT_STARTED", escalated=True),
        "comp_failed": set_state(submit(agent, TICKET), status="COMPENSATION_FAILED"),
        # Not for a human:
        "fresh_in_progress": set_state(
            submit(agent, TICKET), status="IN_PROGRESS", next_check_at=now + timedelta(minutes=1)
        ),
        "confirmed": set_state(submit(agent, REFUND), status="CONFIRMED"),
    }


def test_queue_shows_what_needs_a_human_and_nothing_else(oscar, queue):
    response = oscar.client.get("/")
    assert response.status_code == 200
    shown = set(effect_ids(response.content.decode()))
    expected = {"unknown", "overdue", "due_lookup", "mismatch", "escalated", "comp_failed"}
    assert shown == {queue[name].pk for name in expected}
    assert "6 effects need a human" in response.content.decode()


def test_full_page_and_partial_share_the_url(oscar, queue):
    page = oscar.client.get("/")
    fragment = oscar.htmx("get", "/")
    assert "<html" in page.content.decode()
    assert 'id="filters"' in page.content.decode()
    html = fragment.content.decode()
    assert fragment.status_code == 200
    assert "<html" not in html and 'id="filters"' not in html
    assert html.lstrip().startswith('<section id="queue"')
    assert set(effect_ids(html)) == set(effect_ids(page.content.decode()))
    for response in (page, fragment):
        assert "HX-Request" in response["Vary"]
        assert "no-store" in response["Cache-Control"]


def test_row_shows_status_tone_owner_cost_attempts_and_flags(oscar, queue):
    html = oscar.client.get("/").content.decode()
    row = html[html.index(f'data-effect="{queue["unknown"].pk}"') :]
    row = row[: row.index("</tr>")]
    assert 'class="badge tone-danger" data-status="UNKNOWN"' in row
    assert "billing-oncall" in row
    assert "5.00 EUR" in row
    assert '<td class="num" data-label="Attempts">1</td>' in row
    assert "receipt mismatch" not in row and "overdue" not in row
    assert f'href="/effects/{queue["unknown"].pk}"' in row
    overdue = html[html.index(f'data-effect="{queue["overdue"].pk}"') :]
    assert "overdue" in overdue[: overdue.index("</tr>")]


def test_filters_by_status_type_owner_and_age(oscar, queue):
    def shown(query: str) -> set[str]:
        return set(effect_ids(oscar.client.get("/?" + query).content.decode()))

    assert shown("status=UNKNOWN") == {queue["unknown"].pk}
    assert shown("type=email.message.send") == {queue["mismatch"].pk}
    assert shown("owner=fulfillment-oncall") == {queue["due_lookup"].pk}
    assert shown("age=1h") == set()
    Effect.objects.filter(pk=queue["unknown"].pk).update(
        created_at=timezone.now() - timedelta(hours=2)
    )
    assert shown("age=1h") == {queue["unknown"].pk}
    # Unknown values are ignored rather than failing.
    assert len(shown("status=BOGUS&type=nope")) == 6


def test_filter_form_keeps_working_without_javascript(oscar, queue):
    html = oscar.client.get("/?status=UNKNOWN").content.decode()
    assert '<form id="filters" class="filters" method="get" action="/"' in html
    assert '<option value="UNKNOWN" selected>' in html


def test_sort_by_risk_puts_financial_writes_first(oscar, queue):
    ids = effect_ids(oscar.client.get("/?sort=risk").content.decode())
    assert ids[0] == queue["unknown"].pk  # the refund: money
    oldest = effect_ids(oscar.client.get("/").content.decode())
    assert oldest == sorted(oldest)
    newest = effect_ids(oscar.client.get("/?sort=newest").content.decode())
    assert newest == sorted(newest, reverse=True)


@pytest.mark.parametrize("sort", ["oldest", "newest", "risk"])
def test_keyset_pages_cover_the_queue_once(oscar, queue, monkeypatch, sort):
    monkeypatch.setattr(triage, "TRIAGE_PAGE_SIZE", 4)
    seen: list[str] = []
    query = f"sort={sort}"
    for _ in range(5):
        html = oscar.client.get("/?" + query).content.decode()
        seen += effect_ids(html)
        match = re.search(r'href="/\?([^"]*after=[^"]+)"[^>]*>Next page', html)
        if not match:
            break
        query = match.group(1).replace("&amp;", "&")
    assert len(seen) == 6
    assert len(set(seen)) == 6


def test_another_tenants_effects_are_not_in_the_queue(olga, queue):
    html = olga.client.get("/").content.decode()
    assert effect_ids(html) == []
    assert "Nothing needs a human right now" in html


def poll_url(html: str) -> str:
    match = re.search(r'<section id="queue"[^>]*hx-get="([^"]+)"', html)
    assert match, "the queue fragment polls"
    return match.group(1).replace("&amp;", "&")


def test_poll_answers_204_while_nothing_changed(oscar, queue):
    url = poll_url(oscar.client.get("/?status=UNKNOWN").content.decode())
    assert "status=UNKNOWN" in url and "since=" in url
    response = oscar.htmx("get", url)
    assert response.status_code == 204
    assert response["HX-Reswap"] == "none"
    assert response.content == b""


def test_poll_redraws_when_a_row_changes(oscar, queue):
    url = poll_url(oscar.client.get("/").content.decode())
    set_state(queue["unknown"], frozen=True)
    response = oscar.htmx("get", url)
    assert response.status_code == 200
    assert "frozen" in response.content.decode()


def test_poll_redraws_when_an_effect_joins_the_queue(oscar, bot, queue):
    url = poll_url(oscar.client.get("/").content.decode())
    set_state(submit(bot.principal, TICKET), status="UNKNOWN")
    response = oscar.htmx("get", url)
    assert response.status_code == 200
    assert "7 effects need a human" in response.content.decode()


def _fill_queue(principal, bodies, per_kind: int) -> None:
    """``per_kind`` effects of each body in each way the queue shows (UNKNOWN, a receipt
    that disagrees, escalated, an open case on a confirmed one): a group per (type, cause)."""
    for body in bodies:
        for _ in range(per_kind):
            set_state(submit(principal, body), status="UNKNOWN")
            set_state(submit(principal, body), status="CONFIRMED", mismatch=True)
            set_state(submit(principal, body), status="NOT_STARTED", escalated=True)
            open_case(set_state(submit(principal, body), status="CONFIRMED"), reason="mismatch")


def test_triage_queries_do_not_grow_with_its_rows_or_groups(oscar, bot):
    """Twice the rows and twice the groups (each with its bulk forms), the same statements:
    a query per row or per group (a property, a tag, a holder look-up) fails this."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def statements() -> tuple[int, int, int]:
        with CaptureQueriesContext(connection) as captured:
            html = oscar.client.get("/").content.decode()
        return len(captured), len(effect_ids(html)), html.count('<li class="group')

    _fill_queue(bot.principal, [REFUND, TICKET], per_kind=3)
    few, rows, groups = statements()
    assert (rows, groups) == (24, 8)
    _fill_queue(bot.principal, [EMAIL, SHIPMENT], per_kind=3)
    many, rows, groups = statements()
    assert (rows, groups) == (48, 16)
    assert many == few


def test_triage_list_of_50_rows_runs_a_fixed_number_of_queries(
    oscar, bot, django_assert_max_num_queries
):
    for _ in range(50):
        set_state(submit(bot.principal, REFUND), status="UNKNOWN")
    # session, user, principal + tenant, the effects with an open case, count + latest
    # change, the groups by cause, the approvals waiting too long, the page's ids, its rows,
    # who holds them, the recent bulk jobs, the stopped sagas, the nav's two badges (approvals,
    # cases; the triage badge reuses the page's count), provider health (sends, lookups,
    # UNKNOWN per provider), the saved views of the page: the same for 5 rows as for 50.
    with django_assert_max_num_queries(18):
        response = oscar.client.get("/")
    assert len(effect_ids(response.content.decode())) == 50
    with django_assert_max_num_queries(15):
        fragment = oscar.htmx("get", "/")
    assert len(effect_ids(fragment.content.decode())) == 50
