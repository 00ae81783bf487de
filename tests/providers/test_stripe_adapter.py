"""The Stripe adapter against a real Stripe-compatible server (stripe-stateful-mock, from npm),
with that server's own records, read through the official SDK, as the oracle.

What the server cannot do itself — commit and then lose the answer, fail with a 5xx after
committing, answer slower than the timeout, redirect, say 409 ``lock_timeout`` or 429 with
``Retry-After`` — comes from ``FaultProxy``, a test fault proxy on loopback in front of it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from http.client import HTTPConnection
from typing import Any

import pytest
import stripe

from gateway.choices import Outcome
from gateway.contracts import CONTRACTS
from gateway.providers.base import ExecuteRequest, LookupStatus
from gateway.providers.http import classify_operation
from gateway.providers.stripe import StripeAdapter
from tests.providers.stripe_mock import API_KEY, StripeMock, node_missing

pytestmark = pytest.mark.skipif(bool(node_missing()), reason=node_missing() or "node present")

CHARGE = CONTRACTS["billing.charge.create"]
REFUND = CONTRACTS["billing.refund.create"]


class FaultProxy:
    """A test fault proxy: HTTP on loopback in front of the Stripe mock, one request per
    connection. With no fault it forwards each request and its answer. A fault applies to
    writes (POST) only, so lookups through the same proxy still reach the server:

    - ``drop_before``: close the connection without forwarding (the server never saw it);
    - ``drop_after``: forward, let the server commit, close without the answer;
    - ``500_after``: forward, then answer 500 instead of the server's answer;
    - ``slow``: forward, then hold the answer for ``delay`` seconds (past the timeout);
    - ``answer``: do not forward; answer ``status`` with ``headers`` and ``body``.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.fault: str | None = None
        self.delay = 0.0
        self.answer: tuple[int, dict[str, str], bytes] = (200, {}, b"")
        self.forwarded_writes = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)  # accept() wakes up to see close()
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            conn.settimeout(10)
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            method, path, headers, body = _read_request(conn)
            fault = self.fault if method == "POST" else None
            if fault == "drop_before":
                return
            if fault == "answer":
                status, extra, content = self.answer
                conn.sendall(_response(status, extra, content))
                return
            upstream = HTTPConnection("127.0.0.1", self.upstream_port, timeout=10)
            upstream.request(method, path, body=body, headers=headers)
            answer = upstream.getresponse()
            content = answer.read()
            upstream.close()
            if method == "POST":
                self.forwarded_writes += 1
            if fault == "drop_after":
                return
            if fault == "500_after":
                error = {"error": {"type": "api_error", "message": "test fault proxy: 500"}}
                conn.sendall(_response(500, {}, json.dumps(error).encode()))
                return
            if fault == "slow":
                time.sleep(self.delay)
            kept = {k: v for k, v in answer.getheaders() if k.lower() not in _HOP_HEADERS}
            with contextlib.suppress(OSError):  # the client may have given up (the slow fault)
                conn.sendall(_response(answer.status, kept, content))


_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length"}


