"""Health endpoints for load balancers, metrics for Prometheus, and error pages."""

from __future__ import annotations

import contextlib
import sys

from django.core.cache import caches
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from gateway.api.problems import (
    DATABASE_RETRY_AFTER,
    PROBLEM_CONTENT_TYPE,
    database_unavailable,
    database_unavailable_problem,
    json_problem_view,
)
from gateway.lib import broker
from gateway.lib.cache import cache_state

_PING = broker.pack("PING")


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness: the process answers. Checks nothing else, so a database outage does not
    make a load balancer kill every web node at once."""
    return JsonResponse({"status": "ok"})


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """GET /metrics: the Prometheus exposition of this process's registry, including the
    ledger gauges read from the database now (reconciliation registers their collector)."""
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)


@never_cache
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness: the node can take submissions, which needs the ledger database alone.

    The broker and the shared cache are reported, not required: with Redis down a
    submission is still committed and answered (the sweeper and the drainers send it when
    the broker is back), and throttling counts per process meanwhile. A load balancer that
    took every node out of service for a broker outage would refuse what the ledger can
    take."""
    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"error: {type(exc).__name__}"
    try:
        # A PING on the broker's Redis itself: kombu's Redis transport connects lazily, so
        # opening a Celery connection proves nothing about the server.
        broker.run(_PING)
        checks["broker"] = "ok"
    except Exception as exc:
        checks["broker"] = f"error: {type(exc).__name__}"
    cache = caches["default"]
    with contextlib.suppress(Exception):
        cache.has_key("readyz")  # a degrading cache notices an outage (or its end) here
    checks["cache"] = cache_state(cache)
    ready = checks["database"] == "ok"
    whole = checks["broker"] == "ok" and not checks["cache"].startswith("degraded")
    status = ("ready" if whole else "degraded") if ready else "not ready"
    return JsonResponse({"status": status, "checks": checks}, status=200 if ready else 503)


# Paths that machines call (agents, hooks, OAuth clients): their errors are problem+json.
MACHINE_PATHS = ("/api/", "/hooks/", "/oauth/token/", "/oauth/revoke/")


def for_machines(request: HttpRequest) -> bool:
    return request.path.startswith(MACHINE_PATHS)


def handler404(request: HttpRequest, exception=None) -> HttpResponse:
    if for_machines(request):
        return json_problem_view(404, "not-found", "Not found", f"No such path {request.path}.")
    return HttpResponse("Not found", status=404, content_type="text/plain")


def handler500(request: HttpRequest) -> HttpResponse:
    # Django calls this inside its ``except``: the exception being answered is at hand.
    if database_unavailable(sys.exc_info()[1]):
        return _database_unavailable(request)
    if for_machines(request):
        return json_problem_view(
            500,
            "internal-error",
            "Internal error",
            "The gateway failed to answer; nothing was sent on your behalf by this request.",
        )
    return HttpResponse("Internal error", status=500, content_type="text/plain")


def _database_unavailable(request: HttpRequest) -> HttpResponse:
    """503 with Retry-After: problem+json for the API, a page for the console that reads
    nothing from the database (no session, no nav), since the database is what failed."""
    if for_machines(request):
        response: HttpResponse = JsonResponse(
            database_unavailable_problem(), status=503, content_type=PROBLEM_CONTENT_TYPE
        )
    else:
        problem = database_unavailable_problem()
        page = render_to_string("503.html", {"title": problem["title"]})
        response = HttpResponse(page, status=503)
    response.headers["Retry-After"] = str(DATABASE_RETRY_AFTER)
    return response
