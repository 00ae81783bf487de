"""Outgoing webhooks: the outbox row commits with the status change, delivery is signed per
Standard Webhooks (checked with the reference library), retried with the same id, and a 410
switches the endpoint off. The receiver is a real HTTP server on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import transaction
from django.utils import timezone
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from gateway import services
from gateway.models import Effect
from gateway.webhooks.models import WebhookEndpoint, WebhookMessage
from gateway.webhooks.services import webhook_sweep

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.django_db(transaction=True)


def make_due() -> None:
    """Let the backoff pass without waiting for it."""
    WebhookMessage.objects.filter(state="pending").update(
        next_attempt_at=timezone.now() - timedelta(seconds=1)
    )


def confirmed_ticket(agent, ticket_body, key="t1") -> str:
    response = agent.submit(ticket_body, key)
    assert response.status_code == 201, response.json()
    effect_id = response.json()["effect_id"]
    assert Effect.objects.get(pk=effect_id).status == "CONFIRMED"
    return effect_id


def test_endpoints_are_managed_by_operators_only(operator, agent, receiver):
    created = operator.client.post(
        "/api/v1/webhook-endpoints",
        {"url": receiver.url, "event_types": ["effect.confirmed"], "description": "ops"},
        format="json",
    )
    assert created.status_code == 201
    body = created.json()
    assert body["id"].startswith("whe_") and body["secret"].startswith("whsec_")
    assert body["event_types"] == ["effect.confirmed"]
    listed = operator.client.get("/api/v1/webhook-endpoints").json()["results"]
    assert [e["id"] for e in listed] == [body["id"]]
    assert "secret" not in listed[0]
    # An agent's own endpoints are not the tenant's: it sees none of these.
    assert agent.client.get("/api/v1/webhook-endpoints").json()["results"] == []


def test_approvers_do_not_manage_webhooks(approver, receiver):
    refused = approver.client.post(
        "/api/v1/webhook-endpoints", {"url": receiver.url}, format="json"
    )
    assert refused.status_code == 403
    assert refused["Content-Type"] == "application/problem+json"
    assert approver.client.get("/api/v1/webhook-endpoints").status_code == 403


def own_endpoint(persona, receiver, **fields) -> dict:
    response = persona.client.post(
        "/api/v1/webhook-endpoints", {"url": receiver.url, **fields}, format="json"
    )
    assert response.status_code == 201, response.content
    return response.json()


def test_an_agent_manages_its_own_endpoints_and_sees_no_other(
    agent, other_agent, operator, receiver
):
    mine = own_endpoint(agent, receiver, description="refund-bot's")
    assert mine["owner"] == "refund-bot" and mine["secret"].startswith("whsec_")
    theirs = own_endpoint(other_agent, receiver)
    tenant_wide = own_endpoint(operator, receiver)
    assert tenant_wide["owner"] is None
    listed = agent.client.get("/api/v1/webhook-endpoints").json()["results"]
    assert [e["id"] for e in listed] == [mine["id"]]
    everything = operator.client.get("/api/v1/webhook-endpoints").json()["results"]
    assert {e["id"] for e in everything} == {mine["id"], theirs["id"], tenant_wide["id"]}
    for other in (theirs["id"], tenant_wide["id"]):
        for answer in (
            agent.client.get(f"/api/v1/webhook-endpoints/{other}"),
            agent.client.delete(f"/api/v1/webhook-endpoints/{other}"),
            agent.client.get(f"/api/v1/webhook-endpoints/{other}/messages"),
            agent.client.post(f"/api/v1/webhook-endpoints/{other}/disable"),
        ):
            assert answer.status_code == 404, answer.content
    assert WebhookEndpoint.objects.filter(enabled=True).count() == 3
    # Its endpoint hears of its own effects: it may not name other principals.
    named = agent.client.post(
        "/api/v1/webhook-endpoints",
        {"url": receiver.url, "principals": ["deploy-bot"]},
        format="json",
    )
    assert named.status_code == 400
    assert "principals" in named.json()["errors"]
    assert agent.client.delete(f"/api/v1/webhook-endpoints/{mine['id']}").status_code == 204
    assert agent.client.get(f"/api/v1/webhook-endpoints/{mine['id']}").status_code == 404
    assert agent.client.get("/api/v1/webhook-endpoints").json()["results"] == []
    assert mine["id"] not in {
        e["id"] for e in operator.client.get("/api/v1/webhook-endpoints").json()["results"]
    }
    assert WebhookEndpoint.objects.get(pk=mine["id"]).enabled is False


def test_an_agents_endpoint_hears_of_its_own_effects_and_those_it_waits_on(
    agent, other_agent, approver, refund_body, ticket_body, sandbox, eager_tasks, receiver
):
    mine = own_endpoint(agent, receiver)
    theirs = own_endpoint(other_agent, receiver)
    own_ticket = confirmed_ticket(agent, ticket_body, "mine")
    other_ticket = other_agent.submit(
        {**ticket_body, "payload": {"title": "other", "priority": "P3"}}, "theirs"
    ).json()["effect_id"]
    receiver.wait_for(2)
    heard = {
        endpoint_id: set(
            WebhookMessage.objects.filter(endpoint_id=endpoint_id).values_list(
                "effect_id", flat=True
            )
        )
        for endpoint_id in (mine["id"], theirs["id"])
    }
    assert heard == {mine["id"]: {own_ticket}, theirs["id"]: {other_ticket}}

    # deploy-bot's thread submits the same intention: it waits on refund-bot's effect, and
    # its endpoint hears of it from then on.
    big = {**refund_body, "payload": {**refund_body["payload"], "amount": 50_000}}
    first = agent.submit({**big, "context": {"thread_id": "t-a"}}, "shared").json()
    again = other_agent.submit({**big, "context": {"thread_id": "t-b"}}, "shared")
    assert again.status_code == 200 and again.json()["effect_id"] == first["effect_id"]
    approver.client.post(
        f"/api/v1/effects/{first['effect_id']}/approve",
        {"payload_digest": first["payload_digest"]},
        format="json",
    )
    messages = WebhookMessage.objects.filter(effect_id=first["effect_id"])
    by_endpoint = {
        endpoint_id: sorted(
            messages.filter(endpoint_id=endpoint_id).values_list("event_type", flat=True)
        )
        for endpoint_id in heard
    }
    decided = ["effect.approval_decided", "effect.approved", "effect.confirmed"]
    assert by_endpoint == {
        mine["id"]: sorted(["effect.awaiting_approval", *decided]),
        theirs["id"]: decided,  # it waited from its replay on
    }
    confirmed = messages.filter(event_type="effect.confirmed").first()
    assert confirmed.payload["data"]["thread_ids"] == ["t-a", "t-b"]


def test_invalid_endpoints_are_400_with_field_errors(operator):
    bad = operator.client.post(
        "/api/v1/webhook-endpoints",
        {"url": "http://hooks.example.com/x", "event_types": ["effect.confirmed"]},
        format="json",
    )
    assert bad.status_code == 400
    assert "url" in bad.json()["errors"]
    unknown = operator.client.post(
        "/api/v1/webhook-endpoints",
        {"url": "https://hooks.example.com/x", "event_types": ["effect.exploded"]},
        format="json",
    )
    assert unknown.status_code == 400
    assert "event_types.0" in unknown.json()["errors"]


def test_a_confirmed_effect_is_delivered_signed_without_its_payload(
    agent, ticket_body, sandbox, eager_tasks, receiver, webhook_endpoint
):
    endpoint_id, secret = webhook_endpoint
    effect_id = confirmed_ticket(agent, ticket_body)
    (delivery,) = receiver.wait_for(1)
    event = Webhook(secret).verify(delivery.body, delivery.headers)
    assert event["type"] == "effect.confirmed"
    data = event["data"]
    assert data["effect_id"] == effect_id
    assert (data["from_status"], data["to_status"], data["status"]) == (
        "DISPATCHING",
        "CONFIRMED",
        "CONFIRMED",
    )
    assert data["effect_type"] == "ticket.create"
    assert "payload" not in data and "Printer on fire" not in delivery.body.decode()
    message = WebhookMessage.objects.get()
    assert delivery.headers["webhook-id"] == message.pk and message.pk.startswith("msg_")
    assert (message.state, message.attempts, message.last_status) == ("delivered", 1, 200)
    assert message.endpoint_id == endpoint_id
    # The signature covers the body: a changed byte does not verify.
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(delivery.body.replace(b"CONFIRMED", b"REJECTED"), delivery.headers)


def test_a_failing_receiver_gets_the_event_again_with_the_same_id(
    agent, ticket_body, sandbox, eager_tasks, receiver, webhook_endpoint
):
    _, secret = webhook_endpoint
    receiver.answer(500, 503)
    confirmed_ticket(agent, ticket_body)
    receiver.wait_for(1)
    message = WebhookMessage.objects.get()
    assert (message.state, message.attempts, message.last_status) == ("pending", 1, 500)
    assert message.next_attempt_at > timezone.now()
    assert webhook_sweep() == 0  # not due yet: backoff
    make_due()
    assert webhook_sweep() == 1
    make_due()
    assert webhook_sweep() == 1
    deliveries = receiver.wait_for(3)
    assert len({d.headers["webhook-id"] for d in deliveries}) == 1
    for delivery in deliveries:
        Webhook(secret).verify(delivery.body, delivery.headers)
    message.refresh_from_db()
    assert (message.state, message.attempts, message.last_status) == ("delivered", 3, 200)
    make_due()
    assert webhook_sweep() == 0
    assert len(receiver.deliveries) == 3


def test_a_410_disables_the_endpoint_and_stops_deliveries(
    agent, ticket_body, sandbox, eager_tasks, receiver, webhook_endpoint
):
    endpoint_id, _ = webhook_endpoint
    receiver.answer(410)
    confirmed_ticket(agent, ticket_body, "t1")
    receiver.wait_for(1)
    endpoint = WebhookEndpoint.objects.get(pk=endpoint_id)
    assert endpoint.enabled is False
    assert "410" in endpoint.disabled_reason
    assert WebhookMessage.objects.get().state == "gone"
    confirmed_ticket(agent, {**ticket_body, "payload": {"title": "b", "priority": "P3"}}, "t2")
    make_due()
    assert webhook_sweep() == 0
    assert len(receiver.deliveries) == 1
    assert WebhookMessage.objects.count() == 1


def test_a_receiver_that_never_recovers_ends_failed(
    agent, ticket_body, sandbox, eager_tasks, receiver, webhook_endpoint, settings
):
    settings.GATEWAY_WEBHOOK_MAX_ATTEMPTS = 2
    receiver.answer(500, 500, 500)
    confirmed_ticket(agent, ticket_body)
    receiver.wait_for(1)
    make_due()
    webhook_sweep()
    message = WebhookMessage.objects.get()
    assert (message.state, message.attempts, message.next_attempt_at) == ("failed", 2, None)
    make_due()
    assert webhook_sweep() == 0


def test_approval_decisions_and_rejections_are_announced(
    agent, approver, refund_body, sandbox, eager_tasks, receiver, webhook_endpoint
):
    _, secret = webhook_endpoint
    big = {**refund_body, "payload": {**refund_body["payload"], "amount": 50_000}}
    approved = agent.submit(big, "big-1").json()
    refused = agent.submit({**big, "payload": {**big["payload"], "amount": 60_000}}, "big-2").json()
    # Each waits for an approver: announced, with the console page to approve it on.
    waiting = receiver.wait_for(2)
    assert [d.event["type"] for d in waiting] == ["effect.awaiting_approval"] * 2
    assert waiting[0].event["data"]["approval"]["url"].endswith(f"/effects/{approved['effect_id']}")
    assert waiting[0].event["data"]["requested_by"] == "refund-bot"
    response = approver.client.post(
        f"/api/v1/effects/{approved['effect_id']}/approve",
        {"payload_digest": approved["payload_digest"]},
        format="json",
    )
    assert response.status_code == 200
    approver.client.post(
        f"/api/v1/effects/{refused['effect_id']}/reject", {"reason": "too much"}, format="json"
    )
    receiver.wait_for(7)
    events = [Webhook(secret).verify(d.body, d.headers) for d in receiver.deliveries[2:]]
    seen = [(e["type"], e["data"]["effect_id"]) for e in events]
    assert seen == [
        ("effect.approved", approved["effect_id"]),
        ("effect.approval_decided", approved["effect_id"]),
        ("effect.confirmed", approved["effect_id"]),
        ("effect.approval_decided", refused["effect_id"]),
        ("effect.rejected", refused["effect_id"]),
    ]
    assert all(d.headers["user-agent"].startswith("effect-gateway/") for d in receiver.deliveries)
    decisions = {
        e["data"]["effect_id"]: e["data"]["approval"]
        for e in events
        if e["type"] == "effect.approval_decided"
    }
    assert decisions[approved["effect_id"]] == {
        "decision": "approved",
        "decided_by": "approver:alice",
    }
    assert decisions[refused["effect_id"]]["decision"] == "rejected"


def test_an_endpoint_hears_only_its_event_types(
    operator, agent, ticket_body, sandbox, eager_tasks, receiver
):
    operator.client.post(
        "/api/v1/webhook-endpoints",
        {"url": receiver.url, "event_types": ["effect.unknown"]},
        format="json",
    )
    confirmed_ticket(agent, ticket_body)
    assert WebhookMessage.objects.count() == 0
    assert receiver.deliveries == []


def test_an_endpoint_that_does_not_hear_of_the_outcome_leaves_the_record_one_statement(
    operator, agent, ticket_body, sandbox, receiver
):
    """An enabled endpoint that hears only of UNKNOWN effects: a confirmation is recorded by
    the one-statement record (nothing for the outbox to write), an UNKNOWN outcome the
    general way, with its message."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    operator.client.post(
        "/api/v1/webhook-endpoints",
        {"url": receiver.url, "event_types": ["effect.unknown"]},
        format="json",
    )
    confirmed = agent.submit(ticket_body, "heard-of-nothing").json()["effect_id"]
    with CaptureQueriesContext(connection) as statements:
        assert services.effect_dispatch(effect_id=confirmed, worker="test")
    assert Effect.objects.get(pk=confirmed).status == "CONFIRMED"
    assert len(statements.captured_queries) == 2  # the claim and the record
    assert WebhookMessage.objects.count() == 0

    sandbox.add_fault("commit_then_drop", times=1)
    unknown = agent.submit(
        {**ticket_body, "payload": {**ticket_body["payload"], "title": "dropped"}}, "heard"
    ).json()["effect_id"]
    services.effect_dispatch(effect_id=unknown, worker="test")
    assert Effect.objects.get(pk=unknown).status == "UNKNOWN"
    messages = list(WebhookMessage.objects.values_list("effect_id", "event_type"))
    assert messages == [(unknown, "effect.unknown")]


