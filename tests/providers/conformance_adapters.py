"""Adapters broken on purpose, to prove the conformance kit fails them on the right cases
(tests/providers/test_conformance.py; ``manage.py provider_check --adapter`` loads them)."""

from __future__ import annotations

from dataclasses import replace

from gateway.choices import Outcome
from gateway.providers.base import CallResult, ExecuteRequest, LookupResult, LookupStatus
from gateway.providers.http import HttpProviderAdapter


class TimeoutIsNotStarted(HttpProviderAdapter):
    """Calls a read timeout NOT_STARTED: the gateway would send again what may have run."""

    def execute(self, request: ExecuteRequest) -> CallResult:
        result = super().execute(request)
        if "timed out" in result.reason:
            return replace(result, outcome=Outcome.NOT_STARTED)
        return result


class NotFoundIsUnreachable(HttpProviderAdapter):
    """Reports a 404 lookup as no answer: a key the provider never received stays UNKNOWN."""

    def lookup(
        self,
        *,
        idempotency_key: str,
        provider_operation_id: str = "",
        timeout: float,
        payload_digest: str = "",
    ) -> LookupResult:
        found = super().lookup(
            idempotency_key=idempotency_key,
            provider_operation_id=provider_operation_id,
            timeout=timeout,
            payload_digest=payload_digest,
        )
        if found.status == LookupStatus.NOT_FOUND:
            return LookupResult(LookupStatus.UNREACHABLE, http_status=404, error="not found")
        return found
