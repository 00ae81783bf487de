"""Saved views of the triage, search and audit filters: saved with a name (the page's own
parser keeps the filters, never the page cursor), listed, applied as a link, updated and
deleted; one's own, or shared with the tenant and changed only by its owner or an admin;
another tenant's views do not exist."""

from __future__ import annotations

from html import unescape
from urllib.parse import parse_qs, urlsplit

import pytest

from gateway.models import SavedView
from tests.console.conftest import REFUND, person, set_state, submit


def save(who, name: str, query: str, *, page: str = "triage", shared: bool = False):
    data = {"page": page, "name": name, "query": query}
    if shared:
        data["shared"] = "on"
    return who.client.post("/saved-views", data)


@pytest.fixture
def rita(db):
    """Another operator of acme."""
    return person("acme", "rita", "operator")


def test_saving_keeps_the_filters_the_page_understands_and_applies_them(oscar, bot):
    unknown = set_state(submit(bot.principal, REFUND), status="UNKNOWN")
    response = save(
        oscar,
        "  refunds   unknown ",
        "status=UNKNOWN&type=billing.refund.create&after=eff_x&bogus=1",
    )
    assert response.status_code == 302
    view = SavedView.objects.get(owner=oscar.principal)
    assert view.name == "refunds unknown"
    assert parse_qs(view.query) == {"status": ["UNKNOWN"], "type": ["billing.refund.create"]}
    # The answer is the page with the view applied.
    assert response["Location"] == f"/?{view.query}"
    html = oscar.client.get("/", parse_qs(view.query)).content.decode()
    assert "refunds unknown" in html and 'aria-current="true"' in html
    assert unknown.pk in html


def test_saving_a_name_again_replaces_its_filters(oscar):
    save(oscar, "mine", "status=UNKNOWN")
    save(oscar, "mine", "status=IN_PROGRESS")
    assert list(SavedView.objects.values_list("name", "query")) == [("mine", "status=IN_PROGRESS")]


def test_own_views_are_private_and_shared_ones_are_listed_for_the_tenant(oscar, rita, olga):
    save(oscar, "private one", "status=UNKNOWN")
    save(oscar, "team view", "cause=mismatch", shared=True)
    html = rita.client.get("/").content.decode()
    assert "team view" in html and "shared by oscar" in html
    assert "private one" not in html
    # Another tenant sees neither.
    html = olga.client.get("/").content.decode()
    assert "team view" not in html and "private one" not in html


def test_a_shared_view_is_changed_only_by_its_owner_or_an_admin(oscar, rita, root, olga):
    save(oscar, "team view", "cause=mismatch", shared=True)
    view = SavedView.objects.get()
    refused = rita.client.post(f"/saved-views/{view.pk}/delete", {"page": "triage"})
    assert refused.status_code == 302
    assert SavedView.objects.filter(pk=view.pk).exists()
    rita.client.post(
        f"/saved-views/{view.pk}/update", {"page": "triage", "query": "status=UNKNOWN"}
    )
    assert SavedView.objects.get(pk=view.pk).query == "cause=mismatch"
    # No Update or Delete button for her either.
    html = rita.client.get("/").content.decode()
    assert f"/saved-views/{view.pk}/delete" not in html
    # Another tenant's admin-free operator: the view does not exist.
    assert (
        olga.htmx("post", f"/saved-views/{view.pk}/delete", {"page": "triage"}).status_code == 404
    )
    # The owner updates it; an admin of the tenant deletes it.
    oscar.client.post(
        f"/saved-views/{view.pk}/update", {"page": "triage", "query": "status=UNKNOWN"}
    )
    assert SavedView.objects.get(pk=view.pk).query == "status=UNKNOWN"
    assert f"/saved-views/{view.pk}/delete" in root.client.get("/").content.decode()
    root.client.post(f"/saved-views/{view.pk}/delete", {"page": "triage"})
    assert not SavedView.objects.filter(pk=view.pk).exists()


def test_an_admin_cannot_touch_someone_elses_private_view(oscar, root):
    save(oscar, "private one", "status=UNKNOWN")
    view = SavedView.objects.get()
    assert (
        root.htmx("post", f"/saved-views/{view.pk}/delete", {"page": "triage"}).status_code == 404
    )
    assert SavedView.objects.filter(pk=view.pk).exists()


def test_refusals_say_why(oscar, rita):
    save(oscar, "team view", "cause=mismatch", shared=True)
    view = SavedView.objects.get()
    response = rita.htmx("post", f"/saved-views/{view.pk}/delete", {"page": "triage"})
    assert response.status_code == 403
    assert "Only its owner or an admin" in response.content.decode()
    response = oscar.htmx("post", "/saved-views", {"page": "triage", "name": " ", "query": ""})
    assert response.status_code == 400


def test_search_and_audit_views(oscar):
    save(oscar, "that key", "q=order-77&extra=1", page="search")
    save(oscar, "oscar's actions", "actor=oscar&action=frozen&after=99", page="audit")
    search = SavedView.objects.get(page="search")
    assert search.query == "q=order-77"
    audit = SavedView.objects.get(page="audit")
    assert parse_qs(audit.query) == {"actor": ["oscar"], "action": ["frozen"]}
    oscar.client.get("/audit")  # the flash messages of the saves are shown (and gone)
    html = oscar.client.get("/search", {"q": "nothing-here"}).content.decode()
    assert "that key" in html and "oscar&#x27;s actions" not in html
    html = oscar.client.get("/audit").content.decode()
    assert "oscar&#x27;s actions" in html
    link = next(
        part.split('"')[1]
        for part in html.split("<a href=")
        if part.split('"')[1].startswith("/audit?")
    )
    assert parse_qs(urlsplit(unescape(link)).query) == parse_qs(audit.query)


def test_the_panel_offers_the_pages_exports_with_its_filters(oscar):
    html = oscar.client.get("/", {"status": "UNKNOWN", "after": "eff_1"}).content.decode()
    assert 'href="/export/triage.csv?status=UNKNOWN"' in html
    assert 'href="/export/triage-groups.jsonl?status=UNKNOWN"' in html
    html = oscar.client.get("/cases", {"reason": "escalated"}).content.decode()
    assert 'href="/export/cases.csv?reason=escalated"' in html