def test_a_rolled_back_change_writes_no_message(
    agent, approver, refund_body, receiver, webhook_endpoint
):
    big = {**refund_body, "payload": {**refund_body["payload"], "amount": 50_000}}
    effect_id = agent.submit(big, "big").json()["effect_id"]
    effect = Effect.objects.select_related("command").get(pk=effect_id)
    assert WebhookMessage.objects.count() == 1  # effect.awaiting_approval
    with pytest.raises(RuntimeError), transaction.atomic():
        services.effect_reject(effect=effect, principal=approver.principal, reason="no")
        assert WebhookMessage.objects.count() == 3  # written with the change...
        raise RuntimeError("the transaction fails after the transition")
    assert WebhookMessage.objects.count() == 1  # ...and gone with it
    assert Effect.objects.get(pk=effect_id).status == "AWAITING_APPROVAL"
    assert receiver.deliveries == []


def test_other_tenants_hear_nothing(
    rival_operator, agent, ticket_body, sandbox, eager_tasks, receiver
):
    rival_operator.client.post("/api/v1/webhook-endpoints", {"url": receiver.url}, format="json")
    confirmed_ticket(agent, ticket_body)
    assert WebhookMessage.objects.count() == 0


@pytest.mark.worker
def test_a_real_worker_delivers_and_beat_retries(
    agent, ticket_body, sandbox, receiver, webhook_endpoint, queue, tmp_path
):
    from tests.support.processes import Celery, wait_until

    _, secret = webhook_endpoint
    receiver.answer(503)
    effect_id = agent.submit(ticket_body, "worker-1").json()["effect_id"]
    fast = {"GATEWAY_WEBHOOK_BACKOFF": "0.5", "GATEWAY_WEBHOOK_SWEEP_INTERVAL": "1"}
    worker = Celery("worker", queue, tmp_path / "worker.log", **fast)
    beat = Celery("beat", queue, tmp_path / "beat.log", **fast)
    try:
        wait_until(
            lambda: len(receiver.deliveries) >= 2,
            timeout=60,
            what="a failed delivery and its retry",
        )
    finally:
        beat.stop()
        worker.stop()
    first, second = receiver.deliveries[:2]
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    event = Webhook(secret).verify(second.body, second.headers)
    assert (event["type"], event["data"]["effect_id"]) == ("effect.confirmed", effect_id)
    message = WebhookMessage.objects.get()
    assert (message.state, message.attempts) == ("delivered", 2)
    assert "Traceback" not in worker.output()


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1/hooks",
        "https://10.1.2.3/hooks",
        "https://169.254.169.254/latest/meta-data",
        "https://[::1]/hooks",
        "https://localhost/hooks",
    ],
)
def test_internal_receivers_are_refused_when_private_addresses_are_not_allowed(
    operator, settings, url
):
    settings.GATEWAY_WEBHOOK_ALLOW_PRIVATE = False
    response = operator.client.post("/api/v1/webhook-endpoints", {"url": url}, format="json")
    assert response.status_code == 400
    assert "internal address" in str(response.json()["errors"])
    assert WebhookEndpoint.objects.count() == 0


