"""The declared REST adapter against two real HTTP servers of different shapes, each declared by
the example files of docs/guides/providers/examples. The servers' own records are the oracle:
every outcome is checked against what the provider holds (one operation, or none, never two).
"""

from __future__ import annotations

import json
import socket
import ssl
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.choices import Outcome
from gateway.lib.digest import payload_digest
from gateway.providers.base import ExecuteRequest, LookupStatus
from gateway.providers.http import classify_operation
from gateway.providers.rest import RestProviderAdapter
from gateway.providers.rest_spec import RestSpec
from tests.providers.rest_servers import DeploysServer, TicketsServer, self_signed_certificate

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "guides" / "providers" / "examples"
TOKEN = "test-token"


@pytest.fixture
def tickets() -> Iterator[TicketsServer]:
    server = TicketsServer(token=TOKEN).start()
    yield server
    server.stop()


@pytest.fixture
def deploys() -> Iterator[DeploysServer]:
    server = DeploysServer().start()
    yield server
    server.stop()


def tickets_adapter(server: TicketsServer, token: str = TOKEN) -> RestProviderAdapter:
    spec = RestSpec.from_file(EXAMPLES / "tickets.json")
    return RestProviderAdapter(spec, server.url, headers={"Authorization": f"Bearer {token}"})


def deploys_adapter(url: str) -> RestProviderAdapter:
    return RestProviderAdapter(RestSpec.from_file(EXAMPLES / "deployments.json"), url)


def ticket_request(timeout: float = 5.0, **payload: Any) -> ExecuteRequest:
    payload = payload or {"title": "Printer on fire", "priority": "P2", "body": "Smoke."}
    resource = {"type": "queue", "id": "support"}
    effect_id = str(uuid.uuid4())
    return ExecuteRequest(
        effect_id=effect_id,
        type="ticket.create",
        idempotency_key=f"tickets:{effect_id}",
        resource=resource,
        payload=payload,
        payload_digest=payload_digest(type="ticket.create", resource=resource, payload=payload),
        timeout=timeout,
    )


def deploy_request(timeout: float = 5.0, service: str = "catalog", sha: str = "a1b2c3d4e5f6"):
    payload = {"environment": "staging", "sha": sha, "release": "2026.12.04-1"}
    resource = {"type": "service", "id": service, "version": 41}
    effect_id = str(uuid.uuid4())
    kind = "deployment.release.promote"
    return ExecuteRequest(
        effect_id=effect_id,
        type=kind,
        idempotency_key=f"deploy:{effect_id}",
        resource=resource,
        payload=payload,
        payload_digest=payload_digest(type=kind, resource=resource, payload=payload),
        timeout=timeout,
    )


def judged(lookup, request: ExecuteRequest):
    """How the reconciler judges a found operation (gateway.providers.http.classify_operation)."""
    assert lookup.status == LookupStatus.FOUND, lookup
    return classify_operation(lookup.operation, expected_digest=request.payload_digest)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- tickets: an API with an Idempotency-Key header ---------------------------------------------


def test_created_ticket_is_confirmed_and_matches_the_servers_record(tickets):
    request = ticket_request()
    result = tickets_adapter(tickets).execute(request)

    assert result.outcome == Outcome.CONFIRMED, result
    [ticket] = tickets.tickets
    assert result.operation is not None and result.operation.id == str(ticket["id"])
    assert result.operation.result == {"provider_status": "new", "url": ticket["url"]}
    assert ticket["subject"] == "Printer on fire" and ticket["group"] == "support"
    assert ticket["external_id"] == request.idempotency_key
    headers = tickets.received[0]["headers"]
    assert headers["Idempotency-Key"] == request.idempotency_key
    assert headers["X-Effect-Id"] == request.effect_id
    assert headers["X-Payload-Digest"] == request.payload_digest


def test_resend_with_the_same_key_is_the_first_ticket_not_a_second(tickets):
    adapter, request = tickets_adapter(tickets), ticket_request()
    first, second = adapter.execute(request), adapter.execute(request)

    assert first.outcome == second.outcome == Outcome.CONFIRMED
    assert first.operation == second.operation
    assert len(tickets.tickets) == 1


def test_a_declared_refusal_is_rejected_with_the_providers_message(tickets):
    result = tickets_adapter(tickets).execute(ticket_request(title="", priority="P3"))

    assert result.outcome == Outcome.REJECTED and result.http_status == 422
    assert "Subject: cannot be blank" in result.error
    assert tickets.tickets == []


