"""The rate limit and the ``Retry-After`` pause of each credential at one provider, in one
process (the same with real workers: tests/gateway/test_provider_protection_credentials.py):
the drainer learns before its claim which credential each due effect goes out with, asks for
permits per credential, and leaves the effects of a credential at its limit (or paused) due
and untouched while other tenants' effects go out. The sandbox's own log is the oracle of
what was sent; the proxy's of which credential carried it. ``SENT_WITH_SQL`` (the choice in
SQL, before the claim) agrees with ``_chosen_rows`` (the choice at the claim)."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from gateway import dispatcher
from gateway import provider_credentials as credentials
from gateway.models import Effect
from gateway.providers import protection, registry
from gateway.providers.config import fingerprint
from gateway.providers.conformance.proxy import FaultProxy
from tests.conftest import Persona

pytestmark = pytest.mark.django_db

DEPLOYMENT = "deployment-tickets-token-0123-DDDD"
ACME = "acme-own-tickets-token-012345-AAAA"
ACME_NEXT = "acme-rotated-tickets-token-0123-BBBB"
GLOBEX = "globex-own-tickets-token-0123-CCCC"


@pytest.fixture
def proxy(settings, sandbox, sandbox_server, monkeypatch):
    """The tickets provider on the sandbox, through a recording proxy, with a deployment-wide
    bearer credential and a rate of 100 sends a second per credential."""
    monkeypatch.setenv("TEST_DEPLOYMENT_TICKETS", DEPLOYMENT)
    base = sandbox_server.base_url("tickets")
    recorder = FaultProxy(base, record_headers=("Authorization", "Idempotency-Key")).start()
    settings.GATEWAY_PROVIDERS = {
        "tickets": {
            "adapter": "http",
            "base_url": recorder.front(base),
            "credential": {"env": "TEST_DEPLOYMENT_TICKETS"},
            "rate_limit": "100/s",
        }
    }
    registry.forget_adapters()
    yield recorder
    recorder.stop()
    registry.forget_adapters()


def set_secret(tenant: str, secret: str, rate: str = "", *, rotate: bool = False):
    admin = Persona(tenant, f"{tenant}-admin", "admin")
    url = "/api/v1/providers/tickets/credentials" + ("/rotate" if rotate else "")
    return admin.client.post(url, {"secret": secret, "rate_limit": rate}, format="json")


def submitted(agent: Persona, ticket_body: dict, keys: list[str]) -> list[str]:
    ids = []
    for key in keys:
        body = {**ticket_body, "payload": {**ticket_body["payload"], "title": key}}
        answer = agent.submit(body, key)
        assert answer.status_code == 201, answer.content
        ids.append(str(answer.json()["effect_id"]))
    return ids


def drain_until(done, *, seconds: float = 10.0) -> None:
    """Drain in this process (no drainer threads wait for a gate to reopen) until ``done``."""
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, "not done in time"
        dispatcher.drain(flag=None, worker="test")
        time.sleep(0.02)


def statuses(ids: list[str]) -> Counter:
    return Counter(Effect.objects.filter(pk__in=ids).values_list("status", flat=True))


def confirmed(ids: list[str]) -> bool:
    return statuses(ids) == Counter({"CONFIRMED": len(ids)})


def sent_once(sandbox, ids: list[str]) -> bool:
    keys = Effect.objects.filter(pk__in=ids).values_list("command__provider_key", flat=True)
    counted = Counter(op["idempotency_key"] for op in sandbox.operations(provider="tickets"))
    return all(counted[key] == 1 for key in keys)


def carried_by(proxy: FaultProxy, secret: str) -> int:
    """POSTs forwarded to the server with ``secret``."""
    return sum(
        1
        for event in proxy.events
        if event["method"] == "POST"
        and event.get("forwarded")
        and event["headers"].get("authorization") == f"Bearer {secret}"
    )


def test_a_credential_at_its_rate_holds_only_its_own_tenants_effects(
    proxy, sandbox, agent, rival_agent, ticket_body
):
    assert set_secret("acme", ACME, "1/min").status_code == 201
    assert set_secret("globex", GLOBEX).status_code == 201  # the provider's 100/s
    initech = Persona("initech", "refund-bot", "agent")  # no credential: the deployment's
    slow = submitted(agent, ticket_body, [f"acme-{n}" for n in range(3)])
    fast = submitted(rival_agent, ticket_body, [f"globex-{n}" for n in range(4)])
    plain = submitted(initech, ticket_body, [f"initech-{n}" for n in range(4)])

    drain_until(lambda: confirmed(fast + plain))
    dispatcher.drain(flag=None, worker="test")  # acme's credential is still at its limit

    assert statuses(slow) == Counter({"CONFIRMED": 1, "PREPARED": 2})
    held = Effect.objects.filter(pk__in=slow, status="PREPARED")
    # Held before any claim: no attempt, still due.
    assert {(e.attempt_count, e.next_dispatch_at is not None) for e in held} == {(0, True)}
    assert (carried_by(proxy, ACME), carried_by(proxy, GLOBEX)) == (1, 4)
    assert carried_by(proxy, DEPLOYMENT) == 4
    assert sent_once(sandbox, slow[:0] + fast + plain)
    state = protection.snapshot()["tickets"]
    uses = {use.fingerprint: use for use in state.credentials}
    assert (uses[fingerprint(ACME)].rate_limit, uses[fingerprint(ACME)].rate_used) == ("1/min", 1)
    assert (uses[fingerprint(GLOBEX)].rate_limit, uses[fingerprint(GLOBEX)].rate_used) == (
        "100/s",
        4,
    )
    assert state.rate_used == 4  # the tenant without a credential: the deployment's limit


def test_a_retry_after_to_one_tenants_credential_pauses_only_it(
    proxy, sandbox, agent, rival_agent, ticket_body
):
    assert set_secret("acme", ACME).status_code == 201
    assert set_secret("globex", GLOBEX).status_code == 201
    proxy.add(
        "answer",
        times=1,
        status=429,
        headers={"Retry-After": "2"},
        header={"Authorization": f"Bearer {ACME}"},
    )
    first = submitted(agent, ticket_body, ["acme-first"])
    drain_until(lambda: statuses(first) == Counter({"NOT_STARTED": 1}))
    paused_at = time.time()
    mine = submitted(agent, ticket_body, ["acme-0", "acme-1"])
    theirs = submitted(rival_agent, ticket_body, [f"globex-{n}" for n in range(3)])
    drain_until(lambda: confirmed(theirs))
    assert time.time() - paused_at < 2  # globex was not held by acme's pause
    assert statuses(mine) == Counter({"PREPARED": 2})
    assert (carried_by(proxy, ACME), carried_by(proxy, GLOBEX)) == (0, 3)

    drain_until(lambda: confirmed(first + mine))
    acme_posts = [
        e["at"]
        for e in proxy.events
        if e["method"] == "POST" and e["headers"].get("authorization") == f"Bearer {ACME}"
    ]
    # The refused one, then nothing with acme's credential before its Retry-After ran out.
    assert len(acme_posts) == 4 and min(acme_posts[1:]) >= acme_posts[0] + 2 - 0.05
    assert sent_once(sandbox, first + mine + theirs)


def test_a_credential_rate_is_checked_and_needs_the_providers_rate(settings, proxy):
    bad = set_secret("acme", ACME, "fast")
    assert bad.status_code == 400 and "rate_limit" in bad.json()["errors"]
    settings.GATEWAY_PROVIDERS = {
        "tickets": {k: v for k, v in settings.GATEWAY_PROVIDERS["tickets"].items()
                    if k != "rate_limit"}
    }  # fmt: skip
    unrated = set_secret("acme", ACME, "5/s")
    assert unrated.status_code == 400 and "no rate_limit" in unrated.json()["detail"]
    assert set_secret("acme", ACME).status_code == 201  # the provider's (none)


def test_the_sql_choice_of_credential_is_the_claims(proxy, sandbox, agent, ticket_body):
    """``SENT_WITH_SQL`` and ``_chosen_rows`` on the same rows: a tenant without a credential,
    with an active one, a resend after a rotation (the credential of its first attempt),
    and a resend whose first credential was retired (the active one)."""
    from gateway.provider_credentials import _chosen_rows, _Sending

    def both(effect_id: str) -> tuple[str | None, str | None]:
        effect = Effect.objects.get(pk=effect_id)
        sending = _Sending(effect_id, effect.tenant_id, "tickets", effect.attempt_count + 1)
        row = _chosen_rows([sending]).get(effect_id)
        sql = credentials.dispatch_sender(effect_id)
        assert sql is not None
        return (row.fingerprint if row else None), sql[3]

    (none,) = submitted(agent, ticket_body, ["none"])
    assert both(none) == (None, None)
    assert set_secret("acme", ACME).status_code == 201
    assert both(none) == (fingerprint(ACME), fingerprint(ACME))
    proxy.add("answer", times=1, status=429, headers={"Retry-After": "0"})
    drain_until(lambda: statuses([none]) == Counter({"NOT_STARTED": 1}))
    assert set_secret("acme", ACME_NEXT, rotate=True).status_code == 201
    assert both(none) == (fingerprint(ACME), fingerprint(ACME))  # the first attempt's
    old = credentials.ProviderCredential.objects.get(fingerprint=fingerprint(ACME))
    old.state = "retired"
    old.save(update_fields=["state"])
    assert both(none) == (fingerprint(ACME_NEXT), fingerprint(ACME_NEXT))


def test_a_single_dispatch_is_held_by_its_own_credential_only(
    proxy, sandbox, agent, rival_agent, ticket_body
):
    """The message path (``services.effect_dispatch``): the gates ask for the credential the
    effect goes out with; a held effect keeps its state and gets a later dispatch time."""
    from gateway import services
    from gateway.choices import Outcome
    from gateway.providers.base import CallResult

    assert set_secret("acme", ACME).status_code == 201
    paused = CallResult(Outcome.NOT_STARTED, "429", http_status=429, retry_after=30)
    protection.observe("tickets", [paused], credential=fingerprint(ACME))
    (mine,) = submitted(agent, ticket_body, ["acme-held"])
    (theirs,) = submitted(rival_agent, ticket_body, ["globex-free"])
    due_before = Effect.objects.get(pk=mine).next_dispatch_at
    assert not services.effect_dispatch(effect_id=mine, worker="test")
    assert services.effect_dispatch(effect_id=theirs, worker="test")
    held = Effect.objects.get(pk=mine)
    assert (held.status, held.attempt_count) == ("PREPARED", 0)
    [use] = protection.snapshot()["tickets"].credentials
    assert use.fingerprint == fingerprint(ACME) and use.paused_until is not None
    # Due again once the pause runs out, never earlier than it was.
    assert held.next_dispatch_at is not None
    assert held.next_dispatch_at >= max(due_before, use.paused_until)
    assert Effect.objects.get(pk=theirs).status == "CONFIRMED"
    assert (carried_by(proxy, ACME), carried_by(proxy, DEPLOYMENT)) == (0, 1)


def test_the_console_sets_a_credential_rate_and_the_providers_page_shows_its_use(
    proxy, sandbox, agent, ticket_body
):
    from tests.console.conftest import person

    root = person("acme", "root", "admin")
    made = root.client.post(
        "/providers/tickets/credentials/set", {"secret": ACME, "rate_limit": "1/min"}
    )
    assert made.status_code == 302
    html = root.client.get("/providers/tickets/credentials").content.decode()
    assert 'data-rate="1/min"' in html and "100/s" in html  # the provider's, as the default
    refused = root.client.post(
        "/providers/tickets/credentials/rotate",
        {"secret": ACME_NEXT, "confirm": "on", "rate_limit": "soon"},
        HTTP_HX_REQUEST="true",
    )
    assert refused.status_code == 400 and "not a rate" in refused.content.decode()
    ids = submitted(agent, ticket_body, ["counted-1", "counted-2"])
    dispatcher.drain(flag=None, worker="test")
    assert statuses(ids) == Counter({"CONFIRMED": 1, "PREPARED": 1})
    page = root.client.get("/providers").content.decode()
    assert "your credential&#x27;s rate 1 / 1 (1/min)" in page, page


def test_lookups_wait_for_the_pause_of_the_credential_they_ask_with(
    proxy, sandbox, agent, rival_agent, ticket_body
):
    """An UNKNOWN effect is looked up with the credential that sent it: a pause answered to
    that credential moves its lookup (no check of its budget spent); another tenant's UNKNOWN
    effect is looked up meanwhile. Neither is ever sent again."""
    from datetime import timedelta

    from django.utils import timezone

    from gateway import services
    from gateway.choices import Outcome
    from gateway.providers.base import CallResult
    from reconciliation.services import reconcile_next_batch

    assert set_secret("acme", ACME).status_code == 201
    proxy.add("drop_after_forward", times=2)
    (mine,) = submitted(agent, ticket_body, ["acme-lost"])
    (theirs,) = submitted(rival_agent, ticket_body, ["globex-lost"])
    for effect_id in (mine, theirs):
        services.effect_dispatch(effect_id=effect_id, worker="test")
    assert statuses([mine, theirs]) == Counter({"UNKNOWN": 2})
    checks = Effect.objects.get(pk=mine).check_count
    paused = CallResult(Outcome.NOT_STARTED, "429", http_status=429, retry_after=30)
    protection.observe("tickets", [paused], credential=fingerprint(ACME))
    Effect.objects.filter(pk__in=[mine, theirs]).update(
        next_check_at=timezone.now() - timedelta(seconds=1)
    )
    reconcile_next_batch()
    held = Effect.objects.get(pk=mine)
    assert (held.status, held.check_count) == ("UNKNOWN", checks)
    assert held.next_check_at is not None
    assert held.next_check_at > timezone.now() + timedelta(seconds=25)
    assert Effect.objects.get(pk=theirs).status == "CONFIRMED"  # the deployment's: asked
    gets = [e for e in proxy.events if e["method"] == "GET"]
    assert {e["headers"].get("authorization") for e in gets} == {f"Bearer {DEPLOYMENT}"}
    assert sent_once(sandbox, [mine, theirs])


def test_a_narrow_drain_claims_no_more_than_its_slots_across_credentials(
    proxy, sandbox, agent, rival_agent, ticket_body, monkeypatch
):
    """One slot, two tenant credentials with effects due: each claim asks the earliest
    credential for the one slot only; every effect goes out once."""
    from gateway import fastpath_batch

    assert set_secret("acme", ACME).status_code == 201
    assert set_secret("globex", GLOBEX).status_code == 201
    ids = submitted(agent, ticket_body, ["acme-0", "acme-1"])
    ids += submitted(rival_agent, ticket_body, ["globex-0", "globex-1"])
    sizes: list[int] = []
    original = fastpath_batch.claim_sent_with

    def counted(**kwargs):
        sizes.append(len(kwargs["keys"]))
        return original(**kwargs)

    monkeypatch.setattr(dispatcher, "claim_sent_with", counted)
    deadline = time.monotonic() + 10
    while not confirmed(ids):
        assert time.monotonic() < deadline
        dispatcher.drain(flag=None, worker="test", limit=1)
        time.sleep(0.02)
    assert sizes and max(sizes) == 1
    assert sent_once(sandbox, ids)
