"""Every state an agent waits on is announced (issue 15, item 2): approval needed (with the
approval URL), approved, cancelled, expired, compensated; endpoints filtered by principal and
``context.run_id`` hear only their agent's effects; the gateway names itself in User-Agent."""

from __future__ import annotations

import pytest
from django.db import transaction
from standardwebhooks import Webhook

from gateway import services
from gateway.models import Effect
from gateway.webhooks.models import WebhookMessage

pytestmark = pytest.mark.django_db(transaction=True)


def big(refund_body, amount=50_000):
    return {**refund_body, "payload": {**refund_body["payload"], "amount": amount}}


def events_of(receiver, secret, effect_id):
    return [
        event["type"]
        for event in (Webhook(secret).verify(d.body, d.headers) for d in receiver.deliveries)
        if event["data"].get("effect_id") == effect_id
    ]


def test_cancelled_and_expired_are_announced(
    agent, refund_body, sandbox, eager_tasks, receiver, webhook_endpoint
):
    _, secret = webhook_endpoint
    cancelled = agent.submit(big(refund_body), "c-1").json()["effect_id"]
    expiring = agent.submit(big(refund_body, 60_000), "c-2").json()["effect_id"]
    response = agent.client.post(
        f"/api/v1/effects/{cancelled}/cancel", {"reason": "plan changed"}, format="json"
    )
    assert response.status_code == 200, response.json()
    with transaction.atomic():  # as the sweeper's expiry pass runs it
        effect = Effect.objects.select_related("command").get(pk=expiring)
        assert services.effect_expire(effect=effect, actor="sweeper")
    receiver.wait_for(4)
    assert events_of(receiver, secret, cancelled) == [
        "effect.awaiting_approval",
        "effect.cancelled",
    ]
    assert events_of(receiver, secret, expiring) == [
        "effect.awaiting_approval",
        "effect.expired",
    ]
    cancel = next(d.event for d in receiver.deliveries if d.event["type"] == "effect.cancelled")
    assert cancel["data"]["reason"] == "plan changed"
    assert cancel["data"]["from_status"] == "AWAITING_APPROVAL"


def test_compensated_is_announced(
    agent, ticket_body, sandbox, eager_tasks, receiver, webhook_endpoint
):
    _, secret = webhook_endpoint
    response = agent.submit(ticket_body, "t-comp")
    effect_id = response.json()["effect_id"]
    undo = agent.client.post(
        f"/api/v1/effects/{effect_id}/compensate", {"reason": "opened twice"}, format="json"
    )
    assert undo.status_code in (200, 201), undo.json()
    assert Effect.objects.get(pk=effect_id).status == "COMPENSATED"
    receiver.wait_for(3)
    assert events_of(receiver, secret, effect_id) == ["effect.confirmed", "effect.compensated"]
    assert events_of(receiver, secret, undo.json()["effect_id"]) == ["effect.confirmed"]


def test_endpoints_filtered_by_principal_and_run_hear_their_agent_only(
    operator, agent, other_agent, ticket_body, sandbox, eager_tasks, receiver
):
    def endpoint(**filters):
        body = {"url": receiver.url, "event_types": ["effect.confirmed"], **filters}
        response = operator.client.post("/api/v1/webhook-endpoints", body, format="json")
        assert response.status_code == 201, response.json()
        assert {k: response.json()[k] for k in filters} == filters
        return response.json()["id"]

    by_principal = endpoint(principals=["deploy-bot"])
    by_run = endpoint(run_ids=["run-7"])
    everything = endpoint()
    for persona, key, run_id in ((agent, "a", "run-7"), (other_agent, "b", "run-8")):
        body = {**ticket_body, "payload": {**ticket_body["payload"], "title": key}}
        response = persona.submit({**body, "context": {"run_id": run_id}}, key)
        assert response.status_code == 201, response.json()
    receiver.wait_for(4)

    def heard(endpoint_id):
        return sorted(
            m.payload["data"]["context"]["run_id"]
            for m in WebhookMessage.objects.filter(endpoint_id=endpoint_id)
        )

    assert heard(by_principal) == ["run-8"]
    assert heard(by_run) == ["run-7"]
    assert heard(everything) == ["run-7", "run-8"]


def test_the_gateway_names_itself_and_its_version(
    agent, ticket_body, sandbox, eager_tasks, receiver, webhook_endpoint
):
    from importlib.metadata import version

    agent.submit(ticket_body, "ua")
    (delivery,) = receiver.wait_for(1)
    assert delivery.headers["user-agent"].startswith(f"effect-gateway/{version('effect-gateway')} ")


def test_unknown_filters_and_event_types_are_refused(operator):
    response = operator.client.post(
        "/api/v1/webhook-endpoints",
        {"url": "http://127.0.0.1:9/x", "event_types": ["effect.nope"], "run_ids": "run-1"},
        format="json",
    )
    assert response.status_code == 400
    assert set(response.json()["errors"]) == {"event_types.0", "run_ids"}