def test_key_held_for_another_body_is_a_mismatch_never_a_confirmation(tickets):
    adapter, request = tickets_adapter(tickets), ticket_request()
    adapter.execute(request)
    changed = ExecuteRequest(
        **{**request.__dict__, "payload": {"title": "Other", "priority": "P1"}}
    )

    result = adapter.execute(changed)

    assert result.outcome == Outcome.UNKNOWN and result.mismatch and result.http_status == 400
    assert len(tickets.tickets) == 1


def test_rate_limited_is_not_started_with_retry_after_and_nothing_recorded(tickets):
    tickets.fault = "rate_limit"
    result = tickets_adapter(tickets).execute(ticket_request())

    assert result.outcome == Outcome.NOT_STARTED and result.http_status == 429
    assert "Retry-After: 7" in result.reason
    assert tickets.tickets == []


def test_wrong_credentials_are_refused_and_nothing_recorded(tickets):
    result = tickets_adapter(tickets, token="stale").execute(ticket_request())

    assert result.outcome == Outcome.REJECTED and result.http_status == 401
    assert "stale" not in result.reason + result.error
    assert tickets.tickets == []


def test_answer_lost_after_commit_is_unknown_and_the_key_finds_exactly_one(tickets):
    tickets.fault = "drop_after_commit"
    adapter, request = tickets_adapter(tickets), ticket_request()

    result = adapter.execute(request)

    assert result.outcome == Outcome.UNKNOWN, result
    assert "after the request was sent" in result.reason
    [ticket] = tickets.tickets
    lookup = adapter.lookup(
        idempotency_key=request.idempotency_key,
        timeout=5,
        payload_digest=request.payload_digest,
    )
    assert lookup.operation is not None and lookup.operation.id == str(ticket["id"])
    assert judged(lookup, request).outcome == Outcome.CONFIRMED


def test_5xx_after_commit_is_unknown(tickets):
    tickets.fault = "error_after_commit"
    result = tickets_adapter(tickets).execute(ticket_request())

    assert result.outcome == Outcome.UNKNOWN and result.http_status == 500
    assert len(tickets.tickets) == 1  # the provider acted: only a lookup can say so


def test_slower_than_the_timeout_is_unknown_and_the_key_finds_one(tickets):
    tickets.fault, tickets.delay = "slow", 2.0
    adapter, request = tickets_adapter(tickets), ticket_request(timeout=0.5)

    result = adapter.execute(request)

    assert result.outcome == Outcome.UNKNOWN and "timed out" in result.reason
    lookup = adapter.lookup(idempotency_key=request.idempotency_key, timeout=5)
    assert lookup.status == LookupStatus.FOUND and len(tickets.tickets) == 1


def test_a_redirect_after_commit_is_unknown_and_never_followed(tickets):
    tickets.fault = "redirect_after_commit"
    result = tickets_adapter(tickets).execute(ticket_request())

    assert result.outcome == Outcome.UNKNOWN and result.http_status == 303
    assert [r["path"] for r in tickets.received] == ["/api/v2/tickets"]
    assert len(tickets.tickets) == 1


def test_try_later_then_the_resend_with_the_same_key_is_the_only_ticket(tickets):
    adapter, request = tickets_adapter(tickets), ticket_request()
    tickets.fault = "rate_limit"
    assert adapter.execute(request).outcome == Outcome.NOT_STARTED
    tickets.fault = None

    assert adapter.execute(request).outcome == Outcome.CONFIRMED
    assert len(tickets.tickets) == 1


def test_the_adapters_timeout_caps_the_calls(tickets):
    tickets.fault, tickets.delay = "slow", 1.5
    spec = RestSpec.from_file(EXAMPLES / "tickets.json")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    adapter = RestProviderAdapter(spec, tickets.url, timeout=0.3, headers=auth)

    result = adapter.execute(ticket_request(timeout=30))

    assert result.outcome == Outcome.UNKNOWN and "timed out" in result.reason


def test_credentials_stay_out_of_the_adapters_repr(tickets):
    assert TOKEN not in repr(tickets_adapter(tickets))
    with pytest.raises(ValueError, match="Authorization"):
        RestProviderAdapter(
            RestSpec.from_file(EXAMPLES / "tickets.json"),
            tickets.url,
            headers={"Authorization": "Bearer x\r\nX-Injected: 1"},
        )


