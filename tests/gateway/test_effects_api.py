"""Reading effects, the long poll, the actions of issue 2, and tenant isolation."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from gateway import moves, services
from gateway.api import views
from gateway.models import Effect, EffectEvent

pytestmark = pytest.mark.django_db


def created(persona, body, key) -> str:
    response = persona.submit(body, key)
    assert response.status_code == 201, response.json()
    return response.json()["effect_id"]


def test_get_effect_and_its_events(agent, ticket_body, sandbox):
    effect_id = created(agent, ticket_body, "t1")
    services.effect_dispatch(effect_id=effect_id, worker="test")
    body = agent.client.get(f"/api/v1/effects/{effect_id}").json()
    assert body["status"] == "CONFIRMED"
    assert body["attempts"] == 1
    assert body["receipt"]["provider"] == "tickets"
    assert body["receipt"]["digest_matches"] is True
    assert body["receipt"]["provider_operation_id"] == body["provider_operation_id"]
    events = agent.client.get(f"/api/v1/effects/{effect_id}/events").json()
    assert [e["to_status"] for e in events] == ["PREPARED", "DISPATCHING", "CONFIRMED"]
    assert events[0]["actor"] == "agent:refund-bot"


def test_list_is_newest_first_and_filters(agent, ticket_body, refund_body):
    first = created(agent, ticket_body, "t1")
    second = created(agent, refund_body, "r1")
    third = created(
        agent, {**refund_body, "payload": {**refund_body["payload"], "amount": 50_000}}, "r2"
    )
    listed = agent.client.get("/api/v1/effects").json()["results"]
    assert [e["effect_id"] for e in listed] == [third, second, first]
    awaiting = agent.client.get("/api/v1/effects?status=AWAITING_APPROVAL").json()["results"]
    assert [e["effect_id"] for e in awaiting] == [third]
    refunds = agent.client.get("/api/v1/effects?type=billing.refund.create").json()["results"]
    assert {e["effect_id"] for e in refunds} == {second, third}
    owned = agent.client.get("/api/v1/effects?owner=support-tools").json()["results"]
    assert [e["effect_id"] for e in owned] == [first]
    bad = agent.client.get("/api/v1/effects?status=MAYBE")
    assert bad.status_code == 400


def test_list_paginates_with_a_cursor(agent, ticket_body):
    ids = [created(agent, ticket_body, f"t{i}") for i in range(5)]
    page = agent.client.get("/api/v1/effects?limit=2").json()
    seen = [e["effect_id"] for e in page["results"]]
    while page["next"]:
        page = agent.client.get(page["next"]).json()
        seen += [e["effect_id"] for e in page["results"]]
    assert seen == list(reversed(ids))


def test_list_query_count_does_not_grow_with_rows(agent, ticket_body, sandbox):
    """Commands, requesters and latest receipts are read per page, not per row (the list
    used to look up each row's receipt: 50 statements for a page of 50)."""
    for i in range(10):
        effect_id = created(agent, ticket_body, f"t{i}")
        services.effect_dispatch(effect_id=effect_id, worker="test")
    counts = {}
    for limit in (2, 10):
        with CaptureQueriesContext(connection) as queries:
            response = agent.client.get(f"/api/v1/effects?limit={limit}")
        results = response.json()["results"]
        assert len(results) == limit
        assert all(result["receipt"]["provider"] == "tickets" for result in results)
        counts[limit] = len(queries)
    # auth (token + principal), the page, its commands, requesters and receipts
    assert counts[2] == counts[10] <= 7, counts


def test_wait_returns_when_the_status_changes(agent, ticket_body, sandbox, transactional_db):
    effect_id = created(agent, ticket_body, "t1")

    def dispatch_soon():
        time.sleep(0.5)
        try:
            services.effect_dispatch(effect_id=effect_id, worker="test")
        finally:
            connection.close()

    thread = threading.Thread(target=dispatch_soon)
    thread.start()
    body = agent.client.get(f"/api/v1/effects/{effect_id}?wait=10").json()
    thread.join()
    assert body["status"] != "PREPARED"


def test_wait_without_change_returns_the_same_status(agent, ticket_body):
    effect_id = created(agent, ticket_body, "t1")
    body = agent.client.get(f"/api/v1/effects/{effect_id}?wait=0.3").json()
    assert body["status"] == "PREPARED"
    assert agent.client.get(f"/api/v1/effects/{effect_id}?wait=soon").status_code == 400


# The lane's long poll looks at the status before it waits; DRF's view reads the effect whole.
@pytest.mark.parametrize(
    "accept, own_looks", [("application/json", 1), ("application/json; indent=4", 0)]
)
def test_without_news_a_wait_looks_again_within_milliseconds_then_backs_off(
    agent, ticket_body, monkeypatch, accept, own_looks
):
    # An effect the provider answers at once is CONFIRMED a few milliseconds after its
    # submission: a first look after 50 ms made an agent's wait ten times as long as the effect.
    # So it is while the news of changes cannot arrive (gateway.moves: Redis unreachable).
    monkeypatch.setattr(moves.Listener, "subscribed", property(lambda self: False))
    effect_id = created(agent, ticket_body, "t1")
    with CaptureQueriesContext(connection) as queries:
        answer = agent.client.get(f"/api/v1/effects/{effect_id}?wait=0.3", HTTP_ACCEPT=accept)
        assert answer.status_code == 200
    looks = _status_looks(queries)[own_looks:]  # the wait's
    # After 0, 5, 15, 35, 75 and 155 ms (pauses doubling from 5 ms): not one look in 50 ms,
    # and not a busy loop either.
    assert 5 <= len(looks) <= 9, len(looks)


def _status_looks(queries: CaptureQueriesContext) -> list[dict]:
    """The long poll's looks at the status alone (``fastpath.effect_status``), each scoped to
    the caller's tenant: a look by id alone would read another tenant's effect."""
    looks = [
        q for q in queries.captured_queries if "SELECT e.status FROM gateway_effect" in q["sql"]
    ]
    assert all("e.tenant_id = " in q["sql"] for q in looks), looks
    unscoped = [
        q for q in queries.captured_queries if 'SELECT "gateway_effect"."status"' in q["sql"]
    ]
    assert unscoped == [], unscoped
    return looks


def test_a_wait_reads_only_the_way_its_caller_says():
    # No read by id alone to fall back on: a request path that forgot its tenant-scoped read
    # or look would otherwise read another tenant's effect; now it cannot be called at all.
    for given, missing in (("look", "read"), ("read", "look")):
        with pytest.raises(TypeError, match=f"argument: '{missing}'"):
            views._wait_for_change("PREPARED", 0.01, threading.Event(), **{given: lambda: None})


def test_with_news_a_wait_does_not_poll(agent, ticket_body):
    # Woken by the news of a change (tests/gateway/test_moves.py), a wait need not look at
    # the status at all before its half-second fallback: it reads the effect to answer.
    moves.listener.start()
    deadline = time.monotonic() + 5
    while not moves.listener.subscribed:
        assert time.monotonic() < deadline, "the listener did not subscribe"
        time.sleep(0.01)
    effect_id = created(agent, ticket_body, "t1")
    with CaptureQueriesContext(connection) as queries:
        assert agent.client.get(f"/api/v1/effects/{effect_id}?wait=0.3").status_code == 200
    looks = _status_looks(queries)
    assert len(looks) == 1, len(looks)  # the request's own, before the wait
    reads = [q for q in queries.captured_queries if "gateway_effect" in q["sql"]]
    assert len(reads) == 2, len(reads)  # the request's look, the answer's read


def test_a_wait_from_a_status_the_effect_has_left_answers_at_once(agent, ticket_body):
    effect_id = created(agent, ticket_body, "t1")  # PREPARED
    with CaptureQueriesContext(connection) as queries:
        response = agent.client.get(f"/api/v1/effects/{effect_id}?wait=5&seen=DISPATCHING")
    assert response.status_code == 200 and response.json()["status"] == "PREPARED"
    # Answered from the request's own look, without waiting.
    assert len(_status_looks(queries)) == 1
    # From the status it has: a long poll as before (answers when the wait ends, unchanged).
    same = agent.client.get(f"/api/v1/effects/{effect_id}?wait=0.1&seen=PREPARED")
    assert same.json()["status"] == "PREPARED"
    bad = agent.client.get(f"/api/v1/effects/{effect_id}?wait=1&seen=DONE")
    assert bad.status_code == 400
    assert bad["Content-Type"] == "application/problem+json"
    assert "seen" in bad.json()["errors"]


def test_a_wait_until_a_status_answers_at_once_when_the_effect_is_in_it(agent, ticket_body):
    effect_id = created(agent, ticket_body, "t1")  # PREPARED
    started = time.monotonic()
    response = agent.client.get(f"/api/v1/effects/{effect_id}?wait=5&until=PREPARED,CONFIRMED")
    assert response.status_code == 200 and response.json()["status"] == "PREPARED"
    assert time.monotonic() - started < 2  # not the 5 s wait
    # Not yet in one: the wait runs to its end.
    waited = agent.client.get(f"/api/v1/effects/{effect_id}?wait=0.2&until=settled")
    assert waited.json()["status"] == "PREPARED"
    bad = agent.client.get(f"/api/v1/effects/{effect_id}?wait=1&until=PREPARED,DONE")
    assert bad.status_code == 400 and "until" in bad.json()["errors"]


def test_cancel_before_dispatch(agent, ticket_body, sandbox):
    effect_id = created(agent, ticket_body, "t1")
    response = agent.client.post(
        f"/api/v1/effects/{effect_id}/cancel", {"reason": "plan changed"}, format="json"
    )
    assert response.status_code == 200
    assert response.json()["status"] == "CANCELLED"
    assert services.effect_dispatch(effect_id=effect_id, worker="test") is False
    assert sandbox.log() == []
    event = EffectEvent.objects.get(effect_id=effect_id, kind="status")
    assert event.reason == "plan changed" and event.actor == "agent:refund-bot"


def test_cancel_after_dispatch_is_409(agent, ticket_body, sandbox):
    effect_id = created(agent, ticket_body, "t1")
    services.effect_dispatch(effect_id=effect_id, worker="test")
    response = agent.client.post(f"/api/v1/effects/{effect_id}/cancel")
    assert response.status_code == 409
    assert Effect.objects.get(pk=effect_id).status == "CONFIRMED"


def test_another_agent_cannot_cancel_but_an_operator_can(agent, other_agent, operator, ticket_body):
    effect_id = created(agent, ticket_body, "t1")
    assert other_agent.client.post(f"/api/v1/effects/{effect_id}/cancel").status_code == 403
    assert operator.client.post(f"/api/v1/effects/{effect_id}/cancel").status_code == 200


def test_approval_binds_the_digest_and_then_dispatches(
    agent, approver, refund_body, sandbox, django_capture_on_commit_callbacks, eager_tasks
):
    big = {**refund_body, "payload": {**refund_body["payload"], "amount": 50_000}}
    effect = agent.submit(big, "r-big").json()
    url = f"/api/v1/effects/{effect['effect_id']}/approve"
    wrong = approver.client.post(url, {"payload_digest": "sha256:" + "0" * 64}, format="json")
    assert wrong.status_code == 409
    assert wrong.json()["type"].endswith("digest-mismatch")
    assert sandbox.log() == []
    by_requester = agent.client.post(
        url, {"payload_digest": effect["payload_digest"]}, format="json"
    )
    assert by_requester.status_code == 403
    with django_capture_on_commit_callbacks(execute=True):
        ok = approver.client.post(
            url,
            {"payload_digest": effect["payload_digest"], "comment": "checked the incident"},
            format="json",
        )
    assert ok.status_code == 200
    body = agent.client.get(f"/api/v1/effects/{effect['effect_id']}").json()
    assert body["status"] == "CONFIRMED"
    assert body["approval"]["state"] == "approved"
    assert body["approval"]["approved_by"] == "alice"
    assert body["approval"]["approved_digest"] == effect["payload_digest"]
    assert len(sandbox.operations()) == 1
    again = approver.client.post(url, {"payload_digest": effect["payload_digest"]}, format="json")
    assert again.status_code == 409


def test_reject_ends_an_awaiting_command(agent, approver, refund_body, sandbox):
    big = {**refund_body, "payload": {**refund_body["payload"], "amount": 50_000}}
    effect_id = agent.submit(big, "r-big").json()["effect_id"]
    response = approver.client.post(
        f"/api/v1/effects/{effect_id}/reject", {"reason": "no incident"}, format="json"
    )
    assert response.status_code == 200
    assert response.json()["status"] == "REJECTED"
    assert services.effect_dispatch(effect_id=effect_id, worker="test") is False
    assert sandbox.log() == []


def test_freeze_and_unfreeze_are_operator_actions(agent, operator, ticket_body):
    effect_id = created(agent, ticket_body, "t1")
    assert agent.client.post(f"/api/v1/effects/{effect_id}/freeze").status_code == 403
    frozen = operator.client.post(
        f"/api/v1/effects/{effect_id}/freeze", {"reason": "incident"}, format="json"
    )
    assert frozen.json()["frozen"] is True
    assert operator.client.post(f"/api/v1/effects/{effect_id}/unfreeze").json()["frozen"] is False
    kinds = (
        EffectEvent.objects.filter(effect_id=effect_id)
        .order_by("id")
        .values_list("kind", flat=True)
    )
    assert list(kinds) == ["submitted", "frozen", "unfrozen"]


ENDPOINTS = [
    ("get", ""),
    ("get", "/events"),
    ("post", "/approve"),
    ("post", "/reject"),
    ("post", "/cancel"),
    ("post", "/freeze"),
    ("post", "/unfreeze"),
]


@pytest.mark.parametrize(("method", "suffix"), ENDPOINTS)
def test_another_tenants_effect_does_not_exist(method, suffix, agent, rival_operator, ticket_body):
    effect_id = created(agent, ticket_body, "t1")
    before = list(Effect.objects.values_list("status", "frozen"))
    call = getattr(rival_operator.client, method)
    kwargs = {"format": "json"} if method == "post" else {}
    data = {"payload_digest": "sha256:x"} if suffix == "/approve" else {}
    response = call(f"/api/v1/effects/{effect_id}{suffix}", data, **kwargs)
    assert response.status_code == 404
    assert response.headers["Content-Type"] == "application/problem+json"
    assert list(Effect.objects.values_list("status", "frozen")) == before


def test_another_tenants_effects_are_not_listed(agent, rival_agent, ticket_body):
    created(agent, ticket_body, "t1")
    assert rival_agent.client.get("/api/v1/effects").json()["results"] == []


def test_unknown_effect_is_404_problem(agent):
    response = agent.client.get("/api/v1/effects/eff_nope")
    assert response.status_code == 404
    assert response.json()["type"].endswith("not-found")


def test_effect_types_lists_every_contract_with_its_fields(agent):
    from gateway.contracts import CONTRACTS

    body = agent.client.get("/api/v1/effect-types").json()["results"]
    assert {entry["type"] for entry in body} == set(CONTRACTS)
    required = {
        "type",
        "provider",
        "effect_class",
        "approval",
        "resource_type",
        "payload_schema",
        "example",
        "compensator",
        "owner",
    }
    for entry in body:
        assert required <= set(entry)
    mail = next(e for e in body if e["type"] == "email.message.send")
    assert mail["irreversible"] is True and mail["automatic_compensation"] is False
    refund = next(e for e in body if e["type"] == "billing.refund.create")
    assert refund["approval"]["rule"] == {"field": "amount", "op": ">", "value": 10_000}


def test_openapi_schema_and_docs_are_served(agent, client):
    schema = agent.client.get("/api/schema/")
    assert schema.status_code == 200
    text = schema.content.decode()
    assert "/api/v1/commands" in text and "/api/v1/effects/{id}/approve" in text
    assert client.get("/api/docs/").status_code == 200


def test_health_and_readiness(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200, ready.json()
    assert ready.json()["status"] == "ready"
    assert ready.json()["checks"]["database"] == "ok"
    assert ready.json()["checks"]["broker"] == "ok"
    # The tests' cache is per process (no GATEWAY_CACHE_URL): reported as such, not degraded.
    assert ready.json()["checks"]["cache"].startswith("local")


def test_unknown_api_path_is_a_problem(client):
    response = client.get("/api/v1/nowhere")
    assert response.status_code == 404
    assert response.headers["Content-Type"] == "application/problem+json"


def test_a_long_poll_reads_the_effect_whole_only_for_its_answer(agent, ticket_body):
    # It used to read the effect whole (command, requester, newest receipt: the models of a
    # row the wait made stale) before waiting too; the look before the wait needs its status.
    effect_id = created(agent, ticket_body, "t1")
    with CaptureQueriesContext(connection) as queries:
        response = agent.client.get(f"/api/v1/effects/{effect_id}?wait=0.1&seen=PREPARED")
    assert response.status_code == 200 and response.json()["status"] == "PREPARED"
    whole = [q["sql"] for q in queries.captured_queries if "gateway_receipt" in q["sql"]]
    assert len(whole) == 1, whole


def test_only_a_request_that_waits_listens_for_news(agent, ticket_body, monkeypatch):
    # ``seen`` or ``until`` without ``wait`` answers at once: it registers no wait with the
    # listener (nor starts its thread), as before the look before the wait read the status.
    effect_id = created(agent, ticket_body, "t1")
    watched: list[str] = []
    real = moves.Listener.watching

    def watching(self, effect_id):
        watched.append(effect_id)
        return real(self, effect_id)

    monkeypatch.setattr(moves.Listener, "watching", watching)
    for query in ("seen=PREPARED", "until=settled"):
        response = agent.client.get(f"/api/v1/effects/{effect_id}?{query}")
        assert response.status_code == 200 and response.json()["status"] == "PREPARED"
    assert watched == []
    assert agent.client.get(f"/api/v1/effects/{effect_id}?wait=0.01").status_code == 200
    assert watched == [effect_id]


def test_reading_an_effect_is_one_query(agent, ticket_body, sandbox):
    # The lane's answer used to read the effect a second time to represent it, and its
    # receipt a third; now one prepared query reads the effect with its command, requester
    # and newest receipt.
    effect_id = created(agent, ticket_body, "t1")
    services.effect_dispatch(effect_id=effect_id, worker="test")  # a receipt to answer with
    with CaptureQueriesContext(connection) as queries:
        response = agent.client.get(f"/api/v1/effects/{effect_id}")
    assert response.status_code == 200 and response.json()["effect_id"] == effect_id
    assert response.json()["receipt"]["provider_operation_id"]
    reads = [q["sql"] for q in queries.captured_queries if "gateway_apitoken" not in q["sql"]]
    assert len(reads) == 1, reads
