"""The environment's numbers (gateway.settings): a malformed value stops the process with its
name, and a setting whose documentation says "0 turns it off" takes 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from gateway.settings import env_int, env_number

# The settings documented with "0 turns it off" (docs/security.md, docs/guides/operations.md
# and the comments in gateway/settings.py), and what 0 does to each.
_OFF_AT_ZERO = {
    "GATEWAY_TOKEN_CACHE_TTL": "no token cache: a revocation is seen at the next request",
    "GATEWAY_REPLAY_MEMO": "no memo of known keys",
    "GATEWAY_PROVIDER_KEEPALIVE": "a new provider connection per call",
    "GATEWAY_DRAINERS": "no drainer threads in the worker",
    "GATEWAY_AGENT_TOKEN_TTL": "agents' tokens do not expire unless issued so",
    "GATEWAY_PERSON_TOKEN_TTL": "people's tokens do not expire unless issued so",
}

_PROBE = """
import json, os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")
from django.conf import settings
print(json.dumps(EXPRESSION))
"""


def _load_settings(expression: str, **env: str) -> subprocess.CompletedProcess:
    """A new process loading gateway.settings with ``env`` on top of this one's, printing
    ``expression`` (of ``settings``) as JSON."""
    return subprocess.run(
        [sys.executable, "-c", _PROBE.replace("EXPRESSION", expression)],
        cwd=settings.BASE_DIR,
        env={**os.environ, "PYTHONWARNINGS": "ignore", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _printed(done: subprocess.CompletedProcess):
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_setting_documented_as_off_at_zero_takes_zero():
    names = sorted(_OFF_AT_ZERO)
    done = _load_settings(
        f"{{name: getattr(settings, name) for name in {names!r}}}",
        **dict.fromkeys(names, "0"),
    )
    assert _printed(done) == dict.fromkeys(names, 0)


def test_a_connection_per_request_is_conn_max_age_zero():
    done = _load_settings(
        'settings.DATABASES["default"]["CONN_MAX_AGE"]', GATEWAY_DB_CONN_MAX_AGE="0"
    )
    assert _printed(done) == 0


def test_zero_stops_the_process_where_it_means_nothing():
    done = _load_settings("settings.GATEWAY_DISPATCH_LEASE", GATEWAY_DISPATCH_LEASE="0")
    assert done.returncode != 0
    assert "GATEWAY_DISPATCH_LEASE='0' must be positive" in done.stderr


@pytest.mark.parametrize("raw", ["-1", "nan", "inf", "ten"])
def test_a_number_that_is_not_one_is_refused_with_its_name(monkeypatch, raw):
    monkeypatch.setenv("GATEWAY_SOME_NUMBER", raw)
    with pytest.raises(ImproperlyConfigured, match="GATEWAY_SOME_NUMBER"):
        env_number("GATEWAY_SOME_NUMBER", 1, zero_turns_off=True)


def test_zero_is_a_value_only_where_it_turns_the_setting_off(monkeypatch):
    monkeypatch.setenv("GATEWAY_SOME_NUMBER", "0")
    assert env_int("GATEWAY_SOME_NUMBER", 3, zero_turns_off=True) == 0
    with pytest.raises(ImproperlyConfigured, match="must be positive"):
        env_int("GATEWAY_SOME_NUMBER", 3)
    monkeypatch.setenv("GATEWAY_SOME_NUMBER", "2.5")
    assert env_number("GATEWAY_SOME_NUMBER", 1) == 2.5
    with pytest.raises(ImproperlyConfigured, match="whole number"):
        env_int("GATEWAY_SOME_NUMBER", 3, zero_turns_off=True)
    monkeypatch.delenv("GATEWAY_SOME_NUMBER")
    assert env_int("GATEWAY_SOME_NUMBER", 3) == 3


@pytest.mark.parametrize(
    "raw, names",
    [
        ("", ["gateway.contracts.demo"]),
        ("gateway.contracts.demo, acme_effects", ["gateway.contracts.demo", "acme_effects"]),
        ('["gateway.contracts.demo", "acme_effects"]', ["gateway.contracts.demo", "acme_effects"]),
    ],
)
def test_contract_modules_are_a_json_list_or_comma_separated(monkeypatch, raw, names):
    from gateway.lib.env import env_names

    monkeypatch.setenv("GATEWAY_CONTRACT_MODULES", raw)
    assert env_names("GATEWAY_CONTRACT_MODULES", ["gateway.contracts.demo"]) == names


@pytest.mark.parametrize("raw", ['["acme_effects"', '["acme_effects", 3]', "[]"])
def test_malformed_contract_modules_stop_the_process(raw):
    done = _load_settings("settings.GATEWAY_CONTRACT_MODULES", GATEWAY_CONTRACT_MODULES=raw)
    assert done.returncode != 0
    assert "ImproperlyConfigured: GATEWAY_CONTRACT_MODULES" in done.stderr


def test_a_provider_tls_file_that_is_not_there_stops_the_start_up(tmp_path):
    missing = str(tmp_path / "nowhere.pem")
    done = _load_settings("settings.GATEWAY_PROVIDER_CA_BUNDLE", GATEWAY_PROVIDER_CA_BUNDLE=missing)
    assert done.returncode != 0
    assert f"GATEWAY_PROVIDER_CA_BUNDLE: no file at {missing}" in done.stderr
    key = tmp_path / "key.pem"
    key.write_text("not used")
    done = _load_settings(
        "settings.GATEWAY_PROVIDER_CLIENT_KEY", GATEWAY_PROVIDER_CLIENT_KEY=str(key)
    )
    assert done.returncode != 0
    assert "GATEWAY_PROVIDER_CLIENT_KEY is set without a CLIENT_CERT" in done.stderr
