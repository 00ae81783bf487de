"""Issue 13 item 7, the console part: the controls page lists API tokens with their last use
and expiry; admins revoke and rotate any of the tenant's, operators their own; the rotated
token is shown once, in the answer."""

from __future__ import annotations

from django.test import Client

from gateway import checkpoints
from gateway.models import ApiToken
from gateway.tokens import token_issue
from tests.console.conftest import person


def row(html: str, token: ApiToken) -> str:
    start = html[html.index(f'data-token="{token.pk}"') :]
    return start[: start.index("</tr>")]


def test_admin_sees_every_token_with_last_use_and_expiry(root, bot):
    token, clear = token_issue(principal=bot.principal)
    Client().get("/api/v1/effects", HTTP_AUTHORIZATION=f"Bearer {clear}")  # a use
    html = root.client.get("/controls").content.decode()
    assert 'id="tokens"' in html
    line = row(html, token)
    assert token.prefix in line and "refund-bot" in line
    assert "never" not in line.split("</td>")[2]  # last used: a time
    assert "live" in line
    assert clear not in html  # the clear value is never shown again


def test_operator_sees_only_its_own_tokens(oscar, bot):
    theirs, _ = token_issue(principal=bot.principal)
    mine, _ = token_issue(principal=oscar.principal)
    html = oscar.client.get("/controls").content.decode()
    assert f'data-token="{mine.pk}"' in html
    assert f'data-token="{theirs.pk}"' not in html
    assert (
        oscar.htmx("post", f"/controls/tokens/{theirs.pk}/revoke", {"reason": "x"}).status_code
        == 404
    )


def test_admin_revokes_with_a_reason_in_place(root, bot):
    token, clear = token_issue(principal=bot.principal)
    path = f"/controls/tokens/{token.pk}/revoke"
    assert root.htmx("post", path, {"reason": ""}).status_code == 400
    response = root.htmx("post", path, {"reason": "leaked in a log"})
    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="tokens"')
    assert "revoked" in row(html, token)
    assert Client().get("/api/v1/effects", HTTP_AUTHORIZATION=f"Bearer {clear}").status_code == 401


def test_rotate_shows_the_new_token_once_and_stops_the_old(root, bot):
    token, clear = token_issue(principal=bot.principal)
    response = root.htmx("post", f"/controls/tokens/{token.pk}/rotate")
    assert response.status_code == 200
    html = response.content.decode()
    new = html.split("data-new-token>")[1].split("<")[0]
    assert new.startswith("egw_")
    assert Client().get("/api/v1/effects", HTTP_AUTHORIZATION=f"Bearer {new}").status_code == 200
    assert Client().get("/api/v1/effects", HTTP_AUTHORIZATION=f"Bearer {clear}").status_code == 401
    assert new not in root.client.get("/controls").content.decode()
    # Without JavaScript the page itself comes back with the token (no redirect, no cookie).
    token2, _ = token_issue(principal=bot.principal)
    plain = root.client.post(f"/controls/tokens/{token2.pk}/rotate")
    assert plain.status_code == 200 and "data-new-token" in plain.content.decode()


def test_the_latest_checkpoint_is_shown(root, settings, tmp_path):
    settings.GATEWAY_CHECKPOINT_DIR = str(tmp_path)
    checkpoints.checkpoint_write(checkpoints.checkpoint_make(root.principal.tenant))
    html = root.client.get("/controls").content.decode()
    assert "Latest signed checkpoint" in html
    assert checkpoints.fingerprint() in html


def test_another_tenants_token_is_404(root, db):
    olga = person("globex", "olga-admin", "admin")
    token, _ = token_issue(principal=olga.principal)
    assert root.htmx("post", f"/controls/tokens/{token.pk}/rotate").status_code == 404
    assert f'data-token="{token.pk}"' not in root.client.get("/controls").content.decode()
