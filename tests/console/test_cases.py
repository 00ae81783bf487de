"""The human queue (``/cases``): unresolved reconciliation cases of the tenant, oldest first,
with filters, taking and resolving a case in place, orphan receipts, the nav's count."""

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from gateway.models import EffectEvent
from reconciliation import views
from tests.console.conftest import (
    REFUND,
    SHIPMENT,
    TICKET,
    add_orphan,
    open_case,
    set_state,
    submit,
)

pytest.importorskip("reconciliation.services")

from reconciliation.models import Case


def case_ids(html: str) -> list[str]:
    return re.findall(r'data-case="([^"]+)"', html)


@pytest.fixture
def cases(bot):
    """Three unresolved cases of acme (oldest first) and a resolved one."""
    now = timezone.now()
    agent = bot.principal
    refund = set_state(submit(agent, REFUND), status="UNKNOWN", escalated=True, check_count=8)
    shipment = set_state(submit(agent, SHIPMENT), status="UNKNOWN", mismatch=True)
    ticket = set_state(submit(agent, TICKET), status="NOT_STARTED", escalated=True)
    done = set_state(submit(agent, TICKET), status="CONFIRMED")
    found = {
        "refund": open_case(refund, "lookup_budget_exhausted", "8 lookups, still unknown"),
        "shipment": open_case(
            shipment, "mismatch", "the provider recorded something else", digest="sha256:00"
        ),
        "ticket": open_case(ticket, "retry_budget_exhausted", "5 attempts, none arrived"),
        "resolved": open_case(done, "escalated", "settled since"),
    }
    for age, name in enumerate(["refund", "shipment", "ticket", "resolved"]):
        Case.objects.filter(pk=found[name].pk).update(opened_at=now - timedelta(minutes=age + 1))
    Case.objects.filter(pk=found["resolved"].pk).update(
        state="resolved", resolved_at=now, resolved_actor="reconciler", resolution="confirmed"
    )
    return {name: Case.objects.get(pk=case.pk) for name, case in found.items()}


def action(person, case, name, data=None, htmx=True):
    path = f"/cases/{case.pk}/{name}"
    if htmx:
        return person.htmx("post", path, data)
    return person.client.post(path, data or {})


def test_queue_lists_unresolved_cases_oldest_first(oscar, cases):
    response = oscar.client.get("/cases")
    assert response.status_code == 200
    html = response.content.decode()
    assert case_ids(html) == [cases[n].pk for n in ("ticket", "shipment", "refund")]
    assert "3 cases waiting for a human" in html
    card = html[html.index(f'id="case-{cases["shipment"].pk}"') :]
    card = card[: card.index("</article>")]
    assert "Mismatch" in card and "the provider recorded something else" in card
    assert "fulfillment-oncall" in card
    assert f'href="/effects/{cases["shipment"].effect_id}"' in card
    assert "digest" in card and "sha256:00" in card  # the evidence
    assert "2 min" in card  # its age
    assert 'aria-current="page">Cases' in html


def test_full_page_and_partial_share_the_url(oscar, cases):
    page = oscar.client.get("/cases?owner=fulfillment-oncall")
    fragment = oscar.htmx("get", "/cases?owner=fulfillment-oncall")
    assert "<html" in page.content.decode() and 'id="orphans"' in page.content.decode()
    html = fragment.content.decode()
    assert "<html" not in html and 'id="orphans"' not in html
    assert html.lstrip().startswith('<section id="cases"')
    assert case_ids(html) == case_ids(page.content.decode()) == [cases["shipment"].pk]
    for response in (page, fragment):
        assert "HX-Request" in response["Vary"]
        assert "no-store" in response["Cache-Control"]


