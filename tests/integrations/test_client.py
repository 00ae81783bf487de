"""gateway.client against a running gateway (live_server) and the real sandbox provider."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from gateway.client import (
    Conflict,
    GatewayClient,
    GatewayUnavailable,
    IdempotencyKeyMismatch,
    NotFound,
    NotPermitted,
    RateLimited,
    ValidationFailed,
    deterministic_key,
)
from gateway.contracts import CONTRACTS
from gateway.models import ApiToken, Command

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
ORDER = {"type": "order", "id": "ord_881", "version": 17}
REFUND = {"amount": 500, "currency": "EUR", "reason": "duplicate charge"}
QUEUE = {"type": "queue", "id": "support"}
TICKET = {"title": "Printer on fire", "priority": "P2"}


def test_importing_the_client_loads_neither_django_nor_celery():
    code = (
        "import sys, gateway.client, gateway.mcp_server, gateway.langgraph_tools; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'celery')); "
        "assert not bad, bad"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_submit_twice_with_one_key_is_one_effect_and_one_provider_operation(
    connect, agent, sandbox, eager_tasks
):
    client = connect(agent)
    key = deterministic_key("billing.refund.create", "ord_881", "incident_120", "v1")
    first = client.submit(
        "billing.refund.create",
        ORDER,
        REFUND,
        key=key,
        context={"runtime": "python", "run_id": "run-1"},
    )
    again = client.submit(
        "billing.refund.create",
        ORDER,
        REFUND,
        key=key,
        context={"runtime": "python", "run_id": "run-1"},
    )
    assert first.replayed is False
    assert again.replayed is True
    assert again.effect_id == first.effect_id
    assert client.wait(first.effect_id, timeout=10).status == "CONFIRMED"
    command = Command.objects.get(pk=first.effect_id)
    assert len(sandbox.operations(idempotency_key=command.provider_key)) == 1
    assert first.context == {"runtime": "python", "run_id": "run-1"}


def test_wait_answers_at_once_for_an_effect_that_moved_on_since_the_client_looked(
    connect, agent, sandbox, eager_tasks, monkeypatch
):
    # The race of every wait: the client reads PREPARED, the effect is CONFIRMED a few
    # milliseconds later, then the long poll arrives. A poll relative to the status on arrival
    # waited the whole poll for a further change; relative to the status the client saw
    # (``seen``), it answers at once.
    client = connect(agent)
    submitted = client.submit("ticket.create", QUEUE, TICKET, key="ticket.create:support:race:v1")
    assert submitted.status == "PREPARED"  # the answer; dispatched (eagerly) once committed
    monkeypatch.setattr(client, "get", lambda effect_id: submitted)  # the client's stale look
    started = time.monotonic()
    done = client.wait(submitted.effect_id, timeout=8)
    assert done.status == "CONFIRMED"
    assert time.monotonic() - started < 4  # not the 8 s poll


def test_waiting_on_the_submitted_effect_starts_from_its_status(
    connect, agent, sandbox, eager_tasks
):
    # wait(effect) starts from the status submit answered: one long poll, no first look.
    client = connect(agent)
    sent: list[str] = []
    client._http.event_hooks["request"].append(lambda request: sent.append(str(request.url)))
    submitted = client.submit("ticket.create", QUEUE, TICKET, key="ticket.create:support:w:v1")
    assert submitted.status == "PREPARED"  # the answer; dispatched (eagerly) once committed
    done = client.wait(submitted, timeout=8)
    assert done.status == "CONFIRMED" and done.effect_id == submitted.effect_id
    looks = [url for url in sent if "/api/v1/effects/" in url]
    assert len(looks) == 1 and "seen=PREPARED" in looks[0], looks
    # Until settled, past any status in between: one long poll for the whole way.
    assert "until=CANCELLED%2CCOMPENSATED%2CCOMPENSATION_FAILED%2CCONFIRMED" in looks[0], looks


def test_same_key_other_payload_raises_key_mismatch_saying_the_fix(connect, agent, sandbox):
    client = connect(agent)
    client.submit("ticket.create", QUEUE, TICKET, key="ticket.create:support:printer:v1")
    with pytest.raises(IdempotencyKeyMismatch) as caught:
        client.submit(
            "ticket.create",
            QUEUE,
            {**TICKET, "priority": "P1"},
            key="ticket.create:support:printer:v1",
        )
    assert caught.value.status == 422
    assert "send the identical payload" in str(caught.value)
    assert "use a new key" in str(caught.value)
    assert Command.objects.count() == 1


def test_an_invalid_payload_raises_validation_failed_with_the_field_errors(connect, agent):
    client = connect(agent)
    with pytest.raises(ValidationFailed) as caught:
        client.submit("billing.refund.create", ORDER, {**REFUND, "amount": -5}, key="r:bad")
    assert "payload.amount" in caught.value.errors
    assert "payload.amount" in str(caught.value)


def test_approval_flow_through_the_client(connect, agent, approver, sandbox, eager_tasks):
    bot, alice = connect(agent), connect(approver)
    effect = bot.submit(
        "billing.refund.create",
        ORDER,
        {**REFUND, "amount": 15_000},
        key="billing.refund.create:ord_881:big:v1",
    )
    assert effect.status == "AWAITING_APPROVAL"
    assert effect.approval["required"] is True
    with pytest.raises(NotPermitted):
        bot.approve(effect.effect_id, effect.payload_digest)
    with pytest.raises(Conflict):
        alice.approve(effect.effect_id, "sha256:" + "0" * 64)
    assert bot.wait(effect.effect_id, timeout=0.2).status == "AWAITING_APPROVAL"
    alice.approve(effect.effect_id, effect.payload_digest, "checked the incident")
    assert bot.wait(effect.effect_id, timeout=10).status == "CONFIRMED"
    assert len(sandbox.operations(type="billing.refund.create")) == 1


def test_a_machine_approves_with_its_ed25519_key_through_the_client(
    connect, agent, admin, sandbox, eager_tasks, signed_approvals
):
    from gateway.lib.approval_challenge import unb64url
    from tests.conftest import Persona
    from tests.support.authenticator import MachineKey

    machine, key = Persona("acme", "approve-bot", "approver"), MachineKey()
    registered = admin.client.post(
        "/api/v1/signing-keys",
        {"principal": "approve-bot", "public_key": key.public},
        format="json",
    ).json()
    bot, approver = connect(agent), connect(machine)
    effect = bot.submit("billing.refund.create", ORDER, {**REFUND, "amount": 15_000}, key="big")
    with pytest.raises(NotPermitted):
        approver.approve(effect.effect_id, effect.payload_digest)  # unsigned: refused
    challenge = approver.approval_challenge(effect.effect_id)
    approver.approve(
        effect.effect_id,
        challenge["payload_digest"],
        signature={
            "nonce": challenge["nonce"],
            "key_id": registered["credential_id"],
            "signature": key.sign(unb64url(challenge["challenge"])),
        },
    )
    assert bot.wait(effect.effect_id, timeout=10).status == "CONFIRMED"
    assert len(sandbox.operations(type="billing.refund.create")) == 1


def test_unknown_effect_is_not_found(connect, agent):
    with pytest.raises(NotFound):
        connect(agent).get("eff_DOESNOTEXIST")


def test_effect_types_carry_the_contracts_schemas(connect, agent):
    types = {t.type: t for t in connect(agent).effect_types()}
    assert set(types) == set(CONTRACTS)
    refund = types["billing.refund.create"]
    assert refund.payload_schema == CONTRACTS["billing.refund.create"].payload_schema
    assert refund.financial and refund.irreversible
    assert refund.tool_name == "billing_refund_create"


def test_compensate_issues_the_compensator_once(connect, agent, approver, sandbox, eager_tasks):
    client = connect(agent)
    charge = client.submit(
        "billing.charge.create",
        ORDER,
        {"amount": 600_000, "currency": "EUR", "customer_id": "cus_42"},
        key="billing.charge.create:ord_881:big:v1",
    )
    connect(approver).approve(charge.effect_id, charge.payload_digest)
    assert client.wait(charge.effect_id, timeout=10).status == "CONFIRMED"
    compensation = client.compensate(charge.effect_id, "charged twice")
    again = client.compensate(charge.effect_id, "charged twice")
    assert compensation.type == "billing.refund.create"
    assert compensation.replayed is False
    # The refund of 6,000.00 waits for its own approval; asking again replays it.
    assert again.effect_id == compensation.effect_id and again.replayed is True
    assert client.get(charge.effect_id).status == "COMPENSATING"


def test_list_filters_by_status_type_and_run(connect, agent, sandbox, eager_tasks):
    client = connect(agent)
    a = client.submit(
        "ticket.create", QUEUE, TICKET, key="t:a", context={"runtime": "python", "run_id": "run-a"}
    )
    b = client.submit(
        "ticket.create",
        QUEUE,
        {**TICKET, "title": "b"},
        key="t:b",
        context={"runtime": "python", "run_id": "run-b"},
    )
    big = client.submit(
        "billing.refund.create",
        ORDER,
        {**REFUND, "amount": 50_000},
        key="r:big",
        context={"runtime": "python", "run_id": "run-b"},
    )
    assert [e.effect_id for e in client.list(context={"run_id": "run-a"}).results] == [a.effect_id]
    run_b = client.list(context={"run_id": "run-b"}).results
    assert [e.effect_id for e in run_b] == [big.effect_id, b.effect_id]
    assert [e.effect_id for e in client.list(status="AWAITING_APPROVAL").results] == [big.effect_id]
    page = client.list(type="ticket.create", limit=1)
    assert [e.effect_id for e in page.results] == [b.effect_id]
    rest = client.list(type="ticket.create", limit=1, cursor=page.next_cursor)
    assert [e.effect_id for e in rest.results] == [a.effect_id]
    with pytest.raises(ValueError):
        client.list(context={"payload": "x"})


class Flaky(httpx.BaseTransport):
    """Forwards to the real gateway, but fails the first requests the way networks do."""

    def __init__(self, failures: list[str]) -> None:
        self.failures = failures
        self.real = httpx.HTTPTransport()
        self.keys: list[str | None] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.keys.append(request.headers.get("Idempotency-Key"))
        failure = self.failures.pop(0) if self.failures else None
        if failure == "connect":
            raise httpx.ConnectError("connection refused", request=request)
        if failure == "503":
            return httpx.Response(503, json={"status": 503, "detail": "busy"})
        if failure == "429":
            return httpx.Response(
                429,
                headers={"Retry-After": "0"},
                json={"type": ".../rate-limited", "status": 429, "detail": "slow down"},
            )
        response = self.real.handle_request(request)
        if failure == "lost-answer":
            # The gateway processed the request; its answer never arrives.
            response.read()
            raise httpx.ReadError("connection reset by peer", request=request)
        return response


def test_retries_resend_the_same_key_and_a_lost_answer_replays(
    gateway_url, agent, sandbox, eager_tasks
):
    transport = Flaky(["connect", "503", "lost-answer", "429"])
    with GatewayClient(gateway_url, agent.token, transport=transport, backoff=0.01) as client:
        effect = client.submit("ticket.create", QUEUE, TICKET, key="ticket.create:support:f:v1")
    assert transport.keys == ["ticket.create:support:f:v1"] * 5
    # The third try was recorded; the fifth was answered with that same effect.
    assert effect.replayed is True
    command = Command.objects.get(idempotency_key="ticket.create:support:f:v1")
    assert command.effect_id == effect.effect_id
    assert len(sandbox.operations(idempotency_key=command.provider_key)) == 1


def test_approve_is_not_resent_after_a_lost_answer(gateway_url, approver):
    transport = Flaky(["lost-answer"])
    client = GatewayClient(gateway_url, approver.token, transport=transport, backoff=0.01)
    with pytest.raises(GatewayUnavailable):
        client.approve("eff_X", "sha256:" + "0" * 64)
    assert len(transport.keys) == 1


def test_rate_limited_after_the_retries(gateway_url, agent):
    transport = Flaky(["429", "429", "429"])
    client = GatewayClient(gateway_url, agent.token, transport=transport, retries=2, backoff=0.01)
    with pytest.raises(RateLimited) as caught:
        client.get("eff_X")
    assert caught.value.retry_after == 0
    assert len(transport.keys) == 3


def test_unreachable_gateway_is_gateway_unavailable():
    client = GatewayClient("http://127.0.0.1:9", "egw_x", retries=1, backoff=0.01, timeout=1)
    with pytest.raises(GatewayUnavailable):
        client.submit("ticket.create", QUEUE, TICKET, key="k:1")


def test_a_revoked_token_is_authentication_failed(connect, agent):
    from django.utils import timezone

    from gateway.client import AuthenticationFailed

    ApiToken.objects.update(revoked_at=timezone.now())
    with pytest.raises(AuthenticationFailed):
        connect(agent).get("eff_X")


def test_deterministic_key_is_stable_and_refuses_non_business_parts():
    assert deterministic_key("billing.refund.create", "ord_881", "incident 120", 1) == (
        "billing.refund.create:ord_881:incident-120:1"
    )
    long = deterministic_key("t", "x" * 400)
    assert len(long) <= 255 and long == deterministic_key("t", "x" * 400)
    assert long != deterministic_key("t", "x" * 399)
    for bad in (None, "", uuid.uuid4()):
        with pytest.raises(ValueError):
            deterministic_key("ticket.create", bad)
    with pytest.raises(ValueError):
        deterministic_key("ticket.create")
