"""Which credential sends a tenant's effects, seen from the provider's side: the sandbox
provider behind the conformance kit's proxy, which records the ``Authorization`` header each
request carried when it reached the server. A tenant's effects carry its own active
credential, else the deployment's, never another tenant's; a rotation mid-stream sends
nothing twice (the sandbox's own log is the oracle), and the lookup of an effect sent before
the rotation asks with the credential that sent it."""

from __future__ import annotations

import logging

import pytest

from gateway import dispatcher, services
from gateway.models import Attempt, Effect, Principal
from gateway.providers import registry
from gateway.providers.config import fingerprint
from gateway.providers.conformance.proxy import FaultProxy
from reconciliation.services import effect_reconcile
from tests.conftest import Persona

pytestmark = pytest.mark.django_db

DEPLOYMENT = "deployment-tickets-token-0123-DDDD"
ACME = "acme-own-tickets-token-012345-AAAA"
ACME_NEXT = "acme-rotated-tickets-token-0123-BBBB"
GLOBEX = "globex-own-tickets-token-0123-CCCC"
HEADERS = ("Authorization", "Idempotency-Key")


@pytest.fixture
def proxy(settings, sandbox, sandbox_server, monkeypatch):
    """The tickets provider on the sandbox, through a recording proxy, with a deployment-wide
    bearer credential."""
    monkeypatch.setenv("TEST_DEPLOYMENT_TICKETS", DEPLOYMENT)
    base = sandbox_server.base_url("tickets")
    recorder = FaultProxy(base, record_headers=HEADERS).start()
    settings.GATEWAY_PROVIDERS = {
        "tickets": {
            "adapter": "http",
            "base_url": recorder.front(base),
            "credential": {"env": "TEST_DEPLOYMENT_TICKETS"},
        }
    }
    registry.forget_adapters()
    yield recorder
    recorder.stop()
    registry.forget_adapters()


def admin_of(tenant: str) -> Persona:
    return Persona(tenant, f"{tenant}-admin", "admin")


def set_secret(admin: Persona, secret: str, *, rotate: bool = False) -> None:
    url = "/api/v1/providers/tickets/credentials" + ("/rotate" if rotate else "")
    answer = admin.client.post(url, {"secret": secret}, format="json")
    assert answer.status_code == 201, answer.content


def submitted(agent: Persona, ticket_body: dict, key: str) -> str:
    body = {**ticket_body, "payload": {**ticket_body["payload"], "title": key}}
    answer = agent.submit(body, key)
    assert answer.status_code == 201, answer.content
    return str(answer.json()["effect_id"])


def dispatch(effect_ids: list[str], path: str) -> None:
    if path == "drain":
        assert dispatcher.drain(flag=None, worker="test") == len(effect_ids)
        return
    for effect_id in effect_ids:
        services.effect_dispatch(effect_id=effect_id, worker="test")


def carried(proxy: FaultProxy, method: str = "POST") -> dict[str, list[str]]:
    """Per provider key, the Authorization headers the server received for it."""
    seen: dict[str, list[str]] = {}
    for event in proxy.events:
        if event["method"] != method or not event.get("forwarded"):
            continue
        headers = event["headers"]
        key = headers.get("idempotency-key") or event["path"]
        seen.setdefault(key, []).append(headers.get("authorization", ""))
    return seen


def provider_key(effect_id: str) -> str:
    return Effect.objects.select_related("command").get(pk=effect_id).command.provider_key