def test_filters_by_owner_reason_and_state(oscar, cases):
    def shown(query: str) -> list[str]:
        return case_ids(oscar.client.get("/cases?" + query).content.decode())

    assert shown("owner=billing-oncall") == [cases["refund"].pk]
    assert shown("reason=retry_budget_exhausted") == [cases["ticket"].pk]
    assert shown("state=resolved") == [cases["resolved"].pk]
    assert shown("state=acknowledged") == []
    # Unknown values are ignored rather than failing.
    assert len(shown("owner=nobody&reason=nope&state=gone")) == 3
    html = oscar.client.get("/cases?reason=mismatch").content.decode()
    assert '<option value="mismatch" selected>' in html


def test_keyset_pages_cover_the_queue_once(oscar, cases, monkeypatch):
    monkeypatch.setattr(views, "CASES_PAGE_SIZE", 2)
    first = oscar.client.get("/cases").content.decode()
    assert case_ids(first) == [cases["ticket"].pk, cases["shipment"].pk]
    match = re.search(r'href="/cases\?([^"]*after=[^"]+)"[^>]*>Next page', first)
    second = oscar.client.get("/cases?" + match.group(1).replace("&amp;", "&")).content.decode()
    assert case_ids(second) == [cases["refund"].pk]
    assert "Next page" not in second


def test_take_a_case_in_place(oscar, cases):
    case = cases["refund"]
    response = action(oscar, case, "acknowledge")
    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith(f'<article id="case-{case.pk}"')
    assert "Taken by <strong>oscar</strong>" in html
    assert "You took case" in html
    assert 'id="cases-badge"' in html and 'hx-swap-oob="true"' in html
    assert "Take the case" not in html
    case.refresh_from_db()
    assert case.state == "acknowledged" and case.acknowledged_by_id == oscar.principal.pk
    assert EffectEvent.objects.filter(effect_id=case.effect_id, kind="case_acknowledged").exists()
    # Taking it twice is a readable conflict in the card's error slot.
    again = action(oscar, case, "acknowledge")
    assert again.status_code == 409
    assert again["HX-Retarget"] == f"#case-{case.pk}-error"


def test_without_javascript_an_action_redirects_back_to_the_filtered_queue(oscar, cases):
    case = cases["refund"]
    response = action(
        oscar, case, "acknowledge", {"filters": "owner=billing-oncall&evil=1"}, htmx=False
    )
    assert response.status_code == 302
    assert response["Location"] == "/cases?owner=billing-oncall"
    page = oscar.client.get(response["Location"]).content.decode()
    assert "You took case" in page


