"""Long polls (``?wait=``) within bounds, so that they cannot starve the web tier.

A wait holds a web thread (WSGI) for up to ``GATEWAY_MAX_WAIT`` seconds. Twenty waits from one
token once held all sixteen threads and ``/healthz`` took 11 s. Two caps, each answered with
429 and ``Retry-After`` (the caller polls again later; nothing is lost):

* per token (or console login), ``GATEWAY_MAX_WAITS_PER_TOKEN`` open waits at once, counted in
  the shared cache so the cap holds across web nodes when ``GATEWAY_CACHE_URL`` is set;
* per web process, ``GATEWAY_MAX_WAITS_PER_PROCESS``: keep it below the process's thread count
  so threads always remain for everything else (health checks, submissions).

A crashed process cannot leak a slot for long: each counter expires after a wait's longest
possible life.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from django.conf import settings
from django.core.cache import cache
from rest_framework import exceptions
from rest_framework.request import Request

from gateway.models import ApiToken

_process_lock = threading.Lock()
_process_open = 0


class TooManyWaits(exceptions.Throttled):
    default_detail = "Too many long polls open."


def _holder(request: Request) -> str:
    if isinstance(request.auth, ApiToken):
        return f"token:{request.auth.pk}"
    user = request.user
    return f"user:{getattr(user, 'pk', 'anonymous')}"


@contextmanager
def wait_slot(request: Request) -> Iterator[None]:
    """Hold one long-poll slot for the caller, or raise TooManyWaits (429, Retry-After)."""
    global _process_open
    retry = 1
    with _process_lock:
        if _process_open >= settings.GATEWAY_MAX_WAITS_PER_PROCESS:
            raise TooManyWaits(
                wait=retry,
                detail="This web node has as many long polls open as it serves; poll again "
                "shortly.",
            )
        _process_open += 1
    key = f"waits:{_holder(request)}"
    counted = False
    try:
        cache.add(key, 0, timeout=int(settings.GATEWAY_MAX_WAIT) + 30)
        try:
            open_now = cache.incr(key)
            counted = True
        except ValueError:  # expired between add and incr: start again
            cache.set(key, 1, timeout=int(settings.GATEWAY_MAX_WAIT) + 30)
            open_now, counted = 1, True
        if open_now > settings.GATEWAY_MAX_WAITS_PER_TOKEN:
            raise TooManyWaits(
                wait=retry,
                detail=f"At most {settings.GATEWAY_MAX_WAITS_PER_TOKEN} long polls per token "
                "at once; poll again shortly, or wait on fewer effects.",
            )
        yield
    finally:
        if counted:
            with suppress(ValueError):  # expired meanwhile: nothing to give back
                cache.decr(key)
        with _process_lock:
            _process_open -= 1