def test_a_header_template_that_would_break_the_request_is_never_sent(tickets):
    data = json.loads((EXAMPLES / "tickets.json").read_text())
    data["write"]["headers"] = {"X-Requester": "{payload.title}"}
    adapter = RestProviderAdapter(
        RestSpec.from_dict(data), tickets.url, headers={"Authorization": f"Bearer {TOKEN}"}
    )

    result = adapter.execute(ticket_request(title="a\r\nX-Injected: 1", priority="P2"))

    assert result.outcome == Outcome.REJECTED and "X-Requester" in result.reason
    assert tickets.received == []


def test_server_down_is_not_started(tickets):
    tickets.stop()
    result = tickets_adapter(tickets).execute(ticket_request())

    assert result.outcome == Outcome.NOT_STARTED, result
    assert tickets.tickets == [] and tickets.received == []


def test_lookup_by_operation_id_and_what_is_not_there(tickets):
    adapter, request = tickets_adapter(tickets), ticket_request()
    created = adapter.execute(request)
    assert created.operation is not None

    by_id = adapter.lookup(
        idempotency_key=request.idempotency_key,
        provider_operation_id=created.operation.id,
        timeout=5,
        payload_digest=request.payload_digest,
    )
    assert by_id.status == LookupStatus.FOUND and by_id.operation == created.operation
    missing = adapter.lookup(idempotency_key="k", provider_operation_id="999999", timeout=5)
    assert missing.status == LookupStatus.NOT_FOUND
    never_used = adapter.lookup(idempotency_key="tickets:never-used", timeout=5)
    assert never_used.status == LookupStatus.NOT_FOUND


def test_lookup_without_the_commands_digest_never_confirms(tickets):
    """A provider that keeps no digest: a found operation without the command's digest is a
    mismatch to the reconciler (a human decides), never a confirmation."""
    adapter, request = tickets_adapter(tickets), ticket_request()
    adapter.execute(request)

    lookup = adapter.lookup(idempotency_key=request.idempotency_key, timeout=5)

    assert judged(lookup, request).mismatch


def test_lookup_of_a_server_that_is_down_is_unreachable(tickets):
    tickets.stop()
    lookup = tickets_adapter(tickets).lookup(idempotency_key="tickets:x", timeout=2)
    assert lookup.status == LookupStatus.UNREACHABLE and lookup.error


