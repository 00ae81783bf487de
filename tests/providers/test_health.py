"""Provider health (gateway.providers.health) from the ledger's own rows: real sends to the
sandbox provider with its faults, real lookups by the reconciler, and rows placed in time."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from gateway import services as ledger
from gateway.models import Effect
from gateway.providers.health import WINDOW, Tally, channel, provider_health
from reconciliation import services as reconciliation
from tests.console.conftest import (
    REFUND,
    TICKET,
    add_attempt,
    add_failed_lookups,
    person,
    set_state,
    submit,
)


@pytest.fixture(autouse=True)
def no_broker(monkeypatch):
    monkeypatch.setattr("gateway.ledger.enqueue_dispatch", lambda effect_id: None)


@pytest.fixture
def agent(db):
    from gateway.capabilities import capability_grant

    bot = person("acme", "refund-bot", "agent")
    capability_grant(granted_by="test", principal=bot.principal, effect_types=["*"])
    return bot.principal


def sent(effect: Effect) -> Effect:
    ledger.effect_dispatch(effect_id=effect.pk, worker="test-worker")
    return Effect.objects.select_related("command").get(pk=effect.pk)


def test_timeouts_then_lookups_that_settle_them(agent, sandbox):
    sandbox.add_fault("commit_then_drop", times=2, provider="billing")
    refunds = [
        sent(submit(agent, REFUND, resource={"type": "order", "id": f"ord_h{n}"})) for n in range(2)
    ]
    assert [e.status for e in refunds] == ["UNKNOWN", "UNKNOWN"]
    assert sent(submit(agent, TICKET)).status == "CONFIRMED"

    health = provider_health(agent.tenant_id)
    billing, tickets = health["billing"], health["tickets"]
    assert billing.sends.answering is False
    assert billing.sends.errors == billing.sends.calls == 2
    assert billing.sends.error_rate == 1.0
    assert billing.sends.since is not None
    assert billing.lookups.answering is None
    assert (billing.unknown, billing.unknown_new, billing.unknown_settled) == (2, 2, 0)
    assert billing.trend == "rising"
    assert tickets.sends.answering is True and tickets.sends.since is None
    assert tickets.sends.error_rate == 0.0
    assert tickets.latency_p50 is not None and 0 < tickets.latency_p50 <= tickets.latency_p99
    # A provider nobody called in the window says so.
    assert health["deploy"].sends.answering is None and health["deploy"].sends.calls == 0

    for effect in refunds:
        reconciliation.effect_reconcile(effect_id=effect.pk)
    billing = provider_health(agent.tenant_id)["billing"]
    assert billing.lookups.answering is True and billing.lookups.errors == 0
    assert (billing.unknown, billing.unknown_new, billing.unknown_settled) == (0, 2, 2)
    assert billing.trend == "steady"


def test_unreachable_lookups_say_since_when(agent, sandbox):
    sandbox.add_fault("commit_then_drop", times=1, provider="billing")
    effect = sent(submit(agent, REFUND))
    sandbox.add_fault("lookup_unreachable", times=None, provider="billing")
    before = timezone.now()
    reconciliation.effect_reconcile(effect_id=effect.pk)
    lookups = provider_health(agent.tenant_id)["billing"].lookups
    assert lookups.answering is False
    assert lookups.since is not None and lookups.since >= before
    assert (lookups.calls, lookups.errors) == (1, 1)
    assert provider_health(agent.tenant_id)["billing"].lookups_failing


def test_only_the_window_and_the_tenant_count(agent):
    now = timezone.now()
    effect = set_state(submit(agent, REFUND), status="UNKNOWN")
    old = now - WINDOW - timedelta(minutes=5)
    add_attempt(effect, started_at=old, finished_at=old + timedelta(seconds=10))
    add_failed_lookups(effect, 3, first_minutes_ago=120)
    health = provider_health(agent.tenant_id, now=now)["billing"]
    assert health.sends.calls == 0 and health.lookups.calls == 0
    assert health.unknown == 1
    # Inside the window, and seen by its tenant only.
    add_attempt(effect, number=2, started_at=now - timedelta(minutes=3))
    add_failed_lookups(effect, 2, first_minutes_ago=10)
    health = provider_health(agent.tenant_id, now=now)["billing"]
    assert (health.sends.calls, health.sends.errors) == (1, 1)
    assert (health.lookups.calls, health.lookups.errors) == (2, 2)
    other = person("globex", "olga", "operator").principal
    assert provider_health(other.tenant_id, now=now)["billing"].sends.calls == 0
    assert provider_health(other.tenant_id, now=now)["billing"].unknown == 0


def test_a_refusal_or_a_429_is_an_answer_a_5xx_is_not(agent):
    now = timezone.now()
    effect = set_state(submit(agent, REFUND), status="REJECTED")
    add_attempt(effect, outcome="rejected", http_status=402, started_at=now - timedelta(minutes=9))
    add_attempt(
        effect,
        number=2,
        outcome="not_started",
        http_status=429,
        started_at=now - timedelta(minutes=8),
    )
    add_attempt(
        effect, number=3, outcome="unknown", http_status=503, started_at=now - timedelta(minutes=7)
    )
    sends = provider_health(agent.tenant_id, now=now)["billing"].sends
    assert (sends.calls, sends.errors) == (3, 1)
    assert sends.answering is False


def test_channel_states():
    t = [timezone.now() - timedelta(minutes=m) for m in (50, 40, 30, 20)]
    assert channel(Tally()).answering is None
    recovered = channel(Tally(calls=3, errors=1, first_fail=t[0], last_fail=t[1], last_ok=t[3]))
    assert (recovered.answering, recovered.since) == (True, t[1])
    broken = channel(Tally(calls=3, errors=1, first_ok=t[0], last_ok=t[1], last_fail=t[2]))
    assert (broken.answering, broken.since) == (False, t[1])
    down = channel(Tally(calls=2, errors=2, first_fail=t[0], last_fail=t[2]))
    assert (down.answering, down.since) == (False, t[0])


def test_three_queries_whatever_the_rows(agent, django_assert_num_queries):
    now = timezone.now()
    for n in range(20):
        effect = set_state(
            submit(agent, REFUND, resource={"type": "order", "id": f"q{n}"}), status="UNKNOWN"
        )
        add_attempt(effect, started_at=now - timedelta(minutes=n + 1))
        add_failed_lookups(effect, 2, first_minutes_ago=30)
    # The sends, the lookups (reconciliation's source), the UNKNOWN counts.
    with django_assert_num_queries(3):
        provider_health(agent.tenant_id, now=now)
