"""Contract modules (GATEWAY_CONTRACT_MODULES): loaded all or nothing per module, and every
kind of bad declaration reported by ``manage.py check`` with its module, type and problem."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from gateway.contracts import ADAPTERS, CONTRACTS, get_contract, loading
from gateway.contracts.demo import CONTRACTS as DEMO
from gateway.providers.http import HttpProviderAdapter
from gateway.providers.registry import adapter_for

ROOT = Path(__file__).resolve().parents[2]
DEMO_MODULE = "gateway.contracts.demo"

# What every generated module starts with: contract(type, **changes) builds a valid one.
HEADER = """
from gateway.choices import EffectClass
from gateway.contracts import ApprovalPolicy, EffectContract


def contract(type, **changes):
    fields = dict(
        type=type,
        provider="billing",
        effect_class=EffectClass.EXTERNAL_WRITE,
        description="A test type.",
        resource_type="thing",
        payload_schema={
            "type": "object",
            "properties": {"name": {"type": "string"}, "amount": {"type": "integer"}},
            "required": ["name"],
        },
        example={"resource": {"type": "thing", "id": "t1"}, "payload": {"name": "n"}},
        owner="team-test",
        commit_semantics="Exists once answered.",
        completion_semantics="done",
    )
    fields.update(changes)
    return EffectContract(**fields)
"""


@pytest.fixture
def write_module(tmp_path, monkeypatch):
    """Write a contract module under a name of its own; returns its name."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(body: str, *, header: bool = True) -> str:
        name = f"team_{uuid.uuid4().hex[:10]}"
        source = (HEADER if header else "") + textwrap.dedent(body)
        (tmp_path / f"{name}.py").write_text(source)
        return name

    return write


def check_errors(settings, *modules: str) -> str:
    """Load the demo pack and ``modules`` as the settings would, run ``manage.py check``,
    and return what it reported (it must fail)."""
    settings.GATEWAY_CONTRACT_MODULES = [DEMO_MODULE, *modules]
    with pytest.raises(SystemCheckError) as failed:
        call_command("check", stdout=io.StringIO(), stderr=io.StringIO())
    return str(failed.value)


def test_the_demo_pack_loads_cleanly_from_the_default_setting(settings):
    assert settings.GATEWAY_CONTRACT_MODULES == [DEMO_MODULE]
    assert list(CONTRACTS) == [c.type for c in DEMO]
    loaded = loading.current()
    assert loaded.problems == []
    assert loading.provider_problems(loaded, settings.GATEWAY_PROVIDER_URLS) == []
    out = io.StringIO()
    call_command("check", stdout=out)
    assert "no issues" in out.getvalue()


def test_an_unimportable_module_is_an_error(settings, write_module):
    broken = write_module("raise RuntimeError('no database here')\n")
    report = check_errors(settings, broken, "no_such_team_module")
    assert f"gateway.E101) {broken}: cannot be imported: RuntimeError: no database here" in report
    assert "no_such_team_module: cannot be imported: ModuleNotFoundError" in report


def test_no_module_at_all_is_an_error(settings):
    settings.GATEWAY_CONTRACT_MODULES = []
    with pytest.raises(SystemCheckError, match=r"gateway.E102\) GATEWAY_CONTRACT_MODULES: names"):
        call_command("check", stdout=io.StringIO(), stderr=io.StringIO())


def test_a_module_without_contracts_is_an_error(settings, write_module):
    empty = write_module("CONTRACTS = []\n")
    nothing = write_module("ADAPTERS = {}\n")
    report = check_errors(settings, empty, nothing)
    assert f"gateway.E102) {empty}: exposes no contracts" in report
    assert f"gateway.E102) {nothing}: exposes no contracts" in report


def test_a_schema_that_is_not_json_schema_is_an_error_and_its_module_is_not_loaded(
    settings, write_module
):
    bad = write_module("""
        CONTRACTS = [
            contract("team.good"),
            contract("team.bad", payload_schema={"type": "objekt"}),
        ]
    """)
    report = check_errors(settings, bad)
    assert f"gateway.E103) {bad}: team.bad: payload_schema is not valid JSON Schema" in report
    assert "'objekt' is not valid" in report
    # Never half-loaded: the module's good contract is not there either.
    assert get_contract("team.good") is None and get_contract("team.bad") is None
    assert get_contract("billing.refund.create") is not None  # the other modules are


