"""Login throttling for the console (``/login``) and the admin (``/admin/login/``).

After ``GATEWAY_LOGIN_MAX_FAILURES`` failed logins for one username within
``GATEWAY_LOGIN_LOCKOUT`` seconds, that username is locked for the rest of the window: its
login POSTs are answered 429 with ``Retry-After`` *before* the password is checked, so a right
guess during the lock learns nothing. One address gets ten times as many failures (across
usernames: password spraying). A successful login clears the username's count.

Why our own, not django-axes: this is twenty lines over the cache the API throttle already
shares between web nodes (``GATEWAY_CACHE_URL``), counts failures from Django's own
``user_login_failed`` signal (every login form and backend), and adds no tables, middleware
ordering rules or admin screens to keep up with. The cost of any lockout is that an attacker
can lock a known username for a window; the window is short and operators can log in with
another account. Counts live in the cache: with the default per-process memory cache each
web process counts on its own, so production sets ``GATEWAY_CACHE_URL``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from django.conf import settings
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.core.cache import cache
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse

LOGIN_PATHS = frozenset({"/login", "/admin/login/"})
ADDRESS_FACTOR = 10


def _key(kind: str, value: str) -> str:
    digest = hashlib.sha256(value.strip().lower().encode("utf-8", "replace")).hexdigest()[:32]
    return f"login-failures:{kind}:{digest}"


def _address(request: HttpRequest | None) -> str:
    return (request.META.get("REMOTE_ADDR") or "") if request is not None else ""


def _count(key: str) -> int:
    window = settings.GATEWAY_LOGIN_LOCKOUT
    cache.add(key, 0, timeout=window)  # the window starts at the first failure
    try:
        return cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.set(key, 1, timeout=window)
        return 1


@receiver(user_login_failed)
def _failed(sender, credentials: dict, request: HttpRequest | None = None, **kwargs) -> None:
    username = str(credentials.get("username") or "")
    if username:
        _count(_key("user", username))
    address = _address(request)
    if address:
        _count(_key("addr", address))


@receiver(user_logged_in)
def _succeeded(sender, request: HttpRequest | None, user, **kwargs) -> None:
    cache.delete(_key("user", user.get_username()))


def locked(username: str, address: str) -> bool:
    limit = settings.GATEWAY_LOGIN_MAX_FAILURES
    if username and (cache.get(_key("user", username)) or 0) >= limit:
        return True
    return bool(address) and (cache.get(_key("addr", address)) or 0) >= limit * ADDRESS_FACTOR


class LoginLockoutMiddleware:
    """Answer a locked login with 429 before any password is checked (module doc)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method == "POST" and request.path in LOGIN_PATHS:
            username = request.POST.get("username", "")
            if locked(username, _address(request)):
                response = HttpResponse(
                    "Too many failed logins: this login is locked for a while. Try again "
                    "later, or ask an operator.\n",
                    status=429,
                    content_type="text/plain",
                )
                response["Retry-After"] = str(settings.GATEWAY_LOGIN_LOCKOUT)
                return response
        return self.get_response(request)
