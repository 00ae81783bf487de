"""A provider's protection with real workers against the sandbox provider, whose own log is
the oracle: the circuit breaker holds a provider that refuses connections (effects stay
queued, none fails, none is sent twice) and lets one probe through once it is back; a 429's
``Retry-After`` pauses the provider for every worker; the cap on calls in flight holds across
workers (counted at the sandbox). The rules' arithmetic is tests/providers/
test_protection_rules.py."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from gateway.choices import Outcome
from gateway.models import Attempt, Effect
from gateway.providers import protection
from gateway.providers.gates import CLOSED, OPEN
from gateway.providers.sandbox import SandboxServer
from tests.support.crash import RECOVERY_ENV
from tests.support.processes import Celery, free_port, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

# Short breaker times and retry backoff: what takes minutes in production takes seconds here.
ENV = {
    **RECOVERY_ENV,
    "GATEWAY_RETRY_BACKOFF": "0.5",
    "GATEWAY_CIRCUIT_FAILURES": "2",
    "GATEWAY_CIRCUIT_OPEN_SECONDS": "2",
}


def ticket(title: str) -> dict:
    return {
        "type": "ticket.create",
        "resource": {"type": "queue", "id": "support"},
        "payload": {"title": title, "priority": "P3"},
    }


def submit_tickets(agent, count: int, prefix: str) -> list[str]:
    ids = []
    for index in range(count):
        response = agent.submit(ticket(f"{prefix}{index}"), f"{prefix}{index}")
        assert response.status_code == 201, response.json()
        ids.append(response.json()["effect_id"])
    return ids


@contextmanager
def beat_and_two_workers(queue: str, tmp_path: Path, env: dict[str, str]) -> Iterator[None]:
    """Beat and two solo workers on the test's queue, stopped when the block ends."""
    beat = Celery("beat", queue, tmp_path / "beat.log", **env)
    workers = [
        Celery("worker", queue, tmp_path / f"worker{n}.log", pool="solo", **env) for n in (1, 2)
    ]
    try:
        yield
    finally:
        for worker in workers:
            worker.stop()
        beat.stop()


def statuses(ids: list[str]) -> Counter:
    return Counter(Effect.objects.filter(pk__in=ids).values_list("status", flat=True))


def confirmed(ids: list[str]) -> bool:
    return statuses(ids) == Counter({"CONFIRMED": len(ids)})


def keys_at_provider(sandbox) -> Counter:
    return Counter(op["idempotency_key"] for op in sandbox.operations(provider="tickets"))


def provider_keys(ids: list[str]) -> set[str]:
    return set(Effect.objects.filter(pk__in=ids).values_list("command__provider_key", flat=True))


def test_the_breaker_holds_a_refusing_provider_then_one_probe_and_the_rest_drain(
    sandbox, agent, queue, tmp_path, settings
):
    port = free_port()  # nothing listens there: every connection is refused
    settings.GATEWAY_PROVIDER_URLS = {
        **settings.GATEWAY_PROVIDER_URLS,
        "tickets": f"http://127.0.0.1:{port}/tickets",
    }
    settings.GATEWAY_CIRCUIT_FAILURES = 2
    ids = submit_tickets(agent, 8, "down")
    beat = Celery("beat", queue, tmp_path / "beat.log", **ENV)
    worker = Celery("worker", queue, tmp_path / "worker.log", pool="solo", **ENV)
    server = None
    try:
        wait_until(
            lambda: protection.snapshot()["tickets"].circuit == OPEN,
            timeout=60,
            what="the circuit to open",
        )
        first_open = protection.snapshot()["tickets"].since
        # A probe goes out after open_seconds, is refused, and opens the circuit again.
        wait_until(
            lambda: (
                (state := protection.snapshot()["tickets"]).circuit == OPEN
                and state.since != first_open
            ),
            timeout=60,
            what="a refused probe to open the circuit again",
        )
        held = statuses(ids)
        # Waiting (or a probe's record on its way), none failed, none UNKNOWN.
        assert set(held) <= {"PREPARED", "NOT_STARTED", "DISPATCHING"}, held
        assert not Effect.objects.filter(pk__in=ids, escalated=True).exists()
        tried = Effect.objects.filter(pk__in=ids, attempt_count__gt=0).count()
        # Two failures open the circuit (a drain's second claim may have taken two at once),
        # then one probe per open period: the rest were never sent.
        assert tried < len(ids), tried
        assert set(Attempt.objects.filter(effect_id__in=ids).values_list("outcome", flat=True)) <= {
            Outcome.NOT_STARTED,
            None,
        }
        assert keys_at_provider(sandbox) == Counter()

        server = SandboxServer(sandbox, port=port).start()  # the provider is back
        wait_until(lambda: confirmed(ids), timeout=90, what="every effect confirmed")
    finally:
        worker.stop()
        beat.stop()
        if server is not None:
            server.stop()
    assert keys_at_provider(sandbox) == Counter(dict.fromkeys(provider_keys(ids), 1))
    state = protection.snapshot()["tickets"]
    assert (state.circuit, state.consecutive_failures) == (CLOSED, 0)
    assert not Effect.objects.filter(pk__in=ids, escalated=True).exists()


