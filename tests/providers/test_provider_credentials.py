"""A provider's credential at dispatch: the attempt records which adapter and which credential
(its fingerprint) sent the effect, on the fast and the general path; the API and the console
show that fingerprint; the secret itself is in no log record and no answer."""

from __future__ import annotations

import logging

import pytest

from gateway import services
from gateway.models import Attempt, Effect
from gateway.providers import registry
from gateway.providers.config import fingerprint
from tests.console.conftest import person

pytestmark = pytest.mark.django_db

SECRET = "tickets-token-0123456789-TOPSECRET"


@pytest.fixture
def tickets_with_credential(settings, sandbox, monkeypatch):
    """The tickets provider on the sandbox through a GATEWAY_PROVIDERS entry with a bearer
    credential from the environment."""
    monkeypatch.setenv("TEST_TICKETS_TOKEN", SECRET)
    settings.GATEWAY_PROVIDERS = {
        "tickets": {
            "adapter": "http",
            "base_url": settings.GATEWAY_PROVIDER_URLS["tickets"],
            "credential": {"env": "TEST_TICKETS_TOKEN"},
        }
    }
    registry.forget_adapters()
    yield
    registry.forget_adapters()


def sent(agent, body: dict, key: str) -> str:
    """Submit ``body`` and dispatch it here (the worker's service); its effect id."""
    response = agent.submit(body, key)
    assert response.status_code == 201, response.content
    effect_id = response.json()["effect_id"]
    services.effect_dispatch(effect_id=effect_id, worker="test")
    return str(effect_id)


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast", "general"])
def test_the_attempt_records_the_adapter_and_the_fingerprint_never_the_secret(
    settings, tickets_with_credential, agent, ticket_body, caplog, fast_path, monkeypatch
):
    settings.GATEWAY_FAST_PATH = fast_path
    if fast_path:  # the fast claim's attempt, marked after its statement: no general fallback

        def general(**kwargs):
            raise AssertionError("the fast path fell back to the general one")

        monkeypatch.setattr(services, "effect_dispatch_general", general)
    caplog.set_level(logging.DEBUG)
    effect_id = sent(agent, ticket_body, f"cred-{fast_path}")
    assert Effect.objects.get(pk=effect_id).status == "CONFIRMED"
    attempt = Attempt.objects.get(effect_id=effect_id)
    assert (attempt.adapter, attempt.credential_fingerprint) == ("http", fingerprint(SECRET))
    assert caplog.records, "the dispatch logged nothing: the check below would prove nothing"
    for record in caplog.records:
        assert SECRET not in record.getMessage()
        assert SECRET not in repr(record.__dict__)


def test_the_default_sender_leaves_the_columns_empty(settings, sandbox, agent, ticket_body):
    settings.GATEWAY_PROVIDERS = {}
    registry.forget_adapters()
    effect_id = sent(agent, ticket_body, "no-cred")
    attempt = Attempt.objects.get(effect_id=effect_id)
    assert attempt.state == "finished"
    assert (attempt.adapter, attempt.credential_fingerprint) == (None, None)


def test_the_api_and_the_console_show_the_fingerprint_not_the_secret(
    tickets_with_credential, agent, ticket_body
):
    effect_id = sent(agent, ticket_body, "cred-shown")
    attempts = agent.client.get(f"/api/v1/effects/{effect_id}/attempts")
    assert attempts.status_code == 200
    [shown] = attempts.json()
    assert shown["adapter"] == "http" and shown["credential_fingerprint"] == fingerprint(SECRET)
    assert shown["number"] == 1 and shown["outcome"] == "confirmed"
    for path in ("", "/attempts", "/events"):
        answer = agent.client.get(f"/api/v1/effects/{effect_id}{path}")
        assert answer.status_code == 200 and SECRET not in answer.content.decode()
    oscar = person("acme", "oscar", "operator")
    page = oscar.client.get(f"/effects/{effect_id}").content.decode()
    assert fingerprint(SECRET) in page and SECRET not in page


def test_an_adapter_that_cannot_be_built_claims_nothing_on_the_general_path(
    settings, sandbox, agent, ticket_body
):
    """The credential is read when the adapter is built, before the attempt is written: a
    missing one leaves the effect unclaimed (nothing sent, nothing to recover)."""
    settings.GATEWAY_PROVIDERS = {
        "tickets": {
            "adapter": "http",
            "base_url": settings.GATEWAY_PROVIDER_URLS["tickets"],
            "credential": {"env": "NOT_SET_ANYWHERE_3"},
        }
    }
    registry.forget_adapters()
    effect_id = agent.submit(ticket_body, "no-key").json()["effect_id"]
    with pytest.raises(Exception, match="NOT_SET_ANYWHERE_3 is not set"):
        services.effect_claim(effect_id=effect_id, worker="test")
    effect = Effect.objects.get(pk=effect_id)
    assert effect.status == "PREPARED" and effect.fence == 0
    assert not Attempt.objects.filter(effect_id=effect_id).exists()
    assert sandbox.operations() == []


def test_a_drainers_batch_marks_its_attempts_with_one_update(
    tickets_with_credential, agent, ticket_body
):
    """The drainer's batch claim (gateway.dispatcher) leaves the columns NULL in its
    statement; one UPDATE after each batch marks its attempts of the configured type."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from gateway import dispatcher

    ids = []
    for index in range(3):
        body = {**ticket_body, "payload": {**ticket_body["payload"], "title": f"t{index}"}}
        ids.append(agent.submit(body, f"batch-{index}").json()["effect_id"])
    with CaptureQueriesContext(connection) as statements:
        assert dispatcher.drain(flag=None, worker="test") == 3
    senders = set(
        Attempt.objects.filter(effect_id__in=ids).values_list("adapter", "credential_fingerprint")
    )
    assert senders == {("http", fingerprint(SECRET))}
    sql = [q["sql"] for q in statements.captured_queries]
    marks = [q for q in sql if q.startswith('UPDATE "gateway_attempt" SET "adapter"')]
    claims = [q for q in sql if "WITH due AS" in q]
    # At most one per batch that claimed something (the last claim finds nothing left).
    assert marks, [q[:80] for q in sql]  # the batch path marked its attempts
    assert len(marks) <= len(claims) - 1, [q[:80] for q in sql]
