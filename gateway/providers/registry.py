"""Which adapter serves a contract: its provider's base URL from configuration only, never
from a request."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from gateway.contracts import EffectContract
from gateway.providers.base import ProviderAdapter
from gateway.providers.http import HttpProviderAdapter


def adapter_for(contract: EffectContract) -> ProviderAdapter:
    try:
        base_url = settings.GATEWAY_PROVIDER_URLS[contract.provider]
    except KeyError:
        raise ImproperlyConfigured(
            f"no URL for provider {contract.provider!r} in GATEWAY_PROVIDER_URLS"
        ) from None
    return HttpProviderAdapter(base_url, completion_statuses=contract.completion_statuses)
