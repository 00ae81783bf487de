"""A Python client for the Effect Gateway's HTTP API, for agent code on any runtime.

It imports neither Django nor Celery: an agent process needs only ``httpx``.

    from effect_gateway_client import GatewayClient, deterministic_key

    with GatewayClient("http://127.0.0.1:8000", token) as gateway:
        effect = gateway.submit(
            "billing.refund.create",
            {"type": "order", "id": "ord_881", "version": 17},
            {"amount": 500, "currency": "EUR", "reason": "duplicate charge"},
            key=deterministic_key("billing.refund.create", "ord_881", "incident_120", "v1"),
        )
        effect = gateway.wait(effect.effect_id, timeout=60)
"""

from effect_gateway_client.aio import AsyncGatewayClient
from effect_gateway_client.client import CONTEXT_KEYS, GatewayClient
from effect_gateway_client.errors import (
    AuthenticationFailed,
    Conflict,
    GatewayError,
    GatewayUnavailable,
    IdempotencyKeyMismatch,
    NotFound,
    NotPermitted,
    RateLimited,
    ValidationFailed,
)
from effect_gateway_client.keys import deterministic_key
from effect_gateway_client.models import (
    SETTLED,
    TERMINAL,
    Effect,
    EffectPage,
    EffectType,
    tool_name,
)

__version__ = "0.3.0"

__all__ = [
    "CONTEXT_KEYS",
    "SETTLED",
    "TERMINAL",
    "AsyncGatewayClient",
    "AuthenticationFailed",
    "Conflict",
    "Effect",
    "EffectPage",
    "EffectType",
    "GatewayClient",
    "GatewayError",
    "GatewayUnavailable",
    "IdempotencyKeyMismatch",
    "NotFound",
    "NotPermitted",
    "RateLimited",
    "ValidationFailed",
    "deterministic_key",
    "tool_name",
]
