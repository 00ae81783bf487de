"""Login, logout and the refusals around them: every page needs a login linked to a tenant."""

import io

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from tests.console.conftest import PASSWORD


def test_anonymous_page_load_redirects_to_login(db):
    response = Client().get("/approvals")
    assert response.status_code == 302
    assert response["Location"].startswith("/login?next=/approvals")


def test_anonymous_htmx_request_takes_the_tab_to_the_login_page(db):
    response = Client().get(
        "/?since=abc",
        HTTP_HX_REQUEST="true",
        HTTP_HX_CURRENT_URL="http://testserver/?status=UNKNOWN",
    )
    # Back to the page the tab showed, not to the poll's URL.
    assert response["HX-Redirect"] == "/login?next=/%3Fstatus%3DUNKNOWN"
    assert "HX-Request" in response["Vary"]


def test_login_page_is_a_labelled_form(db):
    response = Client().get("/login")
    assert response.status_code == 200
    html = response.content.decode()
    assert '<label for="id_username">Username</label>' in html
    assert '<label for="id_password">Password</label>' in html
    assert "csrfmiddlewaretoken" in html
    assert "<main" in html


def test_name_at_tenant_logs_in_and_lands_on_triage(oscar):
    client = Client()
    response = client.post("/login", {"username": "oscar@acme", "password": PASSWORD})
    assert response.status_code == 302
    assert response["Location"] == "/"
    page = client.get("/")
    assert page.status_code == 200
    assert "tenant <strong>acme</strong>" in page.content.decode()


def test_wrong_password_is_refused_readably(oscar):
    response = Client().post("/login", {"username": "oscar@acme", "password": "nope"})
    assert response.status_code == 200
    assert 'role="alert"' in response.content.decode()


def test_login_without_a_principal_gets_a_readable_refusal(db):
    user = get_user_model().objects.create_user("stray", password=PASSWORD)
    client = Client()
    client.force_login(user)
    response = client.get("/")
    assert response.status_code == 403
    html = response.content.decode()
    assert "not linked to a tenant" in html
    assert "issue_token" in html
    assert client.get("/approvals").status_code == 403


def test_logout_is_a_post_and_ends_the_session(oscar):
    assert oscar.client.get("/logout").status_code == 405
    response = oscar.client.post("/logout")
    assert response.status_code == 302
    assert response["Location"] == "/login"
    assert oscar.client.get("/").status_code == 302


def test_a_login_made_by_issue_token_opens_the_console(db):
    call_command(
        "issue_token",
        tenant="demo",
        principal="oscar",
        role="operator",
        password=PASSWORD,
        stdout=io.StringIO(),
    )
    client = Client()
    assert client.login(username="oscar@demo", password=PASSWORD)
    response = client.get("/")
    assert response.status_code == 200
    assert "tenant <strong>demo</strong>" in response.content.decode()
