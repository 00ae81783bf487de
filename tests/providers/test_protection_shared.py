"""The protection's state where every worker reads it (Redis), what it degrades to when Redis
is down (each process on its own, dispatch going on), and what ``snapshot`` and ``/metrics``
show of it. Real Redis (the test run's Valkey); workers: tests/gateway/
test_provider_protection.py."""

from __future__ import annotations

import json

import pytest
from prometheus_client import REGISTRY, generate_latest

from gateway.choices import Outcome
from gateway.lib import broker
from gateway.providers import protection
from gateway.providers.base import CallResult
from gateway.providers.gates import CLOSED, IN_FLIGHT, OPEN, PAUSED, Hold

REFUSED = CallResult(Outcome.NOT_STARTED, "connection refused")
DONE = CallResult(Outcome.CONFIRMED, "done", http_status=201)


@pytest.fixture
def capped(settings):
    settings.GATEWAY_PROVIDERS = {"tickets": {"max_in_flight": 2, "rate_limit": "100/s"}}
    protection.reset("tickets")


def test_a_cap_is_counted_in_redis_and_its_leases_come_back(capped):
    permit = protection.admit("tickets", 5)
    assert not isinstance(permit, Hold)
    assert permit.granted == 2  # 20 ms of 100/s at once, and the cap's two
    again = protection.admit("tickets", 5)
    assert isinstance(again, Hold)  # the cap is full until a lease comes back
    state = json.loads(broker.client().get(protection._key("tickets")))
    assert len(state["leases"]) == 2
    seen = protection.snapshot()["tickets"]
    assert seen.shared and seen.max_in_flight == 2 and seen.rate_capacity == 100
    assert seen.in_flight == 2 and seen.rate_used >= 2
    protection.release("tickets", permit.leases)
    assert protection.snapshot()["tickets"].in_flight == 0


def test_a_claim_that_found_less_gives_the_rest_back(settings):
    settings.GATEWAY_PROVIDERS = {"tickets": {"max_in_flight": 3}}
    protection.reset("tickets")
    permit = protection.admit("tickets", 3)
    assert permit.granted == 3
    permit.keep(1)
    assert protection.snapshot()["tickets"].in_flight == 1
    assert not isinstance(protection.admit("tickets", 2), Hold)
    hold = protection.admit("tickets", 1)
    assert isinstance(hold, Hold) and hold.gate == IN_FLIGHT


def test_the_circuit_and_the_pause_are_one_for_every_reader(settings):
    settings.GATEWAY_CIRCUIT_FAILURES = 3
    protection.observe("tickets", [REFUSED, REFUSED])
    assert protection.snapshot()["tickets"].consecutive_failures == 2
    protection.observe("tickets", [REFUSED])
    view = protection.outlook(["tickets"])
    assert view.held["tickets"].gate == "circuit"
    state = protection.snapshot()["tickets"]
    assert (state.circuit, state.consecutive_failures) == (OPEN, 3) and state.since is not None
    protection.reset("tickets")
    paused = CallResult(Outcome.NOT_STARTED, "429", http_status=429, retry_after=30)
    protection.observe("tickets", [paused])
    # The pause is the deployment credential's: the provider is counted per credential, the
    # deployment's held back, a tenant's own credential free to send.
    view = protection.outlook(["tickets"])
    assert "tickets" not in view.held and "tickets" in view.permits
    assert set(view.keys["tickets"]) == {"tickets"}
    assert isinstance(held := protection.admit("tickets", 1), Hold) and held.gate == PAUSED
    assert not isinstance(protection.admit("tickets", 1, credential="fp-of-a-tenant"), Hold)
    assert protection.snapshot()["tickets"].paused_until is not None
    assert protection.snapshot()["tickets"].circuit == CLOSED  # a 429 is no failure


def test_a_retry_after_pauses_only_the_credential_it_answered(settings):
    settings.GATEWAY_PROVIDERS = {"tickets": {"rate_limit": "100/s"}}
    paused = CallResult(Outcome.NOT_STARTED, "429", http_status=429, retry_after=30)
    protection.observe("tickets", [paused], credential="fp-a")
    view = protection.outlook(["tickets"])
    assert set(view.keys["tickets"]) == {protection.credential_key("tickets", "fp-a")}
    held = protection.admit("tickets", 1, credential="fp-a")
    assert isinstance(held, Hold) and held.gate == PAUSED
    for other in ("fp-b", None):
        permit = protection.admit("tickets", 1, credential=other)
        assert not isinstance(permit, Hold) and permit.granted == 1
    state = protection.snapshot()["tickets"]
    assert state.paused_until is None  # the deployment's credential is not paused
    uses = {use.fingerprint: use for use in state.credentials}
    assert uses["fp-a"].paused_until is not None and uses["fp-b"].rate_used == 1
    assert uses["fp-b"].rate_limit == "100/s" and uses["fp-b"].paused_until is None


