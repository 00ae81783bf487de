"""The per-process token cache: a known token costs no query; a revocation reaches a process
within the TTL; a freeze made in this process is seen at once."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from gateway import trust
from gateway.models import ApiToken
from tests.conftest import TICKET


@pytest.fixture
def cache_on(settings):
    settings.GATEWAY_TOKEN_CACHE_TTL = 5
    trust.clear()
    yield
    trust.clear()


def token_queries(captured) -> int:
    return sum("gateway_apitoken" in query["sql"] for query in captured.captured_queries)


def test_a_known_token_costs_no_query(agent, cache_on):
    assert agent.client.get("/api/v1/effects").status_code == 200
    with CaptureQueriesContext(connection) as captured:
        assert agent.client.get("/api/v1/effects").status_code == 200
    assert token_queries(captured) == 0


def test_without_the_cache_every_request_reads_the_token(agent):
    agent.client.get("/api/v1/effects")
    with CaptureQueriesContext(connection) as captured:
        agent.client.get("/api/v1/effects")
    assert token_queries(captured) == 1


def test_a_revoked_token_is_refused_once_the_ttl_has_passed(agent, cache_on, monkeypatch):
    assert agent.client.get("/api/v1/effects").status_code == 200
    ApiToken.objects.filter(principal=agent.principal).update(revoked_at=timezone.now())
    # Within the TTL this process still trusts what it read (the documented window).
    assert agent.client.get("/api/v1/effects").status_code == 200
    later = trust.time.monotonic() + 6
    monkeypatch.setattr(trust.time, "monotonic", lambda: later)
    refused = agent.client.get("/api/v1/effects")
    assert refused.status_code == 401


def test_a_freeze_in_this_process_is_seen_at_once(agent, operator, cache_on):
    assert agent.submit(TICKET, "t1").status_code == 201
    operator.client.post("/api/v1/principals/refund-bot/freeze")
    assert agent.submit(TICKET, "t2").status_code == 403
    operator.client.post("/api/v1/principals/refund-bot/unfreeze")
    assert agent.submit(TICKET, "t3").status_code == 201


def test_a_grant_revoked_in_this_process_is_seen_at_once(agent, operator, cache_on):
    from gateway.models import Capability

    assert agent.submit(TICKET, "t1").status_code == 201  # the agent's grants are cached
    grant = Capability.objects.get(principal=agent.principal)
    url = f"/api/v1/capabilities/{grant.pk}/revoke"
    revoked = operator.client.post(url, {"reason": "x"}, format="json")
    assert revoked.status_code == 200, revoked.content
    assert agent.submit(TICKET, "t2").status_code == 403