def _read_request(conn: socket.socket) -> tuple[str, str, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.lower() not in _HOP_HEADERS and name.lower() != "host":
            headers[name] = value.strip()
        if name.lower() == "content-length":
            length = int(value)
            while len(body) < length:
                body += conn.recv(65536)
    return method, path, headers, body


def _response(status: int, headers: dict[str, str], body: bytes) -> bytes:
    head = f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return head.encode("latin-1") + b"\r\n" + body


# --- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[StripeMock]:
    mock = StripeMock()
    mock.start()
    try:
        yield mock
    finally:
        mock.stop()


@pytest.fixture
def proxy(server: StripeMock) -> Iterator[FaultProxy]:
    fault_proxy = FaultProxy(server.port)
    try:
        yield fault_proxy
    finally:
        fault_proxy.close()


@pytest.fixture(scope="module")
def oracle(server: StripeMock) -> stripe.StripeClient:
    """The server's own records, read with the official SDK straight from the server."""
    return stripe.StripeClient(API_KEY, base_addresses={"api": server.url})


def _adapter(url: str, contract=CHARGE, **kwargs: Any) -> StripeAdapter:
    kwargs.setdefault("timeout", 5.0)
    kwargs.setdefault("default_source", "tok_visa")
    return StripeAdapter(api_base=url, api_key=API_KEY, contract=contract, **kwargs)


def _charge(key: str | None = None, **payload: Any) -> ExecuteRequest:
    body = {"amount": 4999, "currency": "EUR", "customer_id": "cus_42", **payload}
    return ExecuteRequest(
        effect_id=str(uuid.uuid4()),
        type=CHARGE.type,
        idempotency_key=key or f"acme:{uuid.uuid4()}",
        resource={"type": "order", "id": "ord_881", "version": 17},
        payload=body,
        payload_digest=f"sha256:{uuid.uuid4().hex}",
        timeout=5.0,
    )


def _refund(charge_id: str, key: str | None = None, **payload: Any) -> ExecuteRequest:
    body = {"amount": 500, "currency": "EUR", "reason": "duplicate charge", **payload}
    return dataclasses.replace(
        _charge(key),
        type=REFUND.type,
        payload={**body, "charge_id": charge_id},
    )


def _charges(oracle: stripe.StripeClient, key: str) -> list[Any]:
    every = oracle.v1.charges.list(params={"limit": 100}).auto_paging_iter()
    return [c for c in every if c.metadata.to_dict().get("idempotency_key") == key]


def _refunds(oracle: stripe.StripeClient, key: str) -> list[Any]:
    every = oracle.v1.refunds.list(params={"limit": 100}).auto_paging_iter()
    return [r for r in every if r.metadata.to_dict().get("idempotency_key") == key]


# --- charges ----------------------------------------------------------------------------------


def test_charge_with_a_good_card_is_confirmed_once(server, oracle):
    request = _charge()
    result = _adapter(server.url).execute(request)

    assert result.outcome == Outcome.CONFIRMED, result
    [charge] = _charges(oracle, request.idempotency_key)
    assert charge.status == "succeeded" and charge.amount == 4999 and charge.currency == "eur"
    assert charge.metadata.to_dict() == {
        "effect_id": request.effect_id,
        "effect_type": CHARGE.type,
        "payload_digest": request.payload_digest,
        "idempotency_key": request.idempotency_key,
        "customer_id": "cus_42",
    }
    assert result.operation is not None and result.operation.id == charge.id
    assert result.operation.payload_digest == request.payload_digest
    assert result.operation.result["charge_id"] == charge.id
    assert (result.operation.result["amount"], result.operation.result["currency"]) == (4999, "EUR")


def test_same_key_again_replays_the_same_charge(server, oracle):
    request = _charge()
    adapter = _adapter(server.url)
    first, second = adapter.execute(request), adapter.execute(request)

    assert first.outcome == second.outcome == Outcome.CONFIRMED
    assert first.operation and second.operation and first.operation.id == second.operation.id
    assert len(_charges(oracle, request.idempotency_key)) == 1


def test_same_key_other_amount_is_a_mismatch_never_confirmed(server, oracle):
    request = _charge()
    adapter = _adapter(server.url)
    assert adapter.execute(request).outcome == Outcome.CONFIRMED

    other = dataclasses.replace(request, payload={**request.payload, "amount": 5001})
    result = adapter.execute(other)

    assert result.mismatch and result.outcome != Outcome.CONFIRMED
    assert result.http_status == 400 and "same parameters" in result.error
    [charge] = _charges(oracle, request.idempotency_key)
    assert charge.amount == 4999


def test_declined_card_is_rejected_with_stripes_message(server, oracle):
    request = _charge(source="tok_chargeDeclined")
    adapter = _adapter(server.url)
    result = adapter.execute(request)

    assert result.outcome == Outcome.REJECTED and result.http_status == 402
    assert "Your card was declined." in result.reason and "card_declined" in result.error
    charges = _charges(oracle, request.idempotency_key)
    assert [c.status for c in charges] == ["failed"]  # Stripe keeps the declined attempt

    # Looked up later, the declined charge proves the same: refused, not lost.
    found = adapter.lookup(idempotency_key=request.idempotency_key, timeout=5)
    assert found.status == LookupStatus.FOUND and found.operation is not None
    verdict = classify_operation(found.operation, expected_digest=request.payload_digest)
    assert verdict.outcome == Outcome.REJECTED


def test_invalid_request_is_rejected_with_stripes_message(server, oracle):
    request = _charge(amount=10)  # under Stripe's 50-cent minimum
    result = _adapter(server.url).execute(request)

    assert result.outcome == Outcome.REJECTED and result.http_status == 400
    assert "Amount must be at least" in result.reason
    assert _charges(oracle, request.idempotency_key) == []


def test_rate_limited_is_not_started(server, oracle):
    request = _charge(source="tok_429")  # the mock answers 429 before charging
    result = _adapter(server.url).execute(request)

    assert result.outcome == Outcome.NOT_STARTED and result.http_status == 429
    assert _charges(oracle, request.idempotency_key) == []


def test_500_before_commit_is_unknown_and_the_key_finds_nothing(server, oracle):
    request = _charge(source="tok_500")  # the mock answers 500 before charging
    adapter = _adapter(server.url)
    result = adapter.execute(request)

    assert result.outcome == Outcome.UNKNOWN and result.http_status == 500
    assert adapter.lookup(idempotency_key=request.idempotency_key, timeout=5).status == (
        LookupStatus.NOT_FOUND
    )
    assert _charges(oracle, request.idempotency_key) == []


def test_server_down_is_not_started_with_nothing_sent(server, oracle):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]  # bound, never listening: connections refused
        request = _charge()
        adapter = _adapter(f"http://127.0.0.1:{closed_port}")
        result = adapter.execute(request)
        lookup = adapter.lookup(idempotency_key=request.idempotency_key, timeout=2)

    assert result.outcome == Outcome.NOT_STARTED, result
    assert "could not connect" in result.reason and "Connection refused" in result.error
    assert lookup.status == LookupStatus.UNREACHABLE
    assert _charges(oracle, request.idempotency_key) == []


