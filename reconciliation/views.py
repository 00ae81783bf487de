"""Plain Django views of reconciliation: providers' asynchronous receipts and /metrics.

The webhook is not part of the agents' API: no session, no CSRF, no bearer token. A provider
proves itself with an HMAC signature over the timestamp and the exact body (see
reconciliation.webhooks); anything unsigned, mis-signed or stale is a 401 problem and is not
read any further.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from gateway.api.problems import PROBLEM_CONTENT_TYPE, json_problem_view, problem
from gateway.lib import jsonin
from gateway.providers.base import ProviderOperation
from reconciliation import services
from reconciliation.metrics import WEBHOOKS_REFUSED
from reconciliation.webhooks import BadSignature, verify


def _invalid(errors: dict[str, list[str]]) -> JsonResponse:
    return JsonResponse(
        problem(
            status=400,
            slug="validation-error",
            title="The request is not valid",
            detail="The webhook body is not a receipt: see errors.",
            errors=errors,
        ),
        status=400,
        content_type=PROBLEM_CONTENT_TYPE,
    )


def _text(value: Any, limit: int, *, required: bool = True) -> str | None:
    if value is None or value == "":
        return None if required else ""
    if not isinstance(value, str) or len(value) > limit:
        return None
    return value


def parse_receipt(provider: str, body: bytes, signed_at: int):
    """The receipt of a verified body, or the field errors that make it none."""
    try:
        data = jsonin.loads(body)
    except jsonin.JsonInputError as exc:
        return None, {exc.where: [f"must be a UTF-8 JSON object: {exc}"]}
    if not isinstance(data, dict):
        return None, {"body": ["must be a JSON object"]}
    errors: dict[str, list[str]] = {}
    event_id = _text(data.get("event_id"), 200)
    if event_id is None:
        errors["event_id"] = ["required: a string of at most 200 characters"]
    operation = data.get("operation")
    if not isinstance(operation, dict):
        errors["operation"] = ["required: an object"]
        return None, errors
    op_id = _text(operation.get("id"), 200)
    status = _text(operation.get("status"), 32)
    digest = _text(operation.get("payload_digest"), 71, required=False)
    key = _text(operation.get("idempotency_key"), 330, required=False)
    result = operation.get("result", {})
    if op_id is None:
        errors["operation.id"] = ["required: a string of at most 200 characters"]
    if status is None:
        errors["operation.status"] = ["required: a string of at most 32 characters"]
    if digest is None:
        errors["operation.payload_digest"] = ["must be a string of at most 71 characters"]
    if key is None:
        errors["operation.idempotency_key"] = ["must be a string of at most 330 characters"]
    if not isinstance(result, dict):
        errors["operation.result"] = ["must be an object"]
    if errors:
        return None, errors
    receipt = services.WebhookReceipt(
        provider=provider,
        event_id=event_id,
        idempotency_key=key,
        operation=ProviderOperation(id=op_id, status=status, payload_digest=digest, result=result),
        signed_at=datetime.fromtimestamp(signed_at, tz=UTC),
    )
    return receipt, {}


@csrf_exempt
@require_POST
def provider_webhook(request: HttpRequest, name: str) -> HttpResponse:
    """POST /hooks/providers/{name}: one asynchronous receipt, applied at most once."""
    secrets: dict[str, str] = getattr(settings, "GATEWAY_WEBHOOK_SECRETS", {}) or {}
    # A label per configured provider only: an attacker must not mint label values.
    label = name if name in secrets else "unknown"
    try:
        body = request.body
    except RequestDataTooBig:
        return json_problem_view(400, "body-too-large", "The request body is too large", "")
    try:
        signed_at = verify(
            secret=secrets.get(name, ""),
            timestamp=request.headers.get("X-Gateway-Timestamp"),
            signature=request.headers.get("X-Gateway-Signature"),
            body=body,
            now=time.time(),
        )
    except BadSignature as exc:
        WEBHOOKS_REFUSED.labels(provider=label, reason=exc.reason).inc()
        response = json_problem_view(
            401, "webhook-signature", "The webhook signature is not valid", str(exc)
        )
        response["WWW-Authenticate"] = 'HMAC-SHA256 realm="providers"'
        return response
    receipt, errors = parse_receipt(name, body, signed_at)
    if receipt is None:
        return _invalid(errors)
    delivery, created = services.webhook_receive(receipt=receipt)
    return JsonResponse(
        {
            "received": True,
            "duplicate": not created,
            "outcome": delivery.outcome,
            "effect_id": delivery.effect_id,
        }
    )


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """GET /metrics: the Prometheus exposition of this process's registry, including the
    ledger gauges read from the database now."""
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