@pytest.mark.parametrize("path", ["fast", "general", "drain"])
def test_each_tenants_effects_carry_only_its_own_credential(
    settings, proxy, sandbox, agent, rival_agent, ticket_body, path
):
    settings.GATEWAY_FAST_PATH = path != "general"
    set_secret(admin_of("acme"), ACME)
    mine = [submitted(agent, ticket_body, f"acme-{n}") for n in range(3)]
    theirs = [submitted(rival_agent, ticket_body, f"globex-{n}") for n in range(3)]
    dispatch(mine + theirs, path)
    set_secret(admin_of("globex"), GLOBEX)
    later = [submitted(rival_agent, ticket_body, f"globex-late-{n}") for n in range(2)]
    dispatch(later, path)

    expected = {
        **{provider_key(e): f"Bearer {ACME}" for e in mine},
        **{provider_key(e): f"Bearer {DEPLOYMENT}" for e in theirs},
        **{provider_key(e): f"Bearer {GLOBEX}" for e in later},
    }
    assert carried(proxy) == {key: [auth] for key, auth in expected.items()}
    for effect_id in mine + theirs + later:
        assert Effect.objects.get(pk=effect_id).status == "CONFIRMED"
    senders = {
        a.effect_id: a.credential_fingerprint
        for a in Attempt.objects.filter(effect_id__in=mine + theirs + later)
    }
    assert senders == {
        **dict.fromkeys(mine, fingerprint(ACME)),
        **dict.fromkeys(theirs, fingerprint(DEPLOYMENT)),
        **dict.fromkeys(later, fingerprint(GLOBEX)),
    }
    # The sandbox's own log: one operation per effect, none twice.
    keys = [op["idempotency_key"] for op in sandbox.operations(provider="tickets")]
    assert sorted(keys) == sorted(expected)


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast", "general"])
def test_a_rotation_mid_stream_sends_nothing_twice_and_lookups_ask_with_the_sender(
    settings, proxy, sandbox, agent, ticket_body, fast_path
):
    settings.GATEWAY_FAST_PATH = fast_path
    acme_admin = admin_of("acme")
    set_secret(acme_admin, ACME)
    before = [submitted(agent, ticket_body, f"before-{n}") for n in range(3)]
    # The first one reaches the sandbox, which commits it, and its answer is lost: UNKNOWN.
    proxy.add("drop_after_forward", method="POST", times=1)
    dispatch(before, "each")
    lost = before[0]
    assert Effect.objects.get(pk=lost).status == "UNKNOWN"

    set_secret(acme_admin, ACME_NEXT, rotate=True)
    after = [submitted(agent, ticket_body, f"after-{n}") for n in range(3)]
    dispatch(after, "each")

    old = acme_admin.client.get("/api/v1/providers/tickets/credentials").json()["results"]
    old_id = next(row["id"] for row in old if row["fingerprint"] == fingerprint(ACME))
    retire = f"/api/v1/providers/tickets/credentials/{old_id}/retire"
    refused = acme_admin.client.post(retire, {"reason": "rotated"}, format="json")
    assert refused.status_code == 409, refused.content  # the lost one still needs it
    assert refused.json()["unsettled"] == 1

    effect_reconcile(effect_id=lost)
    assert Effect.objects.get(pk=lost).status == "CONFIRMED"
    lookups = [e for e in proxy.events if e["method"] == "GET"]
    assert lookups and {e["headers"]["authorization"] for e in lookups} == {f"Bearer {ACME}"}
    assert acme_admin.client.post(retire, {"reason": "rotated"}, format="json").status_code == 200

    sent = carried(proxy)
    assert sent == {
        **{provider_key(e): [f"Bearer {ACME}"] for e in before},
        **{provider_key(e): [f"Bearer {ACME_NEXT}"] for e in after},
    }
    keys = [op["idempotency_key"] for op in sandbox.operations(provider="tickets")]
    assert sorted(keys) == sorted(provider_key(e) for e in before + after)  # none twice


def test_a_resend_after_not_started_keeps_the_credential_of_its_first_attempt(
    settings, proxy, sandbox, agent, ticket_body
):
    """A 429 before the rotation: nothing was executed, the same key is sent again later, to
    the same account (the rotated credential still serves it)."""
    settings.GATEWAY_FAST_PATH = False
    acme_admin = admin_of("acme")
    set_secret(acme_admin, ACME)
    effect_id = submitted(agent, ticket_body, "throttled")
    proxy.add("answer", method="POST", times=1, status=429, headers={"Retry-After": "0"})
    dispatch([effect_id], "each")
    assert Effect.objects.get(pk=effect_id).status == "NOT_STARTED"
    set_secret(acme_admin, ACME_NEXT, rotate=True)
    dispatch([effect_id], "each")
    assert Effect.objects.get(pk=effect_id).status == "CONFIRMED"
    auths = [e["headers"]["authorization"] for e in proxy.events if e["method"] == "POST"]
    assert auths == [f"Bearer {ACME}", f"Bearer {ACME}"]
    assert len(sandbox.operations(idempotency_key=provider_key(effect_id))) == 1


def test_a_forced_retirement_leaves_the_lookup_to_a_human_never_another_credential(
    settings, proxy, sandbox, agent, ticket_body
):
    settings.GATEWAY_FAST_PATH = False
    acme_admin = admin_of("acme")
    set_secret(acme_admin, ACME)
    effect_id = submitted(agent, ticket_body, "forced")
    proxy.add("drop_after_forward", method="POST", times=1)
    dispatch([effect_id], "each")
    assert Effect.objects.get(pk=effect_id).status == "UNKNOWN"
    row = acme_admin.client.get("/api/v1/providers/tickets/credentials").json()["results"][0]
    forced = acme_admin.client.post(
        f"/api/v1/providers/tickets/credentials/{row['id']}/retire",
        {"reason": "leaked", "force": True},
        format="json",
    )
    assert forced.status_code == 200, forced.content
    record = effect_reconcile(effect_id=effect_id)
    assert record is not None and record.outcome == "inconclusive"
    assert "retired" in record.evidence
    assert Effect.objects.get(pk=effect_id).status == "UNKNOWN"  # never resent
    assert not [e for e in proxy.events if e["method"] == "GET"]  # nobody asked in its place
    assert len(sandbox.operations(idempotency_key=provider_key(effect_id))) == 1


def test_the_secrets_are_in_no_log_record_of_a_dispatch(
    settings, proxy, sandbox, agent, ticket_body, caplog
):
    caplog.set_level(logging.DEBUG)
    acme_admin = admin_of("acme")
    set_secret(acme_admin, ACME)
    first = submitted(agent, ticket_body, "logged-1")
    proxy.add("drop_after_forward", method="POST", times=1)
    dispatch([first], "each")
    set_secret(acme_admin, ACME_NEXT, rotate=True)
    dispatch([submitted(agent, ticket_body, "logged-2")], "each")
    effect_reconcile(effect_id=first)
    assert caplog.records, "nothing was logged: the check below would prove nothing"
    for record in caplog.records:
        text = record.getMessage() + repr(record.__dict__)
        for secret in (ACME, ACME_NEXT, DEPLOYMENT):
            assert secret not in text
    assert Principal.objects.filter(role="admin").exists()