# --- refunds ----------------------------------------------------------------------------------


def _confirmed_charge(server: StripeMock) -> str:
    result = _adapter(server.url).execute(_charge())
    assert result.outcome == Outcome.CONFIRMED and result.operation is not None
    return result.operation.id


def test_refund_of_a_charge_is_confirmed_once(server, oracle):
    charge_id = _confirmed_charge(server)
    request = _refund(charge_id)
    adapter = _adapter(server.url, contract=REFUND)
    first, replay = adapter.execute(request), adapter.execute(request)

    assert first.outcome == replay.outcome == Outcome.CONFIRMED, first
    [refund] = _refunds(oracle, request.idempotency_key)
    assert refund.charge == charge_id and refund.amount == 500 and refund.status == "succeeded"
    assert first.operation and replay.operation and first.operation.id == replay.operation.id
    assert first.operation.id == refund.id
    assert first.operation.result["refund_id"] == refund.id
    assert first.operation.result["charge_id"] == charge_id
    assert oracle.v1.charges.retrieve(charge_id).amount_refunded == 500


def test_refund_in_another_currency_is_refused_before_sending(server, oracle):
    request = _refund(_confirmed_charge(server), currency="USD")
    result = _adapter(server.url, contract=REFUND).execute(request)

    assert result.outcome == Outcome.REJECTED and "nothing was sent" in result.reason
    assert _refunds(oracle, request.idempotency_key) == []


def test_refund_of_a_charge_stripe_does_not_have_is_rejected(server, oracle):
    request = _refund("ch_doesnotexist")
    result = _adapter(server.url, contract=REFUND).execute(request)

    assert result.outcome == Outcome.REJECTED and "No such charge" in result.reason
    assert _refunds(oracle, request.idempotency_key) == []


# --- lookups ----------------------------------------------------------------------------------


