"""The API's fast lane (gateway.api.lane) answers exactly what the DRF views answer.

Every request below goes once through the whole stack as configured (the lane serves it) and
once through the same stack without the lane's middleware (DRF's views and every middleware
serve it), each in a savepoint rolled back afterwards, with the clock and the new effect's id
fixed: status, headers and bytes must be equal, the lane must have served what it claims
(DRF's dispatch not called), and a refused request must leave the ledger as it was.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.cache import cache
from django.core.management import call_command
from django.db import transaction
from django.test import Client
from rest_framework.throttling import SimpleRateThrottle
from rest_framework.views import APIView

from gateway import services
from gateway.models import ApiToken, Attempt, Capability, Command, Effect, EffectEvent, Receipt
from tests.conftest import REFUND, TICKET
from tests.security.test_bad_input import BAD_BODIES

pytestmark = pytest.mark.django_db

LANE = "gateway.api.lane.ApiLaneMiddleware"
NOW = datetime(2026, 3, 14, 15, 9, 26, 535897, tzinfo=UTC)


@dataclass(frozen=True)
class Answer:
    status: int
    headers: tuple[tuple[str, str], ...]
    content: bytes
    drf_dispatches: int
    ledger_changed: bool


def ledger() -> tuple:
    return (
        list(Command.objects.order_by("pk").values_list("pk", "payload_digest")),
        list(Effect.objects.order_by("pk").values_list("pk", "status", "updated_at")),
        EffectEvent.objects.count(),
        Attempt.objects.count(),
        Receipt.objects.count(),
        list(Capability.objects.order_by("pk").values_list("pk", "spent_count", "spent_amount")),
    )


class _RolledBack(Exception):
    pass


@pytest.fixture
def send(monkeypatch, settings):
    """send(lane, method, path, body=None, **headers) -> Answer, nothing kept."""
    monkeypatch.setattr("django.utils.timezone.now", lambda: NOW)
    monkeypatch.setattr(services, "new_effect_id", lambda: "eff_01LANE0TEST0000000000000000")
    dispatches = []
    real_dispatch = APIView.dispatch

    def counting_dispatch(self, request, *args, **kwargs):
        dispatches.append(request.path)
        return real_dispatch(self, request, *args, **kwargs)

    monkeypatch.setattr(APIView, "dispatch", counting_dispatch)
    full = list(django_settings.MIDDLEWARE)
    assert LANE in full

    def run(lane: bool, method: str, path: str, body: Any = None, **headers: Any) -> Answer:
        settings.MIDDLEWARE = full if lane else [m for m in full if m != LANE]
        cache.clear()  # throttle histories: each side starts from the same one
        dispatches.clear()
        client = Client(HTTP_HOST=headers.pop("HTTP_HOST", "testserver"))
        content_type = headers.pop("content_type", "application/json")
        raw = body if isinstance(body, bytes) else (body or "").encode()
        answer = None
        try:
            with transaction.atomic():
                before = ledger()
                response = client.generic(method, path, raw, content_type, **headers)
                answer = Answer(
                    status=response.status_code,
                    headers=tuple(sorted((k.lower(), v) for k, v in response.headers.items())),
                    content=response.content,
                    drf_dispatches=len(dispatches),
                    ledger_changed=ledger() != before,
                )
                raise _RolledBack
        except _RolledBack:
            pass
        assert answer is not None
        return answer

    return run


def same(send, method: str, path: str, body: Any = None, *, served: bool = True, **headers):
    """The lane's answer, after checking it against DRF's for the same request."""
    lane = send(True, method, path, body, **dict(headers))
    drf = send(False, method, path, body, **dict(headers))
    assert (lane.status, lane.headers, lane.content) == (drf.status, drf.headers, drf.content)
    if served:  # DRF's view answers it without the lane, the lane alone with it
        assert (drf.drf_dispatches, lane.drf_dispatches) == (1, 0), "served by the lane?"
    else:
        assert lane.drf_dispatches == drf.drf_dispatches
    if lane.status >= 400:
        assert not lane.ledger_changed and not drf.ledger_changed
    return lane


def bearer(token: str, key: str | None = "lane-key", **more: str) -> dict[str, str]:
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}", **more}
    if key is not None:
        headers["HTTP_IDEMPOTENCY_KEY"] = key
    return headers


def submit(send, token: str, body: Any, key: str | None = "lane-key", served=None, **more):
    raw = body if isinstance(body, bytes | str) else json.dumps(body)
    # Django's test client sends no Content-Type with an empty body: DRF's case.
    served = bool(raw) if served is None else served
    return same(send, "POST", "/api/v1/commands", raw, served=served, **bearer(token, key, **more))


def no_requests_allowed(monkeypatch) -> None:
    rates = {**SimpleRateThrottle.THROTTLE_RATES, "token": "0/min"}
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", rates)


def with_budget(tenant: str, name: str) -> str:
    out = io.StringIO()
    call_command(
        "issue_token",
        tenant=tenant,
        principal=name,
        role="agent",
        types="ticket.*",
        budget_count=5,
        stdout=out,
    )
    return out.getvalue().strip().splitlines()[-1]


# --- submissions that are accepted ---------------------------------------------------------------


def test_a_new_command_is_the_same_201(send, agent):
    answer = submit(send, agent.token, TICKET)
    assert answer.status == 201 and answer.ledger_changed
    assert b'"effect_id":"eff_01LANE0TEST' in answer.content


def test_commands_on_the_general_path_are_the_same_201(send, agent):
    # Awaiting an approver (announced in its transaction) and a grant with a budget: both
    # leave the one-statement submission for services' general path.
    big = {**REFUND, "payload": {**REFUND["payload"], "amount": 50_000}}
    assert b'"AWAITING_APPROVAL"' in submit(send, agent.token, big).content
    budgeted = with_budget("acme", "budget-bot")
    assert submit(send, budgeted, TICKET).status == 201


def test_a_replay_is_the_same_200(send, agent):
    first = agent.submit(TICKET, "lane-key")
    assert first.status_code == 201
    answer = submit(send, agent.token, TICKET)
    assert answer.status == 200 and not answer.ledger_changed
    assert ("idempotent-replayed", "true") in answer.headers
    reworded = {**TICKET, "intent": {"summary": "same ticket, other words"}}
    assert submit(send, agent.token, reworded).status == 200


def test_a_replay_of_a_dispatched_effect_is_the_same_200(send, agent, sandbox):
    effect_id = agent.submit(TICKET, "lane-key").json()["effect_id"]
    assert services.effect_dispatch(effect_id=effect_id, worker="test")
    answer = submit(send, agent.token, TICKET)
    assert answer.status == 200 and b'"receipt":{' in answer.content


def test_an_odd_but_valid_body_is_the_same(send, agent):
    # CharField trims the type; unknown members are ignored; optional members may be absent.
    assert submit(send, agent.token, {**TICKET, "type": " ticket.create "}).status == 201
    assert submit(send, agent.token, {**TICKET, "extra": [1]}, "k2").status == 201
    bare = {k: TICKET[k] for k in ("type", "resource", "payload")}
    assert submit(send, agent.token, bare, "k3").status == 201


# --- submissions that are refused ----------------------------------------------------------------


def test_a_conflicting_payload_under_the_same_key_is_the_same_422(send, agent):
    agent.submit(TICKET, "lane-key")
    other = {**TICKET, "payload": {**TICKET["payload"], "priority": "P1"}}
    assert submit(send, agent.token, other).status == 422


@pytest.mark.parametrize("key", [None, "", "a, b", "x" * 300, "tab\tkey"])
def test_a_bad_idempotency_key_is_the_same_400(send, agent, key):
    assert submit(send, agent.token, TICKET, key).status == 400


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{}",
        b'{"type": "ticket.create",',
        b"[1, 2, 3]",
        b'"just a string"',
        b"null",
        *[v if isinstance(v, bytes) else str(v).encode() for v in BAD_BODIES.values()],
    ],
)
def test_a_bad_body_is_the_same_4xx(send, agent, body, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1_000_000
    answer = submit(send, agent.token, body)
    assert 400 <= answer.status < 500


@pytest.mark.parametrize(
    "changes",
    [
        {"type": "billing.refund.teleport"},
        {"type": 42},
        {"type": ""},
        {"type": None},
        {"type": "t" * 101},
        {"resource": None},
        {"payload": None},
        {"intent": None},
        {"context": None},
        {"expires_in": None},
        {"expires_in": "soon"},
        {"expires_in": 0},
        {"intent": "refund it"},
        {"payload": [1, 2]},
        {"payload": {"title": "x", "priority": "P9"}},
        {"resource": {"type": "customer", "id": "x"}},
        {"resource": "queue"},
    ],
)
def test_an_invalid_command_is_the_same_400(send, agent, changes):
    assert submit(send, agent.token, {**TICKET, **changes}).status == 400


def test_a_missing_member_is_the_same_400(send, agent):
    for name in ("type", "resource", "payload"):
        body = {k: v for k, v in TICKET.items() if k != name}
        assert submit(send, agent.token, body).status == 400


def test_an_oversize_body_is_the_same_400(send, agent, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4096
    big = {**TICKET, "intent": {"summary": "x" * 10_000}}
    answer = submit(send, agent.token, big)
    assert answer.status == 400 and b"body-too-large" in answer.content


def test_tokens_that_do_not_authenticate_are_the_same_401_or_403(send, agent, approver):
    assert submit(send, "egw_not-a-real-token", TICKET).status == 401
    token = ApiToken.objects.get(principal=agent.principal)
    ApiToken.objects.filter(pk=token.pk).update(expires_at=NOW)
    assert submit(send, agent.token, TICKET).status == 401
    ApiToken.objects.filter(pk=token.pk).update(expires_at=None, revoked_at=NOW)
    assert submit(send, agent.token, TICKET).status == 401
    ApiToken.objects.filter(pk=token.pk).update(revoked_at=None)
    agent.principal.frozen = True
    agent.principal.save()
    assert submit(send, agent.token, TICKET).status == 403
    assert submit(send, approver.token, TICKET).status == 403  # a role that may not submit
    for header, served in (("Bearer", False), ("Bearer a b", True), ("bearer  x", True)):
        answer = same(send, "POST", "/api/v1/commands", json.dumps(TICKET), served=served,
                      HTTP_AUTHORIZATION=header, HTTP_IDEMPOTENCY_KEY="k")  # fmt: skip
        assert answer.status == 401


def test_a_token_over_its_rate_is_the_same_429(send, agent, monkeypatch):
    no_requests_allowed(monkeypatch)
    answer = submit(send, agent.token, TICKET)
    assert answer.status == 429 and dict(answer.headers)["retry-after"]


def test_a_bad_host_is_the_same_400(send, agent):
    # Refused before any view: by the lane, or by CommonMiddleware without it.
    answer = submit(send, agent.token, TICKET, served=False, HTTP_HOST="evil.example")
    assert answer.status == 400


# --- what the lane leaves to DRF ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "content_type"),
    [
        ({"HTTP_ACCEPT": "text/html"}, "application/json"),
        ({"HTTP_ACCEPT": "application/json; indent=4"}, "application/json"),
        ({}, "text/plain"),
        ({}, "application/x-www-form-urlencoded"),
        ({}, "application/json; charset=latin-1"),
        ({"HTTP_TRANSFER_ENCODING": "chunked"}, "application/json"),
    ],
)
def test_what_drf_negotiates_is_left_to_drf(send, agent, headers, content_type):
    answer = same(send, "POST", "/api/v1/commands", json.dumps(TICKET), served=False,
                  content_type=content_type, **bearer(agent.token), **headers)  # fmt: skip
    assert answer.status in (201, 400, 406, 411, 415)


def test_a_query_string_or_a_session_is_left_to_drf(send, agent):
    answer = same(send, "POST", "/api/v1/commands?format=json", json.dumps(TICKET),
                  served=False, **bearer(agent.token))  # fmt: skip
    assert answer.status == 201
    no_token = same(send, "POST", "/api/v1/commands", json.dumps(TICKET), served=False,
                    HTTP_IDEMPOTENCY_KEY="k")  # fmt: skip
    assert no_token.status == 401


def test_the_plain_json_content_types_are_served(send, agent):
    for content_type in ("application/json; charset=utf-8", "Application/JSON"):
        answer = same(send, "POST", "/api/v1/commands", json.dumps(TICKET),
                      content_type=content_type, **bearer(agent.token))  # fmt: skip
        assert answer.status == 201
    for accept in ("*/*", "application/json"):
        answer = submit(send, agent.token, TICKET, HTTP_ACCEPT=accept)
        assert answer.status == 201


# --- GET /api/v1/effects/{id} --------------------------------------------------------------------


def test_reading_an_effect_is_the_same(send, agent, other_agent, operator, rival_agent, sandbox):
    effect_id = agent.submit(REFUND, "read-me").json()["effect_id"]
    path = f"/api/v1/effects/{effect_id}"
    for persona in (agent, other_agent, operator):  # its requester, a peer (redacted), an operator
        assert same(send, "GET", path, **bearer(persona.token, None)).status == 200
    assert same(send, "GET", path, **bearer(rival_agent.token, None)).status == 404
    assert same(send, "GET", "/api/v1/effects/eff_nope", **bearer(agent.token, None)).status == 404
    assert services.effect_dispatch(effect_id=effect_id, worker="test")
    answer = same(send, "GET", path, **bearer(agent.token, None))
    assert b'"receipt":{' in answer.content


def test_reading_an_approved_effect_is_the_same(send, agent, approver):
    # The lane reads the approver only when the answer names it (fastpath.effect_read).
    body = {**REFUND, "payload": {**REFUND["payload"], "amount": 50_000}}
    effect_id = agent.submit(body, "approve-me").json()["effect_id"]
    effect = Effect.objects.select_related("command").get(pk=effect_id)
    services.effect_approve(
        effect=effect, principal=approver.principal, payload_digest=effect.command.payload_digest
    )
    answer = same(send, "GET", f"/api/v1/effects/{effect_id}", **bearer(agent.token, None))
    assert answer.status == 200
    assert f'"approved_by":"{approver.principal.name}"'.encode() in answer.content


@pytest.mark.parametrize(
    "query",
    [
        "wait=0",
        "wait=0.05",
        "wait=nan",
        "wait=-1",
        "wait=soon",
        "wait=0.05&until=settled",
        "wait=5&until=PREPARED",
        "wait=1&until=DONE",
        "wait=0.05&seen=PREPARED&until=CONFIRMED,REJECTED",
        "seen=PREPARED",
        "seen=DONE",
        "until=DONE",
    ],
)
def test_a_long_poll_is_the_same(send, agent, query):
    effect_id = agent.submit(TICKET, "poll-me").json()["effect_id"]
    answer = same(send, "GET", f"/api/v1/effects/{effect_id}?{query}", **bearer(agent.token, None))
    assert answer.status in (200, 400)


def test_a_long_poll_for_an_effect_that_is_not_the_callers_is_the_same(send, agent, rival_agent):
    # The lane's long poll looks at the status alone before it waits: scoped to the tenant,
    # and a 404 comes before any complaint about the query, as DRF's get_object does it.
    effect_id = agent.submit(TICKET, "not-yours").json()["effect_id"]
    for query in ("wait=0.05", "wait=soon", "wait=1&until=DONE"):
        path = f"/api/v1/effects/{effect_id}?{query}"
        assert same(send, "GET", path, **bearer(rival_agent.token, None)).status == 404
        unknown = f"/api/v1/effects/eff_nope?{query}"
        assert same(send, "GET", unknown, **bearer(agent.token, None)).status == 404


def test_an_effect_read_that_is_refused_is_the_same(send, agent, monkeypatch, settings):
    effect_id = agent.submit(TICKET, "refused").json()["effect_id"]
    path = f"/api/v1/effects/{effect_id}"
    assert same(send, "GET", path, **bearer("egw_wrong", None)).status == 401
    settings.GATEWAY_MAX_WAITS_PER_PROCESS = 0
    assert same(send, "GET", path + "?wait=1", **bearer(agent.token, None)).status == 429
    no_requests_allowed(monkeypatch)
    assert same(send, "GET", path, **bearer(agent.token, None)).status == 429
    agent.principal.frozen = True
    agent.principal.save()
    assert same(send, "GET", path, **bearer(agent.token, None)).status == 403


def test_other_reads_are_left_to_drf(send, agent):
    effect_id = agent.submit(TICKET, "other").json()["effect_id"]
    for path in (
        f"/api/v1/effects/{effect_id}?format=json",
        f"/api/v1/effects/{effect_id}/events",
        "/api/v1/effects",
    ):
        assert same(send, "GET", path, served=False, **bearer(agent.token, None)).status == 200
    head = same(send, "HEAD", f"/api/v1/effects/{effect_id}", served=False,
                **bearer(agent.token, None))  # fmt: skip
    assert head.status == 200