def test_an_approval_rule_on_a_field_the_schema_lacks_is_an_error(settings, write_module):
    bad = write_module("""
        CONTRACTS = [
            contract(
                "team.pay",
                approval=ApprovalPolicy("rule", "Big ones.", "amount_cents", ">", 100),
            )
        ]
    """)
    report = check_errors(settings, bad)
    assert (
        f"gateway.E104) {bad}: team.pay: the approval rule reads field 'amount_cents', which "
        "payload_schema does not have (it has: amount, name)"
    ) in report
    assert get_contract("team.pay") is None


def test_a_provider_with_no_adapter_and_no_url_is_an_error(settings, write_module):
    lonely = write_module('CONTRACTS = [contract("team.ping", provider="nowhere")]\n')
    report = check_errors(settings, lonely)
    assert (
        f"gateway.E105) {lonely}: team.ping: provider 'nowhere' has no adapter (ADAPTERS of a "
        "contract module) and no URL in GATEWAY_PROVIDER_URLS"
    ) in report
    # A URL for it (SPEC §6 adapter) settles it.
    settings.GATEWAY_PROVIDER_URLS = {**settings.GATEWAY_PROVIDER_URLS, "nowhere": "http://x"}
    call_command("check", stdout=io.StringIO())


def test_a_compensator_type_that_does_not_exist_is_an_error(settings, write_module):
    bad = write_module('CONTRACTS = [contract("team.open", compensator="team.close")]\n')
    report = check_errors(settings, bad)
    assert (
        f"gateway.E106) {bad}: team.open: compensator 'team.close' is not a loaded effect type"
    ) in report
    assert get_contract("team.open") is None


def test_a_compensator_in_another_module_counts(settings, write_module):
    opener = write_module('CONTRACTS = [contract("team.open", compensator="team.close")]\n')
    closer = write_module('CONTRACTS = [contract("team.close")]\n')
    settings.GATEWAY_CONTRACT_MODULES = [DEMO_MODULE, opener, closer]
    call_command("check", stdout=io.StringIO())
    assert get_contract("team.open").compensator == "team.close"


def test_a_type_declared_twice_is_an_error_naming_both_modules(settings, write_module):
    first = write_module('CONTRACTS = [contract("team.twice")]\n')
    second = write_module('CONTRACTS = [contract("team.twice"), contract("team.other")]\n')
    shadow = write_module('CONTRACTS = [contract("ticket.create")]\n')
    report = check_errors(settings, first, second, shadow)
    assert f"gateway.E107) {second}: team.twice: declared twice: {first} declares it too" in (
        report
    )
    assert f"{shadow}: ticket.create: declared twice: {DEMO_MODULE} declares it too" in report
    # The first declaration stands; the later module is refused whole.
    assert loading.current().origin["team.twice"] == first
    assert get_contract("team.other") is None
    assert loading.current().origin["ticket.create"] == DEMO_MODULE


def test_an_adapter_declared_twice_for_one_provider_is_an_error(settings, write_module):
    body = 'CONTRACTS = [contract("team.{0}", provider="acme")]\nADAPTERS = {{"acme": dict}}\n'
    first, second = write_module(body.format("a")), write_module(body.format("b"))
    report = check_errors(settings, first, second)
    assert f"{second}: an adapter for provider 'acme' is declared twice: {first}" in report


def test_an_invalid_example_is_an_error(settings, write_module):
    bad = write_module("""
        CONTRACTS = [contract("team.ex", example={"resource": {}, "payload": {"amount": 1}})]
    """)
    report = check_errors(settings, bad)
    assert f"gateway.E109) {bad}: team.ex: example payload is invalid: 'name' is a required" in (
        report
    )