def test_a_receiver_that_turns_internal_is_not_sent_to(
    agent, ticket_body, sandbox, eager_tasks, receiver, webhook_endpoint, settings
):
    # Registered while allowed (as on this loopback test receiver); then the policy (or the
    # name's DNS answer) changes: the delivery re-checks and sends nothing.
    endpoint_id, _ = webhook_endpoint
    settings.GATEWAY_WEBHOOK_ALLOW_PRIVATE = False
    confirmed_ticket(agent, ticket_body, "t1")
    assert receiver.deliveries == []
    endpoint = WebhookEndpoint.objects.get(pk=endpoint_id)
    assert endpoint.enabled is False
    assert "internal address" in endpoint.disabled_reason
    assert WebhookMessage.objects.get().state == "gone"


def test_private_receivers_are_refused_unless_a_deployment_allows_them():
    """The default, outside production too, is off: a development gateway's network is
    worth reaching as well (read from a fresh process, with the variable unset)."""
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_WEBHOOK_ALLOW_PRIVATE"}
    code = (
        "import django; django.setup(); from django.conf import settings; "
        "print(settings.GATEWAY_WEBHOOK_ALLOW_PRIVATE)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={
            **env,
            "DJANGO_SETTINGS_MODULE": "gateway.settings",
            "DATABASE_URL": "postgres://x@127.0.0.1:9/x",
            "CELERY_BROKER_URL": "redis://127.0.0.1:9/0",
        },
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "False"