def test_lookup_by_operation_id_and_by_key_find_charge_and_refund(server, oracle):
    charge_request = _charge()
    charges = _adapter(server.url)
    charge = charges.execute(charge_request).operation
    refund_request = _refund(charge.id if charge else "")
    refunds = _adapter(server.url, contract=REFUND)
    refund = refunds.execute(refund_request).operation
    assert charge is not None and refund is not None

    for adapter, request, operation in (
        (charges, charge_request, charge),
        (refunds, refund_request, refund),
    ):
        by_id = adapter.lookup(
            idempotency_key=request.idempotency_key,
            provider_operation_id=operation.id,
            timeout=5,
        )
        by_key = adapter.lookup(idempotency_key=request.idempotency_key, timeout=5)
        for found in (by_id, by_key):
            assert found.status == LookupStatus.FOUND and found.operation is not None
            assert found.operation.id == operation.id
            assert found.operation.payload_digest == request.payload_digest
            assert found.operation.status == "succeeded"


def test_lookup_of_a_key_never_used_is_not_found(server):
    for contract in (CHARGE, REFUND):
        adapter = _adapter(server.url, contract=contract)
        assert adapter.lookup(idempotency_key="acme:never-used", timeout=5).status == (
            LookupStatus.NOT_FOUND
        )


def test_lookup_of_an_id_stripe_does_not_have_is_not_found(server):
    adapter = _adapter(server.url)
    found = adapter.lookup(idempotency_key="k", provider_operation_id="ch_missing", timeout=5)
    assert found.status == LookupStatus.NOT_FOUND and found.http_status == 404


def test_two_objects_with_one_key_are_a_mismatch_not_a_pick(server, oracle):
    key = f"acme:{uuid.uuid4()}"
    for _ in range(2):  # made outside the gateway, each with its own Stripe key
        oracle.v1.charges.create(
            params={
                "amount": 700,
                "currency": "eur",
                "source": "tok_visa",
                "metadata": {"idempotency_key": key, "payload_digest": "sha256:x"},
            }
        )
    found = _adapter(server.url).lookup(idempotency_key=key, timeout=5)

    assert found.status == LookupStatus.FOUND and found.operation is not None
    assert "ambiguous: 2 objects" in found.operation.payload_digest
    assert classify_operation(found.operation, expected_digest="sha256:x").mismatch


def test_a_scan_that_cannot_see_the_whole_window_proves_nothing(server, oracle, monkeypatch):
    monkeypatch.setattr("gateway.providers.stripe._PAGE", 1)
    for _ in range(2):
        _confirmed_charge(server)  # at least two charges in the window
    found = _adapter(server.url, lookup_max_pages=1).lookup(idempotency_key="acme:x", timeout=5)
    assert found.status == LookupStatus.UNREACHABLE and "could not see them all" in found.error


# --- faults the server cannot make, through the test fault proxy -----------------------------


@pytest.mark.parametrize("fault", ["drop_after", "500_after", "slow"])
def test_lost_answer_after_commit_is_unknown_then_found_once(server, oracle, proxy, fault):
    proxy.fault, proxy.delay = fault, 2.0
    request = dataclasses.replace(_charge(), timeout=1.0)  # the call's own, under the adapter's 5
    adapter = _adapter(proxy.url)
    result = adapter.execute(request)

    assert result.outcome == Outcome.UNKNOWN and not result.mismatch, result
    assert proxy.forwarded_writes == 1
    proxy.fault = None
    found = adapter.lookup(idempotency_key=request.idempotency_key, timeout=5)
    assert found.status == LookupStatus.FOUND and found.operation is not None
    [charge] = _charges(oracle, request.idempotency_key)
    assert found.operation.id == charge.id
    assert found.operation.payload_digest == request.payload_digest

    # Sent again with the same key, Stripe replays the charge: still exactly one.
    again = adapter.execute(request)
    assert again.outcome == Outcome.CONFIRMED and again.operation is not None
    assert again.operation.id == charge.id
    assert len(_charges(oracle, request.idempotency_key)) == 1