def test_a_changed_contract_that_keeps_its_version_is_a_warning(settings, write_module):
    changed = write_module("""
        CONTRACTS = [contract("team.v", version=3)]
        FINGERPRINTS = {"team.v": {3: "sha256:recorded-before-the-schema-changed"}}
    """)
    settings.GATEWAY_CONTRACT_MODULES = [DEMO_MODULE, changed]
    out, err = io.StringIO(), io.StringIO()
    call_command("check", stdout=out, stderr=err)  # a warning does not stop anything
    fingerprint = get_contract("team.v").fingerprint
    report = err.getvalue() + out.getvalue()
    assert (
        f"gateway.W101) {changed}: team.v: the schema or a policy changed but version is "
        f"still 3 (recorded sha256:recorded-before-the-schema-changed, now {fingerprint})"
    ) in report
    assert f'raise version to 4 and record its fingerprint {{4: "{fingerprint}"}}' in report


def test_the_fingerprint_follows_the_schema_and_policies_not_the_words():
    from dataclasses import replace

    ticket = get_contract("ticket.create")
    assert ticket.version == 1
    assert replace(ticket, description="Other words.").fingerprint == ticket.fingerprint
    assert replace(ticket, owner="someone-else").fingerprint == ticket.fingerprint
    wider = {**ticket.payload_schema, "required": ["title"]}
    assert replace(ticket, payload_schema=wider).fingerprint != ticket.fingerprint
    assert replace(ticket, compensator=None).fingerprint != ticket.fingerprint


def test_a_module_adapter_serves_its_provider_and_the_http_adapter_the_rest(settings, write_module):
    team = write_module("""
        class Adapter:
            def __init__(self, config):
                self.config = config

        CONTRACTS = [contract("team.call", provider="team-api")]
        ADAPTERS = {"team-api": Adapter}
    """)
    settings.GATEWAY_CONTRACT_MODULES = [DEMO_MODULE, team]
    settings.GATEWAY_PROVIDER_URLS = {**settings.GATEWAY_PROVIDER_URLS, "team-api": "http://t"}
    assert set(ADAPTERS) == {"team-api"}
    adapter = adapter_for(get_contract("team.call"))
    assert type(adapter).__name__ == "Adapter"
    assert (adapter.config.name, adapter.config.base_url) == ("team-api", "http://t")
    assert adapter.config.contract is get_contract("team.call")
    assert adapter_for(get_contract("team.call")) is adapter  # built once, not per call
    assert isinstance(adapter_for(get_contract("ticket.create")), HttpProviderAdapter)


def test_manage_py_check_fails_on_a_bad_module_named_in_the_environment(tmp_path):
    """The setting from the environment (JSON list), the real command, its exit status."""
    (tmp_path / "team_env_bad.py").write_text(
        HEADER + 'CONTRACTS = [contract("team.env", payload_schema={"type": 5})]\n'
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path),
        "GATEWAY_CONTRACT_MODULES": f'["{DEMO_MODULE}", "team_env_bad"]',
    }
    done = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "(gateway.E103) team_env_bad: team.env: payload_schema is not valid" in done.stderr


def test_a_worker_refuses_to_start_on_a_bad_module(tmp_path):
    """Checks stop a worker too: it exits before it consumes anything (its broker here
    does not even exist: a worker that started would wait for it until the timeout)."""
    env = {
        **os.environ,
        "GATEWAY_CONTRACT_MODULES": f"{DEMO_MODULE},no_such_team_module",
        "CELERY_BROKER_URL": "redis://127.0.0.1:1/0",
    }
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "gateway", "worker", "--pool", "solo"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "gateway.E101: no_such_team_module: cannot be imported" in done.stderr


def test_a_value_no_check_expected_is_an_error_not_a_crash(settings, write_module):
    odd = write_module("""
        CONTRACTS = [contract("team.odd", payload_schema={"type": "object", "enum": [{1, 2}]})]
    """)
    report = check_errors(settings, odd)
    assert f"gateway.E108) {odd}: team.odd: cannot be checked: CanonicalizationError" in report
    assert get_contract("team.odd") is None
