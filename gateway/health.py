"""Health endpoints for load balancers, metrics for Prometheus, and error pages."""

from __future__ import annotations

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from gateway.api.problems import json_problem_view


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
    """Readiness: the ledger database and the broker are reachable."""
    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"error: {type(exc).__name__}"
    try:
        from gateway.celery import app

        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        checks["broker"] = "ok"
    except Exception as exc:
        checks["broker"] = f"error: {type(exc).__name__}"
    ready = all(value == "ok" for value in checks.values())
    return JsonResponse(
        {"status": "ready" if ready else "not ready", "checks": checks},
        status=200 if ready else 503,
    )


def handler404(request: HttpRequest, exception=None) -> HttpResponse:
    if request.path.startswith("/api/"):
        return json_problem_view(404, "not-found", "Not found", f"No such path {request.path}.")
    return HttpResponse("Not found", status=404, content_type="text/plain")


def handler500(request: HttpRequest) -> HttpResponse:
    if request.path.startswith("/api/"):
        return json_problem_view(
            500,
            "internal-error",
            "Internal error",
            "The gateway failed to answer; nothing was sent on your behalf by this request.",
        )
    return HttpResponse("Internal error", status=500, content_type="text/plain")