def test_a_credential_has_a_rate_of_its_own(settings):
    settings.GATEWAY_PROVIDERS = {"tickets": {"rate_limit": "1/min"}}
    assert not isinstance(protection.admit("tickets", 1), Hold)
    assert isinstance(protection.admit("tickets", 1), Hold)  # the deployment's: spent
    permits = protection.admit_many("tickets", [("fp-a", "", 3), ("fp-b", "3/s", 3)])
    a, b = permits["fp-a"], permits["fp-b"]
    assert not isinstance(a, Hold) and a.granted == 1  # the provider's
    assert not isinstance(b, Hold) and b.granted == 1  # evenly spaced
    b.keep(0)  # given back: the next admission finds it
    assert not isinstance(protection.admit("tickets", 1, credential="fp-b", rate="3/s"), Hold)


@pytest.mark.django_db  # /metrics reads the ledger's gauges too
def test_metrics_show_each_providers_circuit(settings):
    settings.GATEWAY_CIRCUIT_FAILURES = 1
    protection.observe("tickets", [REFUSED])
    text = generate_latest(REGISTRY).decode()
    assert 'gateway_provider_circuit{provider="tickets",state="open"} 1.0' in text
    assert 'gateway_provider_circuit{provider="billing",state="closed"} 1.0' in text
    assert 'gateway_provider_consecutive_failures{provider="tickets"} 1.0' in text
    protection.observe("tickets", [DONE])
    text = generate_latest(REGISTRY).decode()
    assert 'gateway_provider_circuit{provider="tickets",state="closed"} 1.0' in text


def test_with_redis_down_the_limits_hold_per_process_and_sends_go_on(capped, settings, tmp_path):
    previous = settings.CELERY_BROKER_URL
    settings.CELERY_BROKER_URL = f"unix://{tmp_path}/nobody.sock"
    broker.client.cache_clear()
    try:
        permit = protection.admit("tickets", 1)
        assert not isinstance(permit, Hold) and permit.granted == 1  # dispatch goes on
        assert not protection.snapshot()["tickets"].shared
        protection.observe("tickets", [REFUSED] * 5)
        assert protection.snapshot()["tickets"].circuit == OPEN  # this process's own breaker
    finally:
        settings.CELERY_BROKER_URL = previous
        broker.client.cache_clear()
        protection.reset()


@pytest.mark.django_db  # /metrics reads the ledger's gauges too
def test_metrics_show_each_credentials_rate_use_and_pause_by_fingerprint(settings):
    settings.GATEWAY_PROVIDERS = {"tickets": {"rate_limit": "100/s"}}
    assert not isinstance(protection.admit("tickets", 1, credential="fp-a"), Hold)
    paused = CallResult(Outcome.NOT_STARTED, "429", http_status=429, retry_after=30)
    protection.observe("tickets", [paused], credential="fp-b")
    text = generate_latest(REGISTRY).decode()
    assert 'gateway_provider_credential_rate_used{credential="fp-a",provider="tickets"} 1.0' in text
    assert 'gateway_provider_paused_seconds{credential="deployment",provider="tickets"} 0.0' in text
    line = next(x for x in text.splitlines() if x.startswith(
        'gateway_provider_paused_seconds{credential="fp-b"'))  # fmt: skip
    assert 25 < float(line.split()[-1]) <= 30


def test_an_open_circuit_holds_the_provider_whatever_credential_is_paused(settings):
    settings.GATEWAY_CIRCUIT_FAILURES = 1
    paused = CallResult(Outcome.NOT_STARTED, "429", http_status=429, retry_after=30)
    protection.observe("tickets", [paused])  # the deployment's credential paused
    protection.observe("tickets", [REFUSED])
    view = protection.outlook(["tickets"])
    assert view.held["tickets"].gate == "circuit" and "tickets" not in view.permits
    held = protection.admit("tickets", 1, credential="fp-a")
    assert isinstance(held, Hold) and held.gate == "circuit"
