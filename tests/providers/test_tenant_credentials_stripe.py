"""Two tenants with their own Stripe accounts: stripe-stateful-mock behind the conformance
kit's recording proxy, which keeps the ``Authorization`` header (the secret key) each request
carried to the server. Each tenant's charges and their lookups go out with its own key only;
a rotation between a lost answer and its lookup asks with the key that sent the charge, and
the mock holds exactly one charge per effect."""

from __future__ import annotations

import pytest
import stripe

from gateway import services
from gateway.models import Attempt, Effect
from gateway.providers import registry
from gateway.providers.config import fingerprint
from gateway.providers.conformance.proxy import FaultProxy
from reconciliation.services import effect_reconcile
from tests.conftest import Persona
from tests.providers.stripe_mock import API_KEY, StripeMock, node_missing

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(bool(node_missing()), reason=node_missing() or "node is here"),
]

DEPLOYMENT = "sk_test_deployment_account_0123456789"
ACME = "sk_test_acme_own_account_0123456789AAAA"
ACME_NEXT = "sk_test_acme_rolled_key_0123456789BBBB"
GLOBEX = "sk_test_globex_own_account_012345CCCC"


@pytest.fixture(scope="module")
def stripe_server():
    mock = StripeMock()
    mock.start()
    yield mock
    mock.stop()


@pytest.fixture
def proxy(settings, stripe_server, monkeypatch):
    monkeypatch.setenv("TEST_DEPLOYMENT_STRIPE", DEPLOYMENT)
    recorder = FaultProxy(
        stripe_server.url, record_headers=("Authorization", "Idempotency-Key")
    ).start()
    settings.GATEWAY_PROVIDERS = {
        "billing": {
            "adapter": "stripe",
            "base_url": recorder.url,
            "credential": {"env": "TEST_DEPLOYMENT_STRIPE"},
            "options": {"default_source": "tok_visa"},
        }
    }
    settings.GATEWAY_FAST_PATH = False
    registry.forget_adapters()
    yield recorder
    recorder.stop()
    registry.forget_adapters()


def charge(agent: Persona, order: str) -> str:
    answer = agent.submit(
        {
            "type": "billing.charge.create",
            "resource": {"type": "order", "id": order},
            "payload": {"amount": 1200, "currency": "EUR", "customer_id": "cus_42"},
            "intent": {"summary": f"charge {order}"},
        },
        f"charge-{order}",
    )
    assert answer.status_code == 201, answer.content
    effect_id = str(answer.json()["effect_id"])
    services.effect_dispatch(effect_id=effect_id, worker="test")
    return effect_id


def set_key(admin: Persona, secret: str, *, rotate: bool = False) -> None:
    url = "/api/v1/providers/billing/credentials" + ("/rotate" if rotate else "")
    answer = admin.client.post(url, {"secret": secret}, format="json")
    assert answer.status_code == 201, answer.content


def keys_by_effect(proxy: FaultProxy) -> dict[str, set[str]]:
    """Per provider key (the Idempotency-Key of the charge's POST), the secret keys it came with."""
    seen: dict[str, set[str]] = {}
    for event in proxy.events:
        if event["method"] == "POST" and event.get("forwarded"):
            key = event["headers"]["idempotency-key"]
            seen.setdefault(key, set()).add(event["headers"]["authorization"])
    return seen


def mock_charges(url: str, effect_id: str) -> int:
    oracle = stripe.StripeClient(API_KEY, base_addresses={"api": url}, max_network_retries=0)
    charges = oracle.v1.charges.list(params={"limit": 100}).auto_paging_iter()
    return sum(1 for c in charges if c.metadata.to_dict().get("effect_id") == effect_id)


def provider_key(effect_id: str) -> str:
    return Effect.objects.select_related("command").get(pk=effect_id).command.provider_key


def test_each_tenant_charges_its_own_stripe_account_and_a_rotation_sends_nothing_twice(
    proxy, stripe_server, agent, rival_agent
):
    acme_admin = Persona("acme", "acme-admin", "admin")
    set_key(acme_admin, ACME)
    set_key(Persona("globex", "globex-admin", "admin"), GLOBEX)
    mine = [charge(agent, f"ord_acme_{n}") for n in range(2)]
    theirs = [charge(rival_agent, f"ord_globex_{n}") for n in range(2)]
    proxy.add("drop_after_forward", method="POST", path="/v1/charges", times=1)
    lost = charge(agent, "ord_acme_lost")  # Stripe made the charge; the answer was lost
    assert Effect.objects.get(pk=lost).status == "UNKNOWN"
    set_key(acme_admin, ACME_NEXT, rotate=True)
    after = [charge(agent, f"ord_acme_after_{n}") for n in range(2)]
    effect_reconcile(effect_id=lost)
    assert Effect.objects.get(pk=lost).status == "CONFIRMED"

    assert keys_by_effect(proxy) == {
        **{provider_key(e): {f"Bearer {ACME}"} for e in [*mine, lost]},
        **{provider_key(e): {f"Bearer {GLOBEX}"} for e in theirs},
        **{provider_key(e): {f"Bearer {ACME_NEXT}"} for e in after},
    }
    lookups = [e for e in proxy.events if e["method"] == "GET"]
    assert lookups and {e["headers"]["authorization"] for e in lookups} == {f"Bearer {ACME}"}
    assert not any(DEPLOYMENT in str(e["headers"]) for e in proxy.events)
    for effect_id in [*mine, *theirs, lost, *after]:
        assert Effect.objects.get(pk=effect_id).status == "CONFIRMED"
        assert mock_charges(stripe_server.url, effect_id) == 1  # none twice
    assert Attempt.objects.get(effect_id=lost).credential_fingerprint == fingerprint(ACME)