def test_a_retry_after_pauses_the_provider_for_every_worker(
    sandbox, agent, queue, tmp_path, settings
):
    sandbox.add_fault("reject", times=1, type="ticket.create", status=429, retry_after=3)
    with beat_and_two_workers(queue, tmp_path, ENV):
        (first,) = submit_tickets(agent, 1, "paced")
        wait_until(
            lambda: protection.snapshot()["tickets"].paused_until is not None,
            timeout=60,
            what="the 429's pause",
        )
        ids = [first, *submit_tickets(agent, 6, "later")]
        wait_until(lambda: confirmed(ids), timeout=90, what="every effect confirmed")
    log = [e for e in sandbox.log(provider="tickets") if not e["action"].startswith("lookup")]
    refused = [entry for entry in log if entry["status"] == 429]
    assert len(refused) == 1
    refused_at = datetime.fromisoformat(refused[0]["at"])
    later = [datetime.fromisoformat(entry["at"]) for entry in log if entry is not refused[0]]
    assert later, log
    # Nothing reached the provider, from either worker, before its Retry-After ran out.
    assert min(later) >= refused_at + timedelta(seconds=3), log
    assert keys_at_provider(sandbox) == Counter(dict.fromkeys(provider_keys(ids), 1))


def test_the_cap_on_calls_in_flight_holds_across_workers(sandbox, agent, queue, tmp_path, settings):
    server = SandboxServer(sandbox).start()  # its own: the peak counted is this test's
    providers = {"tickets": {"max_in_flight": 2}}
    settings.GATEWAY_PROVIDERS = providers
    settings.GATEWAY_PROVIDER_URLS = {
        **settings.GATEWAY_PROVIDER_URLS,
        "tickets": server.base_url("tickets"),
    }
    sandbox.add_fault("slow", times=None, type="ticket.create", seconds=0.4)
    env = {**ENV, "GATEWAY_PROVIDERS": json.dumps(providers)}
    try:
        with beat_and_two_workers(queue, tmp_path, env):
            ids = submit_tickets(agent, 12, "capped")
            wait_until(lambda: confirmed(ids), timeout=120, what="every effect confirmed")
    finally:
        server.stop()
    assert server.peak_in_flight("tickets") == 2
    assert keys_at_provider(sandbox) == Counter(dict.fromkeys(provider_keys(ids), 1))
    assert protection.snapshot()["tickets"].in_flight == 0  # every lease given back


def test_a_rate_limit_is_shared_by_every_worker(sandbox, agent, queue, tmp_path, settings):
    providers = {"tickets": {"rate_limit": "4/s"}}
    settings.GATEWAY_PROVIDERS = providers
    env = {**ENV, "GATEWAY_PROVIDERS": json.dumps(providers)}
    with beat_and_two_workers(queue, tmp_path, env):
        ids = submit_tickets(agent, 10, "paced")
        wait_until(lambda: confirmed(ids), timeout=120, what="every effect confirmed")
    sent = sorted(
        datetime.fromisoformat(entry["at"])
        for entry in sandbox.log(provider="tickets")
        if entry["action"] == "commit"
    )
    assert len(sent) == len(ids)
    # Evenly spaced across both workers, one send every 0.25 s: any five sends span a second
    # (less what the sandbox's stamps, taken a little after each permit, may shave off).
    for first, fifth in zip(sent, sent[4:], strict=False):
        assert fifth - first >= timedelta(seconds=0.8), sent
    assert keys_at_provider(sandbox) == Counter(dict.fromkeys(provider_keys(ids), 1))
