"""Issue 13 item 6: no 500 on bad input, anywhere — the API, the console, the admin, the hooks
and the signed provider webhooks. Every refusal is a 4xx and leaves the ledger as it was."""

from __future__ import annotations

import json
import time

import pytest
from django.test import Client

from gateway.models import Capability, Command, Effect, EffectEvent
from reconciliation.webhooks import sign

pytestmark = pytest.mark.django_db


def ledger() -> tuple[int, int, int, int]:
    return (
        Command.objects.count(),
        Effect.objects.count(),
        EffectEvent.objects.count(),
        Capability.objects.filter(spent_count__gt=0).count(),
    )


def nested(depth: int):
    value: dict = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


REFUND = {
    "type": "billing.refund.create",
    "resource": {"type": "order", "id": "ord_1", "version": 1},
    "payload": {"amount": 500, "currency": "EUR", "reason": "duplicate"},
}


def raw(body: dict) -> str:
    return json.dumps(body)


BAD_BODIES = {
    "nul in a value": raw({**REFUND, "payload": {**REFUND["payload"], "reason": "a\u0000b"}}),
    "nul in a key": raw({**REFUND, "context": {"run\u0000id": "x"}}),
    "nul in resource id": raw({**REFUND, "resource": {**REFUND["resource"], "id": "ord\u0000"}}),
    "lone surrogate": raw(REFUND).replace('"duplicate"', '"dup\\ud800licate"'),
    "lone surrogate in intent": raw({**REFUND, "intent": {"summary": "x"}}).replace(
        '"x"', '"\\udfff"'
    ),
    "version beyond bigint": raw({**REFUND, "resource": {**REFUND["resource"], "version": 2**63}}),
    "version beyond 2**53": raw({**REFUND, "resource": {**REFUND["resource"], "version": 2**53}}),
    "amount beyond schema": raw({**REFUND, "payload": {**REFUND["payload"], "amount": 10**30}}),
    "huge negative": raw({**REFUND, "context": {"n": -(10**400)}}),
    "expires_in beyond": raw({**REFUND, "expires_in": 10**20}),
    "deep intent": raw({**REFUND, "intent": nested(40)}),
    "deep context": raw({**REFUND, "context": nested(40)}),
    "deep payload": raw({**REFUND, "payload": nested(40)}),
    "very deep": "[" * 100_000 + "]" * 100_000,
    "NaN": raw(REFUND).replace("500", "NaN"),
    "Infinity": raw(REFUND).replace("500", "Infinity"),
    "duplicate member": raw(REFUND)[:-1] + ', "type": "ticket.create"}',
    "not utf-8": b'{"type": "\xff"}',
    "byte order mark": "\ufeff" + raw(REFUND),
    "a 5000-digit integer": raw(REFUND).replace("500", "9" * 5000),
}


@pytest.mark.parametrize("body", BAD_BODIES.values(), ids=BAD_BODIES.keys())
def test_bad_json_is_a_4xx_and_changes_nothing(agent, body, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1_000_000
    before = ledger()
    response = agent.client.generic(
        "POST",
        "/api/v1/commands",
        body.encode() if isinstance(body, str) else body,
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="k1",
    )
    assert 400 <= response.status_code < 500, response.content[:300]
    assert response["Content-Type"] == "application/problem+json"
    assert ledger() == before


def test_depth_32_is_accepted_and_33_is_not(agent):
    ok = agent.submit({**REFUND, "context": nested(31)}, "deep-ok")
    assert ok.status_code == 201, ok.content  # the body itself is one more level
    assert agent.submit({**REFUND, "context": nested(32)}, "deep-no").status_code == 400


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/effects/eff%00x",
        "/api/v1/effects/eff%00x/events",
        "/api/v1/effects?type=billing%00",
        "/api/v1/effects?owner=%00",
        "/api/v1/effects?context.run_id=r%00",
        "/api/v1/effects?status=CONFIRMED%00",
        "/api/v1/effects?cursor=%00",
        "/api/v1/sagas?status=%00",
        "/api/v1/capabilities/cap%00",
    ],
)
def test_nul_in_ids_and_filters_is_400(operator, path):
    response = operator.client.get(path)
    assert 400 <= response.status_code < 500, (path, response.status_code)


