"""Issue 13 item 7: tokens with a lifecycle (expiry, revoke, rotate, last use), a frozen
principal's token reads nothing, and /metrics for the scraper only."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from gateway.models import ApiToken, EffectEvent
from tests.conftest import Persona, issue_token

pytestmark = pytest.mark.django_db


def client_for(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def record(token: str) -> ApiToken:
    return ApiToken.objects.get(prefix=token[:12])


def test_agents_tokens_expire_by_default(agent, settings):
    expires = record(agent.token).expires_at
    assert expires is not None
    expected = timezone.now() + timedelta(seconds=settings.GATEWAY_AGENT_TOKEN_TTL)
    assert abs((expires - expected).total_seconds()) < 60
    short = issue_token_with("acme", "short-bot", "agent", "--token-expires-in", "60")
    assert (record(short).expires_at - timezone.now()).total_seconds() <= 60


@pytest.mark.parametrize("role", ["operator", "approver", "admin"])
def test_peoples_tokens_expire_in_90_days_by_default(role):
    token = issue_token_with("acme", f"{role}-person", role)
    expected = timezone.now() + timedelta(days=90)
    assert abs((record(token).expires_at - expected).total_seconds()) < 60


def test_peoples_token_expiry_follows_the_setting_and_the_flag(settings):
    settings.GATEWAY_PERSON_TOKEN_TTL = 3600
    token = issue_token_with("acme", "olga", "operator")
    assert 3500 < (record(token).expires_at - timezone.now()).total_seconds() <= 3600
    chosen = issue_token_with("acme", "olga", "operator", "--token-expires-in", "60")
    assert (record(chosen).expires_at - timezone.now()).total_seconds() <= 60
    forever = issue_token_with("acme", "olga", "operator", "--token-expires-in", "0")
    assert record(forever).expires_at is None


def issue_token_with(tenant: str, name: str, role: str, *args: str) -> str:
    out = io.StringIO()
    call_command(
        "issue_token", "--tenant", tenant, "--principal", name, "--role", role, *args, stdout=out
    )
    return out.getvalue().strip().splitlines()[-1]


def test_an_expired_token_is_refused(agent):
    assert agent.client.get("/api/v1/effects").status_code == 200
    ApiToken.objects.filter(prefix=agent.token[:12]).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    response = agent.client.get("/api/v1/effects")
    assert response.status_code == 401
    assert "expired" in response.json()["detail"]


def test_last_use_is_recorded_and_listed(agent):
    assert record(agent.token).last_used_at is None
    listed = agent.client.get("/api/v1/tokens").json()["results"]
    assert [t["prefix"] for t in listed] == [agent.token[:12]]
    assert listed[0]["last_used_at"] is not None
    assert "token" not in listed[0] and "token_hash" not in listed[0]


def test_revoke_from_the_api_stops_the_token_at_once(agent):
    token_id = record(agent.token).pk
    revoked = agent.client.post(
        f"/api/v1/tokens/{token_id}/revoke", {"reason": "leaked"}, format="json"
    )
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]
    assert agent.client.get("/api/v1/effects").status_code == 401
    assert EffectEvent.objects.filter(kind="token_revoked", reason="leaked").count() == 1


def test_a_revoked_token_cannot_be_rotated_or_revoked_again_and_says_so(agent, admin):
    token_id = record(agent.token).pk
    first = admin.client.post(f"/api/v1/tokens/{token_id}/revoke", {}, format="json")
    assert first.status_code == 200
    for action in ("revoke", "rotate"):
        again = admin.client.post(f"/api/v1/tokens/{token_id}/{action}", {}, format="json")
        assert again.status_code == 409
        problem = again.json()
        assert problem["type"].endswith("token-revoked"), problem
        assert "effect" not in problem["title"].lower() and "issue a new one" in problem["detail"]
    assert ApiToken.objects.filter(principal=agent.principal, revoked_at__isnull=True).count() == 0


def test_rotate_from_the_api_returns_a_new_token_once_and_stops_the_old(agent):
    token_id = record(agent.token).pk
    rotated = agent.client.post(
        f"/api/v1/tokens/{token_id}/rotate", {"expires_in": 3600}, format="json"
    )
    assert rotated.status_code == 201
    new = rotated.json()["token"]
    assert new.startswith("egw_") and rotated.json()["rotated_from"] == agent.token[:12]
    assert agent.client.get("/api/v1/effects").status_code == 401
    assert client_for(new).get("/api/v1/effects").status_code == 200
    assert "token" not in client_for(new).get("/api/v1/tokens").json()["results"][0]


def test_only_admins_manage_other_principals_tokens(agent, other_agent, admin, rival_operator):
    other_id = record(other_agent.token).pk
    assert agent.client.post(f"/api/v1/tokens/{other_id}/revoke").status_code == 404
    assert rival_operator.client.post(f"/api/v1/tokens/{other_id}/revoke").status_code == 404
    listed = {t["principal"] for t in admin.client.get("/api/v1/tokens").json()["results"]}
    assert {"refund-bot", "deploy-bot", "root"} <= listed
    assert admin.client.post(f"/api/v1/tokens/{other_id}/revoke").status_code == 200
    assert other_agent.client.get("/api/v1/effects").status_code == 401


def test_revoke_and_rotate_from_the_cli(agent):
    out = io.StringIO()
    call_command("rotate_token", agent.token[:12], "--tenant", "acme", stdout=out)
    new = out.getvalue().strip().splitlines()[-1]
    assert agent.client.get("/api/v1/effects").status_code == 401
    assert client_for(new).get("/api/v1/effects").status_code == 200
    call_command("revoke_token", new[:12], "--reason", "done", stdout=io.StringIO())
    assert client_for(new).get("/api/v1/effects").status_code == 401


def test_a_frozen_principals_token_reads_nothing(agent, operator, refund_body):
    effect_id = agent.submit(refund_body, "k1").json()["effect_id"]
    operator.client.post("/api/v1/principals/refund-bot/freeze")
    for path in ("/api/v1/effects", f"/api/v1/effects/{effect_id}", "/api/v1/effect-types"):
        response = agent.client.get(path)
        assert response.status_code == 403, path
        assert "frozen" in response.json()["detail"]
    operator.client.post("/api/v1/principals/refund-bot/unfreeze")
    assert agent.client.get(f"/api/v1/effects/{effect_id}").status_code == 200


def test_metrics_need_the_scrape_token_and_refuse_tenant_tokens(agent, admin, settings):
    settings.GATEWAY_METRICS_TOKEN = "scrape-secret"
    assert Client().get("/metrics").status_code == 401
    assert admin.client.get("/metrics").status_code == 401  # a tenant's token opens nothing
    scraped = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-secret")
    assert scraped.status_code == 200
    assert b"gateway_effects" in scraped.content
    assert b"acme" not in scraped.content  # no tenant names in the exposition


def test_without_a_token_metrics_are_for_loopback_only(settings):
    settings.GATEWAY_METRICS_TOKEN = ""
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics").status_code == 200
    assert Client(REMOTE_ADDR="10.1.2.3").get("/metrics").status_code == 403
    settings.PRODUCTION = True
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics").status_code == 403


def test_persona_helper_still_issues_working_tokens(db):
    persona = Persona("acme", "plain-bot", "agent")
    assert persona.client.get("/api/v1/effects").status_code == 200
    assert issue_token("acme", "plain-bot", "agent").startswith("egw_")