def test_request_lost_before_the_server_is_unknown_then_not_found(server, oracle, proxy):
    proxy.fault = "drop_before"
    request = _charge()
    adapter = _adapter(proxy.url)
    result = adapter.execute(request)

    # The connection was open and the request written: the adapter cannot know it was lost.
    assert result.outcome == Outcome.UNKNOWN
    proxy.fault = None
    lookup = adapter.lookup(idempotency_key=request.idempotency_key, timeout=5)
    assert lookup.status == LookupStatus.NOT_FOUND
    assert _charges(oracle, request.idempotency_key) == []


@pytest.mark.parametrize(
    ("status", "headers", "error", "outcome"),
    [
        (409, {}, {"type": "invalid_request_error", "code": "lock_timeout"}, Outcome.NOT_STARTED),
        (409, {}, {"type": "invalid_request_error", "code": "other"}, Outcome.UNKNOWN),
        (429, {"Retry-After": "7"}, {"type": "rate_limit_error"}, Outcome.NOT_STARTED),
        (401, {}, {"type": "invalid_request_error"}, Outcome.NOT_STARTED),
        (503, {}, {"type": "api_error"}, Outcome.UNKNOWN),
        (307, {"Location": "http://127.0.0.1:9/v1/charges"}, {}, Outcome.UNKNOWN),
    ],
)
def test_stripe_answers_that_are_not_results(
    server, oracle, proxy, status, headers, error, outcome
):
    body = json.dumps({"error": {"message": "from the test fault proxy", **error}}).encode()
    proxy.fault, proxy.answer = "answer", (status, headers, body)
    request = _charge()
    result = _adapter(proxy.url).execute(request)

    assert result.outcome == outcome and result.http_status == status, result
    assert not result.mismatch
    if "Retry-After" in headers:
        assert "Retry-After: 7" in result.reason
    # Nothing reached the server: a redirect in particular is never followed.
    assert proxy.forwarded_writes == 0
    assert _charges(oracle, request.idempotency_key) == []


# --- configuration ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"api_base": "ftp://stripe.example"},
        {"api_key": ""},
        {"timeout": 0},
        {"contract": CONTRACTS["ticket.create"]},
    ],
)
def test_bad_configuration_is_a_clear_error(kwargs):
    arguments: dict[str, Any] = {"api_base": "https://api.stripe.com", "api_key": "rk_test_x"}
    with pytest.raises(ValueError):
        StripeAdapter(**{**arguments, **kwargs})


def test_a_type_it_does_not_serve_is_refused_without_sending(server, oracle):
    request = dataclasses.replace(_charge(), type="ticket.create")
    result = _adapter(server.url).execute(request)
    assert result.outcome == Outcome.REJECTED and "does not serve" in result.reason
    assert _charges(oracle, request.idempotency_key) == []


def test_charge_customer_charges_the_stripe_customers_card(server, oracle):
    customer = oracle.v1.customers.create(params={"source": "tok_visa"})
    adapter = StripeAdapter(
        api_base=server.url, api_key=API_KEY, contract=CHARGE, charge_customer=True
    )
    request = _charge(customer_id=customer.id)
    result = adapter.execute(request)

    assert result.outcome == Outcome.CONFIRMED, result
    [charge] = _charges(oracle, request.idempotency_key)
    assert charge.source.id == customer.default_source
    assert charge.metadata.to_dict()["customer_id"] == customer.id


def test_charge_customer_that_stripe_does_not_have_is_rejected(server, oracle):
    adapter = StripeAdapter(
        api_base=server.url, api_key=API_KEY, contract=CHARGE, charge_customer=True
    )
    request = _charge(customer_id="cus_missing")
    result = adapter.execute(request)

    assert result.outcome == Outcome.REJECTED and "No such customer" in result.reason, result
    assert _charges(oracle, request.idempotency_key) == []


# --- through the gateway: dispatch, receipt, reconciliation ------------------------------------


