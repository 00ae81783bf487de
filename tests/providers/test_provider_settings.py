"""GATEWAY_PROVIDERS: the entries a deployment writes (good and bad), the start-up checks that
name the provider and the problem, which adapter the registry builds, and the credential: read
from the environment or a file, shown only as a fingerprint, never logged."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from django.core import checks

from gateway import contracts
from gateway.checks import CONTRACTS_TAG
from gateway.contracts import CONTRACTS
from gateway.providers import registry
from gateway.providers.base import ProviderConfig
from gateway.providers.config import entry_problems, fingerprint
from gateway.providers.http import HttpProviderAdapter
from gateway.providers.stripe import StripeAdapter

SECRET = "sk_test_0123456789abcdefSECRET"


@pytest.fixture(autouse=True)
def _fresh_adapters():
    registry.forget_adapters()
    yield
    registry.forget_adapters()


def stripe_entry(**changes: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "adapter": "stripe",
        "base_url": "http://127.0.0.1:9",
        "credential": {"env": "TEST_STRIPE_KEY"},
        "options": {"default_source": "tok_visa"},
    }
    entry.update(changes)
    return entry


def messages(settings, providers: dict[str, Any]) -> list[checks.CheckMessage]:
    settings.GATEWAY_PROVIDERS = providers
    return checks.run_checks(tags=[CONTRACTS_TAG])


# --- entries -------------------------------------------------------------------------------


def test_a_complete_entry_has_no_problem(monkeypatch):
    monkeypatch.setenv("TEST_STRIPE_KEY", SECRET)
    assert entry_problems("billing", stripe_entry(timeout=5)) == []


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (stripe_entry(adapter="soap"), "unknown adapter 'soap'"),
        (stripe_entry(adapter="acme.nowhere.factory"), "module acme.nowhere cannot be imported"),
        (stripe_entry(adapter="gateway.providers.http.no_such"), "has no callable 'no_such'"),
        (stripe_entry(base_url=""), "base_url is missing"),
        (stripe_entry(options={"default_sauce": "x"}), "option 'default_sauce' is not one"),
        (stripe_entry(timeout=0), "timeout must be a positive number"),
        (stripe_entry(timeout=10_000), "must be under half of GATEWAY_DISPATCH_LEASE"),
        (stripe_entry(api_key="x"), "unknown key 'api_key'"),
        (stripe_entry(credential={"env": "NOT_SET_ANYWHERE_1"}), "NOT_SET_ANYWHERE_1 is not set"),
        (stripe_entry(credential={"file": "/nonexistent/key"}), "no file at /nonexistent/key"),
        ("https://api.stripe.com", "the entry must be a JSON object"),
    ],
)
def test_a_bad_entry_names_the_provider_and_the_problem(monkeypatch, entry, expected):
    monkeypatch.setenv("TEST_STRIPE_KEY", SECRET)
    problems = entry_problems("billing", entry)
    assert any(expected in problem for problem in problems), problems
    assert all(problem.startswith("provider 'billing'") for problem in problems), problems


@pytest.mark.parametrize("credential", [SECRET, {"value": SECRET}, {"env": SECRET, "file": "x"}])
def test_an_inline_secret_is_refused_without_being_repeated(credential):
    problems = entry_problems("billing", stripe_entry(credential=credential))
    assert problems and "never the secret itself" in problems[0]
    assert not any(SECRET in problem for problem in problems)


def test_a_credential_file_is_read_and_an_empty_one_refused(tmp_path):
    key = tmp_path / "stripe.key"
    key.write_text(SECRET + "\n")
    assert entry_problems("billing", stripe_entry(credential={"file": str(key)})) == []
    key.write_text("\n")
    assert entry_problems("billing", stripe_entry(credential={"file": str(key)})) == [
        f"provider 'billing': credential: the file {key} is empty"
    ]


def test_the_fingerprint_shows_a_hash_prefix_and_the_last_four_only():
    shown = fingerprint(SECRET)
    assert shown == f"sha256:{hashlib.sha256(SECRET.encode()).hexdigest()[:12]}…CRET"
    assert fingerprint("short-key") == f"sha256:{hashlib.sha256(b'short-key').hexdigest()[:12]}"
    assert fingerprint("") == ""


# --- the start-up checks -------------------------------------------------------------------


def test_the_check_passes_a_good_configuration(settings, monkeypatch):
    monkeypatch.setenv("TEST_STRIPE_KEY", SECRET)
    assert [m for m in messages(settings, {"billing": stripe_entry()}) if m.is_serious()] == []


def test_the_check_names_the_provider_and_the_missing_credential(settings):
    found = messages(settings, {"billing": stripe_entry(credential={"env": "NOT_SET_ANYWHERE_2"})})
    errors = [m for m in found if m.id == "gateway.E111"]
    assert [m.msg for m in errors] == [
        "provider 'billing': credential: environment variable NOT_SET_ANYWHERE_2 is not set "
        "or empty"
    ]


def test_the_check_builds_the_adapter_of_each_contract(settings, monkeypatch):
    """Stripe cannot send tickets: the entry is well formed, the build says why not."""
    monkeypatch.setenv("TEST_STRIPE_KEY", SECRET)
    found = messages(settings, {"tickets": stripe_entry()})
    errors = [m.msg for m in found if m.id == "gateway.E112"]
    assert errors and all("the Stripe adapter does not serve" in msg for msg in errors), errors
    assert any("ticket.create" in msg for msg in errors)


def test_the_check_warns_of_an_entry_no_contract_uses(settings, monkeypatch):
    monkeypatch.setenv("TEST_STRIPE_KEY", SECRET)
    found = messages(settings, {"biling": stripe_entry()})
    assert [m.id for m in found if m.id.startswith("gateway.W111")] == ["gateway.W111"]


def test_a_provider_configured_only_in_gateway_providers_has_an_adapter(settings, monkeypatch):
    monkeypatch.setenv("TEST_STRIPE_KEY", SECRET)
    settings.GATEWAY_PROVIDER_URLS = {
        k: v for k, v in settings.GATEWAY_PROVIDER_URLS.items() if k != "billing"
    }
    assert any(m.id == "gateway.E105" for m in messages(settings, {}))  # nothing reaches it
    assert [m for m in messages(settings, {"billing": stripe_entry()}) if m.is_serious()] == []


# --- the registry's choice -----------------------------------------------------------------


def test_a_provider_not_configured_stays_on_the_spec_6_adapter(settings):
    settings.GATEWAY_PROVIDERS = {}
    adapter = registry.adapter_for(CONTRACTS["billing.charge.create"])
    assert isinstance(adapter, HttpProviderAdapter)
    assert registry.sender_of(CONTRACTS["billing.charge.create"]).attempt_fields() == {
        "adapter": None,
        "credential_fingerprint": None,
    }


def test_a_stripe_entry_builds_the_stripe_adapter_with_its_credential(settings, monkeypatch):
    monkeypatch.setenv("TEST_STRIPE_KEY", SECRET)
    settings.GATEWAY_PROVIDERS = {"billing": stripe_entry()}
    contract = CONTRACTS["billing.refund.create"]
    adapter = registry.adapter_for(contract)
    assert isinstance(adapter, StripeAdapter) and adapter.default_source == "tok_visa"
    assert adapter.api_base == "http://127.0.0.1:9" and adapter.contract is contract
    assert registry.sender_of(contract) == registry.Sender("stripe", fingerprint(SECRET))
    assert SECRET not in repr(adapter)
    # Built once per configuration: the same object until the configuration changes.
    assert registry.adapter_for(contract) is adapter
    settings.GATEWAY_PROVIDERS = {"billing": stripe_entry(base_url="http://127.0.0.1:10")}
    assert registry.adapter_for(contract).api_base == "http://127.0.0.1:10"


def test_an_entry_timeout_replaces_the_global_one(settings, monkeypatch, sandbox):
    monkeypatch.setenv("TEST_STRIPE_KEY", SECRET)
    settings.GATEWAY_PROVIDERS = {"billing": stripe_entry(timeout=3)}
    adapter = registry.adapter_for(CONTRACTS["billing.charge.create"])
    assert adapter.timeout == 3  # type: ignore[attr-defined]
    assert isinstance(adapter.adapter, StripeAdapter)  # type: ignore[attr-defined]


def _recording_factory(config: ProviderConfig) -> Any:
    made.append(config)
    return HttpProviderAdapter(config.base_url or "http://pack.invalid")


made: list[ProviderConfig] = []
FACTORY = f"{__name__}._recording_factory"


def test_the_deployment_entry_overrides_a_pack_factory(settings, monkeypatch):
    """A pack's factory serves its provider; an entry naming another adapter wins; an entry
    that names no adapter gives the pack's factory its URL, credential and options."""
    monkeypatch.setitem(contracts.ADAPTERS, "tickets", _recording_factory)
    monkeypatch.setenv("TICKETS_TOKEN", SECRET)
    made.clear()
    contract = CONTRACTS["ticket.create"]
    settings.GATEWAY_PROVIDERS = {}
    registry.adapter_for(contract)
    assert made[-1].credential == "" and registry.sender_of(contract).adapter == FACTORY

    settings.GATEWAY_PROVIDERS = {"tickets": {"adapter": "http", "base_url": "http://t.invalid"}}
    count = len(made)
    assert registry.adapter_for(contract).base_url == "http://t.invalid"  # type: ignore[attr-defined]
    assert len(made) == count and registry.sender_of(contract).adapter == "http"

    settings.GATEWAY_PROVIDERS = {
        "tickets": {
            "base_url": "http://own.invalid",
            "credential": {"env": "TICKETS_TOKEN"},
            "options": {"queue": "ops"},
        }
    }
    registry.adapter_for(contract)
    assert made[-1].base_url == "http://own.invalid" and made[-1].credential == SECRET
    assert made[-1].options == {"queue": "ops"} and SECRET not in repr(made[-1])
    assert registry.sender_of(contract) == registry.Sender(FACTORY, fingerprint(SECRET))