@pytest.mark.parametrize("charset", ["bogus", "utf-16", "latin-1"])
def test_a_charset_other_than_utf8_is_415(agent, charset):
    response = agent.client.generic(
        "POST",
        "/api/v1/commands",
        raw(REFUND).encode(),
        content_type=f"application/json; charset={charset}",
        HTTP_IDEMPOTENCY_KEY="k1",
    )
    assert response.status_code == 415
    assert Command.objects.count() == 0


def test_a_form_body_to_the_api_is_415(agent):
    response = agent.client.post("/api/v1/commands", {"type": "x"}, HTTP_IDEMPOTENCY_KEY="k1")
    assert response.status_code == 415
    assert Command.objects.count() == 0


def test_a_chunked_body_is_411(agent):
    response = agent.client.generic(
        "POST",
        "/api/v1/commands",
        raw(REFUND).encode(),
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="k1",
        HTTP_TRANSFER_ENCODING="chunked",
    )
    assert response.status_code == 411
    assert Command.objects.count() == 0


def test_two_idempotency_key_headers_are_400(agent):
    # A WSGI server joins repeated headers with a comma.
    response = agent.submit(REFUND, "refund:ord_1:v1, refund:ord_1:v2")
    assert response.status_code == 400
    assert "exactly one" in response.json()["detail"]
    assert Command.objects.count() == 0


def test_integers_beyond_the_columns_are_400_for_grants(admin, agent):
    for field in ("budget_count", "budget_amount", "expires_in"):
        body = {"principal": "refund-bot", "effect_types": ["ticket.*"], field: 2**63}
        response = admin.client.post("/api/v1/capabilities", body, format="json")
        assert response.status_code == 400, (field, response.content)
    assert Capability.objects.filter(principal__name="refund-bot", budget_count=2**63).count() == 0


def test_grant_numbers_past_a_column_or_a_date_are_400_not_500(admin, agent):
    # Each fits a 64-bit integer but not its column (budget_count is a 32-bit column) or
    # the calendar (a grant ending after the year 9999).
    before = Capability.objects.count()
    for field, value in (("budget_count", 2**31), ("expires_in", 10**12)):
        body = {"principal": "refund-bot", "effect_types": ["ticket.*"], field: value}
        response = admin.client.post("/api/v1/capabilities", body, format="json")
        assert response.status_code == 400, (field, response.content)
        assert field in response.json()["errors"]
    assert Capability.objects.count() == before


def test_the_console_and_the_admin_refuse_nul_without_a_500(db):
    client = Client()
    assert client.get("/?type=%00").status_code == 400
    assert client.get("/effects/eff%00").status_code == 400
    assert client.post("/login", {"username": "a\x00", "password": "b"}).status_code == 400
    response = client.post("/admin/login/", {"username": "root\x00", "password": "x"})
    assert response.status_code == 400


def test_a_signed_provider_webhook_with_bad_json_is_400(settings):
    settings.GATEWAY_WEBHOOK_SECRETS = {"tickets": "s3cret"}
    for body in (
        b'{"event_id": "e\\u0000", "operation": {}}',
        b'{"event_id": "\\ud800", "operation": {"id": "x", "status": "done"}}',
        ("[" * 50_000 + "]" * 50_000).encode(),
        b'{"event_id": "e1", "operation": {"id": "op", "status": "ok", "result": {"n": 1e999}}}',
    ):
        now = int(time.time())
        response = Client().post(
            "/hooks/providers/tickets",
            body,
            content_type="application/json",
            HTTP_X_GATEWAY_TIMESTAMP=str(now),
            HTTP_X_GATEWAY_SIGNATURE=sign("s3cret", now, body),
        )
        assert response.status_code == 400, (body[:40], response.status_code)


def test_the_hook_answers_bad_json_with_a_decision(agent):
    for body in ('{"tool_name": "Bash\\u0000"}', '{"tool_name": "\\ud800"}', "[" * 70_000):
        response = Client().post(
            "/hooks/claude-code/pre-tool-use",
            body,
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {agent.token}",
        )
        assert response.status_code == 200
        assert response.json()["hookSpecificOutput"]["permissionDecision"] == "ask"