@pytest.fixture
def tls_tickets(tmp_path):
    cert, key = self_signed_certificate(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = TicketsServer(token=TOKEN, tls=context).start()
    yield server, str(cert)
    server.stop()


def test_https_with_the_providers_ca_is_confirmed(tls_tickets):
    server, ca = tls_tickets
    spec = RestSpec.from_file(EXAMPLES / "tickets.json")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    adapter = RestProviderAdapter(spec, server.url, headers=auth, ca_certs=ca)

    assert adapter.execute(ticket_request()).outcome == Outcome.CONFIRMED
    assert len(server.tickets) == 1


def test_https_to_an_untrusted_certificate_is_not_started(tls_tickets):
    server, _ = tls_tickets
    result = tickets_adapter(server).execute(ticket_request())

    assert result.outcome == Outcome.NOT_STARTED, result
    assert "CERTIFICATE_VERIFY_FAILED" in result.error
    assert server.received == []


# --- deployments: an API with no idempotency at all (at-most-once) -------------------------------


def test_deploy_is_in_progress_then_done_through_lookups(deploys):
    adapter, request = deploys_adapter(deploys.url), deploy_request()

    result = adapter.execute(request)

    assert result.outcome == Outcome.IN_PROGRESS and result.http_status == 202
    assert result.operation is not None
    [deploy] = deploys.deploys
    assert result.operation.id == deploy["uid"] and deploy["ref"] == request.idempotency_key
    assert deploy["digest"] == request.payload_digest
    seen = []
    for _ in range(2):
        lookup = adapter.lookup(
            idempotency_key=request.idempotency_key,
            provider_operation_id=result.operation.id,
            timeout=5,
        )
        seen.append((judged(lookup, request).outcome, lookup.operation.result["provider_status"]))
    assert seen == [(Outcome.IN_PROGRESS, "running"), (Outcome.CONFIRMED, "succeeded")]
    assert len(deploys.deploys) == 1


def test_deploy_that_fails_is_rejected_through_the_lookup(deploys):
    deploys.fail_shas.add("badbadbad000")
    adapter, request = deploys_adapter(deploys.url), deploy_request(sha="badbadbad000")
    adapter.execute(request)

    outcomes = [
        judged(adapter.lookup(idempotency_key=request.idempotency_key, timeout=5), request).outcome
        for _ in range(2)
    ]

    assert outcomes == [Outcome.IN_PROGRESS, Outcome.REJECTED]


def test_unknown_service_is_refused_and_nothing_queued(deploys):
    result = deploys_adapter(deploys.url).execute(deploy_request(service="nope"))

    assert result.outcome == Outcome.REJECTED and result.http_status == 422
    assert "unknown service" in result.error
    assert deploys.deploys == []


def test_declared_try_later_is_not_started_and_nothing_queued(deploys):
    deploys.fault, deploys.retry_after = "maintenance", "120"
    result = deploys_adapter(deploys.url).execute(deploy_request())

    assert result.outcome == Outcome.NOT_STARTED and result.http_status == 503
    assert "Retry-After: 120" in result.reason
    assert deploys.deploys == []


@pytest.mark.parametrize("fault", ["drop_after_commit", "error_after_commit", "slow"])
def test_uncertain_send_is_unknown_and_the_key_search_finds_exactly_one(deploys, fault):
    deploys.fault, deploys.delay = fault, 2.0
    adapter, request = deploys_adapter(deploys.url), deploy_request(timeout=0.5)

    result = adapter.execute(request)

    assert result.outcome == Outcome.UNKNOWN, result
    lookup = adapter.lookup(idempotency_key=request.idempotency_key, timeout=5)
    assert lookup.status == LookupStatus.FOUND, lookup
    assert [d["uid"] for d in deploys.deploys] == [lookup.operation.id]
    assert judged(lookup, request).outcome == Outcome.IN_PROGRESS  # found: never sent again


def test_deploy_server_down_is_not_started():
    result = deploys_adapter(f"http://127.0.0.1:{closed_port()}").execute(deploy_request())
    assert result.outcome == Outcome.NOT_STARTED, result
    assert "nothing was sent" in result.reason


def test_kept_alive_connections_are_reused_and_an_idle_closed_one_is_not_an_unknown():
    """A provider that keeps connections open, and closes them after 0.3 s idle: calls in a row
    share one connection; after the provider closed it, the next call opens a new one and is
    answered, not taken for a lost request."""
    server = DeploysServer(keepalive=True).start()
    try:
        adapter = deploys_adapter(server.url)
        first, second = adapter.execute(deploy_request()), adapter.execute(deploy_request())
        assert server.connections == 1
        deadline = time.monotonic() + 10
        while server.closed < 1 and time.monotonic() < deadline:  # closed once idle 0.3 s
            time.sleep(0.05)
        time.sleep(0.05)  # its FIN reaches this end of the loopback
        third = adapter.execute(deploy_request())
    finally:
        server.stop()
    outcomes = [r.outcome for r in (first, second, third)]
    assert outcomes == [Outcome.IN_PROGRESS] * 3, (first, second, third)
    assert server.connections == 2 and len(server.deploys) == 3


def test_key_never_used_is_not_found(deploys):
    lookup = deploys_adapter(deploys.url).lookup(idempotency_key="deploy:never-used", timeout=5)
    assert lookup.status == LookupStatus.NOT_FOUND


def test_provider_recording_another_digest_is_a_mismatch(deploys):
    deploys.fault = "tamper_digest"
    result = deploys_adapter(deploys.url).execute(deploy_request())
    assert result.outcome == Outcome.UNKNOWN and result.mismatch


def test_two_operations_for_one_key_are_never_taken_for_one(deploys):
    adapter, request = deploys_adapter(deploys.url), deploy_request()
    adapter.execute(request)
    adapter.execute(request)  # what the at-most-once rule forbids: here it happened

    lookup = adapter.lookup(idempotency_key=request.idempotency_key, timeout=5)

    assert len(deploys.deploys) == 2
    assert lookup.status == LookupStatus.UNREACHABLE and "2 operations" in lookup.error


def test_a_value_the_template_needs_but_the_effect_lacks_is_never_sent(deploys):
    request = deploy_request()
    payload = {k: v for k, v in request.payload.items() if k != "release"}
    lacking = ExecuteRequest(**{**request.__dict__, "payload": payload})

    result = deploys_adapter(deploys.url).execute(lacking)

    assert result.outcome == Outcome.REJECTED and "payload.release" in result.reason
    assert deploys.received == []
