"""Each credential's rate limit and ``Retry-After`` pause at one provider, with real workers:
two tenants with credentials of their own and one without, at the sandbox provider behind a
recording proxy (which credential carried each request, and when: the oracle of the gates;
the sandbox's own operations: the oracle of exactly once). A tenant's credential at its rate,
or paused by a 429 answered to it, holds that tenant's effects and no one else's; the held
effects go out later, each once. The same in one process: tests/providers/
test_credential_rates.py."""

from __future__ import annotations

import itertools
import json
from collections import Counter

import pytest

from gateway.models import Attempt, Effect
from gateway.providers import registry
from gateway.providers.conformance.proxy import FaultProxy
from tests.conftest import Persona
from tests.support.crash import RECOVERY_ENV
from tests.support.processes import Celery, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

DEPLOYMENT = "deployment-tickets-token-0123-DDDD"
ACME = "acme-own-tickets-token-012345-AAAA"
GLOBEX = "globex-own-tickets-token-0123-CCCC"


@pytest.fixture
def proxy(settings, sandbox, sandbox_server, monkeypatch):
    monkeypatch.setenv("TEST_DEPLOYMENT_TICKETS", DEPLOYMENT)
    base = sandbox_server.base_url("tickets")
    recorder = FaultProxy(base, record_headers=("Authorization", "Idempotency-Key")).start()
    settings.GATEWAY_PROVIDERS = {
        "tickets": {
            "adapter": "http",
            "base_url": recorder.front(base),
            "credential": {"env": "TEST_DEPLOYMENT_TICKETS"},
            "rate_limit": "20/s",
        }
    }
    registry.forget_adapters()
    yield recorder
    recorder.stop()
    registry.forget_adapters()


def start(settings, queue: str, tmp_path) -> list[Celery]:
    env = {
        **RECOVERY_ENV,
        "GATEWAY_RETRY_BACKOFF": "0.5",
        "GATEWAY_PROVIDERS": json.dumps(settings.GATEWAY_PROVIDERS),
        "TEST_DEPLOYMENT_TICKETS": DEPLOYMENT,
    }
    beat = Celery("beat", queue, tmp_path / "beat.log", **env)
    workers = [
        Celery("worker", queue, tmp_path / f"worker{n}.log", pool="solo", **env) for n in (1, 2)
    ]
    return [beat, *workers]


def set_secret(tenant: str, secret: str, rate: str = "") -> None:
    admin = Persona(tenant, f"{tenant}-admin", "admin")
    answer = admin.client.post(
        "/api/v1/providers/tickets/credentials", {"secret": secret, "rate_limit": rate},
        format="json",
    )  # fmt: skip
    assert answer.status_code == 201, answer.content


def submitted(agent: Persona, ticket_body: dict, prefix: str, count: int) -> list[str]:
    ids = []
    for n in range(count):
        body = {**ticket_body, "payload": {**ticket_body["payload"], "title": f"{prefix}{n}"}}
        answer = agent.submit(body, f"{prefix}{n}")
        assert answer.status_code == 201, answer.content
        ids.append(str(answer.json()["effect_id"]))
    return ids


def confirmed(ids: list[str]) -> bool:
    statuses = Counter(Effect.objects.filter(pk__in=ids).values_list("status", flat=True))
    return statuses == Counter({"CONFIRMED": len(ids)})


def posts(proxy: FaultProxy, secret: str) -> list[dict]:
    """The POSTs that carried ``secret``, in the order they reached the proxy."""
    return [
        event
        for event in list(proxy.events)
        if event["method"] == "POST" and event["headers"].get("authorization") == f"Bearer {secret}"
    ]


def each_sent_once(sandbox, ids: list[str]) -> None:
    keys = set(Effect.objects.filter(pk__in=ids).values_list("command__provider_key", flat=True))
    counted = Counter(op["idempotency_key"] for op in sandbox.operations(provider="tickets"))
    assert {key: counted[key] for key in keys} == dict.fromkeys(keys, 1)


def test_a_tenant_credential_at_its_rate_holds_no_other_tenant(
    settings, proxy, sandbox, agent, rival_agent, ticket_body, queue, tmp_path
):
    set_secret("acme", ACME, "2/s")
    set_secret("globex", GLOBEX)  # the provider's 20/s, a budget of its own
    initech = Persona("initech", "refund-bot", "agent")  # the deployment's credential
    slow = submitted(agent, ticket_body, "acme", 6)
    others = submitted(rival_agent, ticket_body, "globex", 6)
    others += submitted(initech, ticket_body, "initech", 6)
    processes = start(settings, queue, tmp_path)
    try:
        wait_until(lambda: confirmed(slow + others), timeout=90, what="every effect confirmed")
    finally:
        for process in reversed(processes):
            process.stop()
    acme = [event["at"] for event in posts(proxy, ACME)]
    assert len(acme) == 6
    # acme's own rate, across both workers: one send every half second.
    for first, second in itertools.pairwise(acme):
        assert second - first >= 0.45, acme
    rest = [event["at"] for event in posts(proxy, GLOBEX) + posts(proxy, DEPLOYMENT)]
    assert len(rest) == 12
    # The other tenants' twelve went out while acme's credential was still spacing its six.
    assert max(rest) < acme[-1], (acme, sorted(rest))
    each_sent_once(sandbox, slow + others)
    # Held before the claim: one attempt each, none refused and sent again.
    attempts = Counter(Attempt.objects.filter(effect_id__in=slow + others).values_list(
        "effect_id", flat=True))  # fmt: skip
    assert set(attempts.values()) == {1}


def test_a_retry_after_to_one_tenants_credential_pauses_no_other_tenant(
    settings, proxy, sandbox, agent, rival_agent, ticket_body, queue, tmp_path
):
    set_secret("acme", ACME)
    set_secret("globex", GLOBEX)
    initech = Persona("initech", "refund-bot", "agent")
    proxy.add(
        "answer",
        times=1,
        status=429,
        headers={"Retry-After": "3"},
        header={"Authorization": f"Bearer {ACME}"},
    )
    processes = start(settings, queue, tmp_path)
    try:
        first = submitted(agent, ticket_body, "acme-first", 1)
        wait_until(lambda: posts(proxy, ACME), timeout=60, what="acme's 429")
        refused_at = posts(proxy, ACME)[0]["at"]
        mine = submitted(agent, ticket_body, "acme", 4)
        theirs = submitted(rival_agent, ticket_body, "globex", 4)
        theirs += submitted(initech, ticket_body, "initech", 4)
        wait_until(lambda: confirmed(first + mine + theirs), timeout=90, what="all confirmed")
    finally:
        for process in reversed(processes):
            process.stop()
    acme = posts(proxy, ACME)
    assert acme[0].get("status") == 429 and len(acme) == 6  # the 429, then five sends
    # Nothing went out with acme's credential, from either worker, before its pause ran out.
    assert min(event["at"] for event in acme[1:]) >= refused_at + 3 - 0.05, acme
    rest = [event["at"] for event in posts(proxy, GLOBEX) + posts(proxy, DEPLOYMENT)]
    assert len(rest) == 8
    # The other tenants were not paused with it.
    assert max(rest) < refused_at + 3, (refused_at, sorted(rest))
    each_sent_once(sandbox, first + mine + theirs)