def test_resolve_with_evidence_closes_the_case(oscar, cases):
    case = cases["refund"]
    refused = action(oscar, case, "resolve", {"outcome": "confirmed", "evidence": ""})
    assert refused.status_code == 400
    assert refused["HX-Retarget"] == f"#case-{case.pk}-error"
    assert "evidence" in refused.content.decode()
    case.refresh_from_db()
    assert case.state == "open"

    response = action(
        oscar, case, "resolve", {"outcome": "confirmed", "evidence": "re_1 in the dashboard"}
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert "Resolved by oscar" in html and "re_1 in the dashboard" in html
    case.refresh_from_db()
    assert case.state == "resolved"
    case.effect.refresh_from_db()
    assert case.effect.status == "CONFIRMED"
    # The badge swapped out of band counts what is left.
    assert re.search(r'id="cases-badge" class="count" hx-swap-oob="true">2<', html)


def test_a_mismatch_is_not_resolvable_from_the_queue_once_confirmed(oscar, cases):
    # Resolve applies to uncertain effects only: the button follows the effect's status.
    set_state(cases["shipment"].effect, status="CONFIRMED")
    html = oscar.client.get("/cases").content.decode()
    card = html[html.index(f'id="case-{cases["shipment"].pk}"') :]
    card = card[: card.index("</article>")]
    assert "Take the case" in card and "Resolve with evidence" not in card


@pytest.mark.parametrize("who", ["alice", "bot"])
def test_approvers_and_agents_read_but_cannot_act(request, who, cases):
    person = request.getfixturevalue(who)
    html = person.client.get("/cases").content.decode()
    assert len(case_ids(html)) == 3
    assert "Take the case" not in html and "Resolve with evidence" not in html
    case = cases["refund"]
    assert action(person, case, "acknowledge").status_code == 403
    response = action(person, case, "resolve", {"outcome": "confirmed", "evidence": "x"})
    assert response.status_code == 403
    case.refresh_from_db()
    assert case.state == "open"


def test_another_tenants_case_is_a_404(olga, cases):
    assert case_ids(olga.client.get("/cases").content.decode()) == []
    case = cases["refund"]
    assert action(olga, case, "acknowledge").status_code == 404
    page = action(olga, case, "acknowledge", htmx=False)
    assert page.status_code == 404 and "No case" in page.content.decode()
    case.refresh_from_db()
    assert case.state == "open"


def test_unknown_action_and_wrong_method(oscar, cases):
    case = cases["refund"]
    assert action(oscar, case, "explode").status_code == 404
    assert oscar.client.get(f"/cases/{case.pk}/acknowledge").status_code == 405


def test_csrf_is_required(oscar, cases):
    client = Client(enforce_csrf_checks=True)
    client.force_login(oscar.principal.user)
    case = cases["refund"]
    assert client.post(f"/cases/{case.pk}/acknowledge").status_code == 403
    case.refresh_from_db()
    assert case.state == "open"


def test_orphan_receipts_of_the_tenant_are_listed_below(oscar, alice, olga, cases):
    tenant = oscar.principal.tenant
    add_orphan(tenant, "op_orphan_1")
    add_orphan(tenant, "op_orphan_done", state="resolved")
    add_orphan(olga.principal.tenant, "op_globex")
    add_orphan(None, "op_nobody")
    html = oscar.client.get("/cases").content.decode()
    orphans = html[html.index('id="orphans"') :]
    assert "op_orphan_1" in orphans and "re_orphan" in orphans
    assert "op_orphan_done" not in orphans
    assert "op_globex" not in orphans and "op_nobody" not in orphans
    # Results may hold what a payload holds: shown to the roles that see payloads.
    hidden = alice.client.get("/cases").content.decode()
    assert "op_orphan_1" in hidden and "re_orphan" not in hidden


def test_nav_links_the_queue_with_its_count(oscar, cases):
    html = oscar.client.get("/").content.decode()
    assert re.search(r'href="/cases"[^>]*>Cases <span id="cases-badge" class="count">3<', html)


def test_poll_answers_204_until_a_case_changes(oscar, cases):
    html = oscar.client.get("/cases").content.decode()
    url = re.search(r'<section id="cases"[^>]*hx-get="([^"]+)"', html).group(1)
    url = url.replace("&amp;", "&")
    unchanged = oscar.htmx("get", url)
    assert unchanged.status_code == 204 and unchanged["HX-Reswap"] == "none"
    Case.objects.filter(pk=cases["refund"].pk).update(
        state="acknowledged", acknowledged_by=oscar.principal, acknowledged_at=timezone.now()
    )
    changed = oscar.htmx("get", url)
    assert changed.status_code == 200
    assert "Taken by <strong>oscar</strong>" in changed.content.decode()


def test_queue_of_50_cases_runs_a_fixed_number_of_queries(
    oscar, bot, django_assert_max_num_queries
):
    for _ in range(50):
        open_case(set_state(submit(bot.principal, REFUND), status="UNKNOWN", escalated=True))
    # session, user, principal + tenant, count, the page (cases with effects and commands),
    # orphans and their count, the nav's two badges: the same for 5 cases as for 50.
    with django_assert_max_num_queries(9):
        response = oscar.client.get("/cases")
    assert len(case_ids(response.content.decode())) == 50
    with django_assert_max_num_queries(5):
        fragment = oscar.htmx("get", "/cases")
    assert len(case_ids(fragment.content.decode())) == 50