def test_a_dotted_path_names_any_factory(settings):
    settings.GATEWAY_PROVIDERS = {"tickets": {"adapter": FACTORY, "base_url": "http://d.invalid"}}
    assert registry.adapter_for(CONTRACTS["ticket.create"]).base_url == "http://d.invalid"  # type: ignore[attr-defined]
    assert registry.sender_of(CONTRACTS["ticket.create"]).adapter == FACTORY


def test_a_rest_entry_reaches_the_rest_adapter_with_its_credential_as_a_header(
    settings, monkeypatch
):
    """The "rest" kind hands the declarative REST adapter its entry: the declaration and
    headers from the options, the base URL and timeout, and the credential as a header."""
    import sys
    import types

    received: list[tuple[str, dict]] = []
    fake = types.ModuleType("gateway.providers.rest")
    fake.adapter_from_config = lambda name, entry: (
        received.append((name, entry))
        or (  # type: ignore[attr-defined]
            HttpProviderAdapter(entry["base_url"])
        )
    )
    monkeypatch.setitem(sys.modules, "gateway.providers.rest", fake)
    monkeypatch.setattr("gateway.providers.rest", fake, raising=False)
    monkeypatch.setenv("DEPLOY_TOKEN", SECRET)
    entry = {
        "adapter": "rest",
        "base_url": "https://deploy.invalid/api",
        "timeout": 4,
        "credential": {"env": "DEPLOY_TOKEN"},
        "options": {"spec_file": "/etc/deploy.json", "credential_header": "X-Api-Key"},
    }
    assert entry_problems("deploy", entry) == []
    settings.GATEWAY_PROVIDERS = {"deploy": entry}
    contract = next(c for c in CONTRACTS.values() if c.provider == "deploy")
    registry.adapter_for(contract)
    assert received == [
        (
            "deploy",
            {
                "spec_file": "/etc/deploy.json",
                "base_url": "https://deploy.invalid/api",
                "timeout": 4.0,
                "headers": {"X-Api-Key": f"Bearer {SECRET}"},
            },
        )
    ]
    assert registry.sender_of(contract) == registry.Sender("rest", fingerprint(SECRET))
    assert "option 'spek'" in entry_problems("deploy", {**entry, "options": {"spek": {}}})[0]


