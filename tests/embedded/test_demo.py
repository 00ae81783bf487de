"""The parts of `manage.py demo` a new user meets first: tokens that survive a restart, the
banner kept in var/demo.txt, and a port-in-use error that says how to move the demo."""

from __future__ import annotations

import io
import json
import socket

import pytest
from django.core.management.base import CommandError
from django.utils import timezone
from rest_framework.test import APIClient

from gateway.management.commands import demo
from gateway.models import ApiToken

pytestmark = pytest.mark.django_db


@pytest.fixture
def command(settings, tmp_path, monkeypatch):
    settings.VAR_DIR = tmp_path
    # The demo closes its connections before starting its children; the test's transaction
    # must stay open.
    monkeypatch.setattr(demo.connections, "close_all", lambda: None)
    return demo.Command(stdout=io.StringIO())


def authenticates(token: str) -> bool:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client.get("/api/v1/effects").status_code == 200


def test_each_principal_keeps_its_token_across_restarts(command, tmp_path):
    first = command.seed_demo_tenant()
    assert set(first) == {"demo-agent", "alice", "oscar", "admin"}
    assert command.seed_demo_tenant() == first
    assert ApiToken.objects.filter(principal__tenant__slug="demo").count() == 4
    assert all(authenticates(token) for token in first.values())
    saved = tmp_path / "demo-tokens.json"
    assert json.loads(saved.read_text()) == first
    assert saved.stat().st_mode & 0o077 == 0  # tokens: readable by their owner only


def test_a_revoked_token_is_replaced_on_the_next_start(command):
    first = command.seed_demo_tenant()
    ApiToken.objects.filter(prefix=first["alice"][:12]).update(revoked_at=timezone.now())
    second = command.seed_demo_tenant()
    assert second["alice"] != first["alice"] and authenticates(second["alice"])
    assert second["demo-agent"] == first["demo-agent"]


def test_the_banner_is_written_to_var_demo_txt(command, tmp_path):
    command.colour = False
    command.output_lock = demo.threading.Lock()
    tokens = command.seed_demo_tenant()
    command.print_banner("http://127.0.0.1:8000/", tokens, scenario=None, seconds=3)
    text = (tmp_path / "demo.txt").read_text()
    assert tokens["demo-agent"] in text and "alice@demo" in text
    assert "export GATEWAY_URL=http://127.0.0.1:8000" in text
    assert tokens["demo-agent"] in command.stdout.getvalue()


def test_a_port_in_use_names_demo_args():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError) as error:
            demo.ensure_ports_free([("127.0.0.1", port)])
    assert f"127.0.0.1:{port}" in str(error.value)
    assert 'DEMO_ARGS="--port' in str(error.value)


@pytest.mark.parametrize("bind", ["127.0.0.1", "0.0.0.0", "::1", "localhost"])
def test_the_console_url_is_localhost_where_passkeys_work(command, bind, settings):
    # Browsers give passkeys to a host name on a secure origin, never to 127.0.0.1, and the
    # seeded refunds wait for a passkey approval.
    base = demo.console_url(bind, 8000)
    assert base == "http://localhost:8000/"
    command.colour = False
    command.output_lock = demo.threading.Lock()
    command.print_banner(base, command.seed_demo_tenant(), scenario=None, seconds=1)
    banner = command.stdout.getvalue()
    assert "Console    http://localhost:8000/" in banner
    assert "export GATEWAY_URL=http://localhost:8000 " in banner
    assert "127.0.0.1" not in banner
    assert "localhost" in settings.ALLOWED_HOSTS
    assert settings.GATEWAY_WEBAUTHN_RP_ID == ""  # the RP id is the request's host name


def test_the_passkey_rp_id_of_a_demo_request_is_localhost(rf):
    from gateway.console.passkeys import origin_for, rp_id_for

    request = rf.get("/passkeys", HTTP_HOST="localhost:8000")
    assert rp_id_for(request) == "localhost"
    assert origin_for(request) == "http://localhost:8000"


def test_a_non_loopback_address_is_printed_as_given():
    assert demo.console_url("192.0.2.7", 8001) == "http://192.0.2.7:8001/"
