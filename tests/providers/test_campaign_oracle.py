"""The fault campaign's oracle (tests/support/campaign.py) on the sandbox's real log: a key
sent again with no answered lookup since its previous send is a blind resend, whatever the
first send's fate; a lookup that was itself refused does not count as asked."""

from __future__ import annotations

import json

from gateway.lib.digest import payload_digest
from gateway.providers.sandbox import SandboxProvider
from tests.support.campaign import blind_resends, is_send

BODY = {"type": "ticket.create", "resource": {"type": "queue", "id": "q"}, "payload": {"t": 1}}


def send(provider: SandboxProvider, key: str) -> int:
    body = {**BODY, "payload_digest": payload_digest(**BODY)}
    reply = provider.handle_create(
        provider="tickets", idempotency_key=key, body=json.dumps(body).encode()
    )
    return reply.status


def look(provider: SandboxProvider, key: str) -> int:
    return provider.handle_lookup(provider="tickets", idempotency_key=key).status


def test_a_resend_after_an_answered_lookup_is_not_blind():
    provider = SandboxProvider()
    provider.add_fault("reset_before_commit")
    send(provider, "k")
    assert look(provider, "k") == 404
    assert send(provider, "k") == 201
    assert blind_resends(provider.log()) == []
    assert [is_send(entry) for entry in provider.log()] == [True, False, True]


def test_a_resend_without_a_lookup_is_blind_whatever_the_first_answer():
    provider = SandboxProvider()
    provider.add_fault("commit_then_drop")
    provider.add_fault("throttle", retry_after=1)
    send(provider, "dropped")
    send(provider, "dropped")
    send(provider, "throttled")
    send(provider, "throttled")
    send(provider, "other")
    assert blind_resends(provider.log()) == ["dropped", "throttled"]


def test_a_refused_lookup_does_not_count_as_asked():
    provider = SandboxProvider()
    provider.add_fault("fail_before_commit")
    provider.add_fault("lookup_unavailable", times=1)
    send(provider, "k")
    assert look(provider, "k") == 503
    send(provider, "k")
    assert blind_resends(provider.log()) == ["k"]