def test_the_demos_real_providers_pass_their_own_check(settings, monkeypatch):
    """``--providers real``: billing on Stripe with the demo's key, an entry the environment
    already has kept over the demo's, and the whole configuration clean for the check."""
    import json

    from gateway.management.commands import demo

    monkeypatch.setenv("GATEWAY_PROVIDERS", json.dumps({"mail": {"base_url": "http://m.invalid"}}))
    monkeypatch.delenv(demo.STRIPE_KEY_ENV, raising=False)
    environment = demo.real_providers_environment("http://127.0.0.1:12111")
    providers = json.loads(environment["GATEWAY_PROVIDERS"])
    assert providers["billing"]["adapter"] == "stripe"
    assert providers["billing"]["credential"] == {"env": demo.STRIPE_KEY_ENV}
    assert providers["mail"] == {"base_url": "http://m.invalid"}
    assert environment[demo.STRIPE_KEY_ENV].startswith("sk_test_")
    monkeypatch.setenv(demo.STRIPE_KEY_ENV, environment[demo.STRIPE_KEY_ENV])
    assert [m for m in messages(settings, providers) if m.is_serious()] == []
    adapter = registry.adapter_for(CONTRACTS["billing.refund.create"])
    assert isinstance(adapter, StripeAdapter) and adapter.default_source == "tok_visa"