@pytest.fixture
def route_billing_to(monkeypatch):
    """Serve the billing contracts with a StripeAdapter at ``url`` (what the provider
    configuration does in a deployment), in the dispatcher and the reconciler."""
    from gateway import services
    from reconciliation.services import reconciler

    def route(url: str, **kwargs: Any) -> None:
        def adapter_for(contract, credential=None):
            return _adapter(url, contract=contract, **kwargs)

        monkeypatch.setattr(services, "adapter_for", adapter_for)
        monkeypatch.setattr(reconciler, "adapter_for", adapter_for)

    return route


def _submit_and_dispatch(persona, body: dict, key: str):
    from gateway import services
    from gateway.models import Effect

    response = persona.submit(body, key)
    assert response.status_code == 201, response.json()
    effect_id = response.json()["effect_id"]
    services.effect_dispatch(effect_id=effect_id, worker="test")
    return Effect.objects.select_related("command").get(pk=effect_id)


_CHARGE_BODY = {
    "type": CHARGE.type,
    "resource": {"type": "order", "id": "ord_881", "version": 17},
    "payload": {"amount": 4999, "currency": "EUR", "customer_id": "cus_42"},
    "intent": {"summary": "charge the order"},
}


@pytest.mark.django_db
def test_gateway_charge_then_refund_are_confirmed_with_stripes_ids(
    server, oracle, agent, route_billing_to
):
    from gateway.models import Receipt

    route_billing_to(server.url)
    charge_effect = _submit_and_dispatch(agent, _CHARGE_BODY, f"c-{uuid.uuid4()}")

    assert charge_effect.status == "CONFIRMED"
    [charge] = _charges(oracle, charge_effect.command.provider_key)
    receipt = Receipt.objects.get(effect=charge_effect)
    assert receipt.provider_operation_id == charge.id == charge_effect.provider_operation_id
    assert receipt.digest_matches is True
    assert charge.metadata.to_dict()["effect_id"] == str(charge_effect.pk)

    refund_body = {
        **_CHARGE_BODY,
        "type": REFUND.type,
        "payload": {"amount": 500, "currency": "EUR", "reason": "x", "charge_id": charge.id},
    }
    refund_effect = _submit_and_dispatch(agent, refund_body, f"r-{uuid.uuid4()}")
    assert refund_effect.status == "CONFIRMED"
    [refund] = _refunds(oracle, refund_effect.command.provider_key)
    assert refund.id == refund_effect.provider_operation_id and refund.charge == charge.id


@pytest.mark.django_db
def test_gateway_500_after_commit_is_settled_by_lookup_with_one_charge(
    server, oracle, proxy, agent, route_billing_to
):
    route_billing_to(proxy.url)
    proxy.fault = "500_after"
    effect = _submit_and_dispatch(agent, _CHARGE_BODY, f"c-{uuid.uuid4()}")

    # The 5xx was followed by a lookup by key, which found the committed charge.
    assert effect.status == "CONFIRMED"
    [charge] = _charges(oracle, effect.command.provider_key)
    assert effect.provider_operation_id == charge.id


@pytest.mark.django_db
def test_gateway_lost_answer_is_unknown_then_reconciled_with_one_charge(
    server, oracle, proxy, agent, route_billing_to
):
    from reconciliation.services.reconciler import effect_reconcile

    route_billing_to(proxy.url)
    proxy.fault = "drop_after"
    effect = _submit_and_dispatch(agent, _CHARGE_BODY, f"c-{uuid.uuid4()}")
    assert effect.status == "UNKNOWN"

    proxy.fault = None
    effect_reconcile(effect_id=effect.pk)
    effect.refresh_from_db()
    assert effect.status == "CONFIRMED"
    [charge] = _charges(oracle, effect.command.provider_key)
    assert effect.provider_operation_id == charge.id


@pytest.mark.django_db
def test_gateway_declined_card_is_rejected(server, oracle, agent, route_billing_to):
    route_billing_to(server.url, default_source="tok_chargeDeclined")
    effect = _submit_and_dispatch(agent, _CHARGE_BODY, f"c-{uuid.uuid4()}")

    assert effect.status == "REJECTED"
    assert [c.status for c in _charges(oracle, effect.command.provider_key)] == ["failed"]