def test_a_waiter_recorded_during_a_status_change_waits_for_it_to_commit(
    agent, other_agent, approver, refund_body
):
    """The waiter's insert takes FOR SHARE on the effect: while a change holds the row (its
    outbox rows already written without the new waiter), the insert waits, so the waiting
    thread reads the new status next instead of interrupting on the old one."""
    import threading

    from gateway.webhooks.services import waiter_record

    big = {**refund_body, "payload": {**refund_body["payload"], "amount": 50_000}}
    effect_id = agent.submit({**big, "context": {"thread_id": "t-a"}}, "locked").json()["effect_id"]
    effect = Effect.objects.select_related("command").get(pk=effect_id)
    done = threading.Event()
    answers: list[bool] = []

    def record() -> None:
        from django.db import connection

        try:
            answers.append(
                waiter_record(effect, principal=other_agent.principal, context={"thread_id": "t-b"})
            )
        finally:
            connection.close()
            done.set()

    with transaction.atomic():
        services.effect_reject(effect=effect, principal=approver.principal, reason="no")
        worker = threading.Thread(target=record)
        worker.start()
        assert not done.wait(0.5), "the waiter was recorded while the change was in flight"
    assert done.wait(10)
    worker.join()
    assert answers == [True]
    assert Effect.objects.get(pk=effect_id).status == "REJECTED"
    # A second record of the same thread is no new waiter; the submitter's own thread is none.
    assert (
        waiter_record(effect, principal=other_agent.principal, context={"thread_id": "t-b"})
        is False
    )
    assert waiter_record(effect, principal=agent.principal, context={"thread_id": "t-a"}) is False
    assert waiter_record(effect, principal=agent.principal, context={"thread_id": 7}) is False
