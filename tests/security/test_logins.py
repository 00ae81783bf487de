"""Login lockout per (username, client address), with backoff, from trusted proxies only
(django-axes, gateway/logins.py): nobody can lock someone else out from elsewhere."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db.models import F
from django.test import Client

pytestmark = pytest.mark.django_db

RIGHT = "right-password-1"
A, B = "198.51.100.7", "203.0.113.9"


@pytest.fixture(autouse=True)
def lockout_on(settings):
    settings.AXES_ENABLED = True
    settings.GATEWAY_LOGIN_MAX_FAILURES = 5
    settings.GATEWAY_LOGIN_LOCKOUT = 15 * 60
    settings.GATEWAY_TRUSTED_PROXIES = []


def person(name: str) -> str:
    call_command(
        "issue_token",
        *("--tenant", "acme", "--principal", name, "--role", "operator", "--password", RIGHT),
        stdout=io.StringIO(),
    )
    return f"{name}@acme"


@pytest.fixture
def olive() -> str:
    return person("olive")


def login(username: str, password: str, path: str = "/login", **meta: str):
    return Client(**meta).post(path, {"username": username, "password": password})


def fail(username: str, times: int, **meta: str) -> None:
    for _ in range(times):
        assert login(username, "wrong", **meta).status_code in (200, 429)


def travel(seconds: float) -> None:
    """Move every recorded failure into the past, as if ``seconds`` had gone by."""
    from axes.models import AccessAttempt, AccessAttemptExpiration

    delta = timedelta(seconds=seconds)
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - delta)
    AccessAttemptExpiration.objects.update(expires_at=F("expires_at") - delta)


@pytest.mark.parametrize("path", ["/login", "/admin/login/"])
def test_failures_lock_the_pair_with_a_readable_429(olive, path):
    fail(olive, 5, REMOTE_ADDR=A)
    locked = login(olive, RIGHT, path, REMOTE_ADDR=A)
    assert locked.status_code == 429
    assert int(locked["Retry-After"]) > 0
    html = locked.content.decode()
    assert 'role="alert"' in html and "locked for" in html
    assert "_auth_user_id" not in locked.wsgi_request.session


def test_failures_from_one_address_do_not_lock_the_user_at_another(olive):
    fail(olive, 5, REMOTE_ADDR=A)
    assert login(olive, RIGHT, REMOTE_ADDR=A).status_code == 429
    assert login(olive, RIGHT, REMOTE_ADDR=B).status_code == 302


def test_fifty_failures_from_one_address_do_not_lock_the_others_behind_it(olive):
    oscar = person("oscar")
    # A password spray from one address (a shared NAT, an office): 50 failures over 10 names.
    for name in [olive] + [f"guess{n}@acme" for n in range(9)]:
        fail(name, 5, REMOTE_ADDR=A)
    assert login(oscar, RIGHT, REMOTE_ADDR=A).status_code == 302


def test_forwarded_for_is_ignored_from_an_untrusted_peer(olive):
    # Each attempt claims another client address; the peer is the same untrusted one.
    for hop in range(5):
        login(olive, "wrong", REMOTE_ADDR=A, HTTP_X_FORWARDED_FOR=f"192.0.2.{hop}")
    assert login(olive, RIGHT, REMOTE_ADDR=A, HTTP_X_FORWARDED_FOR="192.0.2.99").status_code == 429
    # Another peer claiming to forward for A is judged as itself.
    assert login(olive, RIGHT, REMOTE_ADDR=B, HTTP_X_FORWARDED_FOR=A).status_code == 302


def test_forwarded_for_is_honoured_from_a_trusted_proxy(olive, settings):
    settings.GATEWAY_TRUSTED_PROXIES = ["10.0.0.0/8"]
    proxy = {"REMOTE_ADDR": "10.0.0.2"}
    # A client's own forged hop on the left is not the address the proxy saw.
    fail(olive, 5, HTTP_X_FORWARDED_FOR=f"1.2.3.4, {A}", **proxy)
    assert login(olive, RIGHT, HTTP_X_FORWARDED_FOR=A, **proxy).status_code == 429
    assert login(olive, RIGHT, HTTP_X_FORWARDED_FOR=B, **proxy).status_code == 302


def test_the_lock_lifts_after_the_cool_off_and_grows_with_each_attempt(olive):
    fail(olive, 5, REMOTE_ADDR=A)
    travel(15 * 60 + 1)
    assert login(olive, RIGHT, REMOTE_ADDR=A).status_code == 302

    fail(olive, 5, REMOTE_ADDR=A)
    assert login(olive, RIGHT, REMOTE_ADDR=A).status_code == 429  # an attempt while locked
    travel(15 * 60 + 1)
    assert login(olive, RIGHT, REMOTE_ADDR=A).status_code == 429  # doubled: 30 minutes now
    travel(2 * 30 * 60 + 1)  # ... and that attempt doubled it again
    assert login(olive, RIGHT, REMOTE_ADDR=A).status_code == 302


def test_a_successful_login_resets_the_count(olive):
    from axes.models import AccessAttempt

    fail(olive, 4, REMOTE_ADDR=A)
    # Counted in the database, which every web node shares.
    assert AccessAttempt.objects.get(username=olive, ip_address=A).failures_since_start == 4
    assert login(olive, RIGHT, REMOTE_ADDR=A).status_code == 302
    assert not AccessAttempt.objects.filter(username=olive).exists()
    fail(olive, 4, REMOTE_ADDR=A)
    assert login(olive, RIGHT, REMOTE_ADDR=A).status_code == 302


def test_a_malformed_trusted_proxy_setting_fails_loudly():
    from django.core.exceptions import ImproperlyConfigured

    from gateway.lib.client_ip import parse_networks

    with pytest.raises(ImproperlyConfigured, match="not-a-cidr"):
        parse_networks(["10.0.0.0/8", "not-a-cidr"])
