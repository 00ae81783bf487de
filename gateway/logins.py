"""Login throttling (django-axes' policy hooks): per (username, client address), with backoff.

Failed logins are counted by django-axes in the database, so every web node sees the same
counts, keyed by the pair (username, client address): failures from one address never lock
the same user logging in from another, and one address's failures for one username never lock
the other usernames behind it. The client address is the direct peer, or what a trusted proxy
(``GATEWAY_TRUSTED_PROXIES``) says in ``X-Forwarded-For`` (``gateway.lib.client_ip``).

After ``GATEWAY_LOGIN_MAX_FAILURES`` failures of a pair, the pair is locked for
``GATEWAY_LOGIN_LOCKOUT`` seconds; every attempt during the lock (the right password too: it
is not checked) counts as another failure and doubles the lock, up to
``GATEWAY_LOGIN_LOCKOUT_MAX``. A lock lifts by itself when no attempt came for its length; a
successful login clears the pair's count.
"""

from __future__ import annotations

from datetime import timedelta

from axes.helpers import get_client_username
from axes.models import AccessAttempt
from django.conf import settings
from django.db.models import Sum
from django.http import HttpRequest

# 2**32 lock lengths outlast any cap; the exponent is bounded so the arithmetic stays small.
_MAX_DOUBLINGS = 32


def failure_limit(request: HttpRequest | None = None, credentials: dict | None = None) -> int:
    """``AXES_FAILURE_LIMIT``: failures of one pair before it is locked."""
    return int(settings.GATEWAY_LOGIN_MAX_FAILURES)


def _failures(request: HttpRequest) -> int:
    credentials = getattr(request, "axes_credentials", None)
    username = get_client_username(request, credentials)
    address = getattr(request, "axes_ip_address", None)
    if not username or not address:
        return 0
    total = AccessAttempt.objects.filter(username=username, ip_address=address).aggregate(
        total=Sum("failures_since_start")
    )["total"]
    return int(total or 0)


def lock_length(failures: int) -> timedelta:
    """How long a pair with this many failures stays locked (or counts its failures)."""
    beyond = min(max(0, failures - failure_limit()), _MAX_DOUBLINGS)
    seconds = settings.GATEWAY_LOGIN_LOCKOUT * 2**beyond
    return timedelta(seconds=min(seconds, settings.GATEWAY_LOGIN_LOCKOUT_MAX))


def cool_off(request: HttpRequest | None = None) -> timedelta:
    """``AXES_COOLOFF_TIME``: the lock length of the request's (username, address) pair."""
    return lock_length(_failures(request) if request is not None else 0)
