"""Who may read ``/metrics``.

The exposition is the whole deployment's: effects by status and type summed over every
tenant. So no tenant credential opens it. With ``GATEWAY_METRICS_TOKEN`` set, a scraper sends
``Authorization: Bearer <that token>``; without it, only the loopback address may read (a
Prometheus beside the web node), and production (``GATEWAY_PRODUCTION``) refuses all: behind
a reverse proxy on the same host every caller would look like loopback.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Callable
from functools import wraps

from django.conf import settings
from django.http import HttpRequest, HttpResponse


def _loopback(request: HttpRequest) -> bool:
    try:
        return ipaddress.ip_address(request.META.get("REMOTE_ADDR", "")).is_loopback
    except ValueError:
        return False


def may_read_metrics(request: HttpRequest) -> bool:
    expected = settings.GATEWAY_METRICS_TOKEN
    if expected:
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode("utf-8", "replace"), expected.encode()
        )
    return not settings.PRODUCTION and _loopback(request)


def metrics_guard(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    @wraps(view)
    def guarded(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if not may_read_metrics(request):
            response = HttpResponse(
                "Metrics need the scrape token (GATEWAY_METRICS_TOKEN) or a loopback address.\n",
                status=401 if settings.GATEWAY_METRICS_TOKEN else 403,
                content_type="text/plain",
            )
            if settings.GATEWAY_METRICS_TOKEN:
                response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
        return view(request, *args, **kwargs)

    return guarded
