"""Which adapter serves a contract: the factory its provider's contract module declares
(``ADAPTERS``), else the SPEC §6 HTTP adapter; the base URL comes from configuration only,
never from a request."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from gateway.contracts import ADAPTERS, EffectContract
from gateway.providers.base import ProviderAdapter, ProviderConfig
from gateway.providers.http import HttpProviderAdapter

# (effect type, base URL, timeout) -> the adapter built for them: a factory runs once per
# configuration in a process, not once per call. Emptied when the contracts are reloaded.
_adapters: dict[tuple[str, str, float], ProviderAdapter] = {}


def adapter_for(contract: EffectContract) -> ProviderAdapter:
    base_url = settings.GATEWAY_PROVIDER_URLS.get(contract.provider, "")
    timeout = settings.GATEWAY_PROVIDER_TIMEOUT
    key = (contract.type, base_url, timeout)
    adapter = _adapters.get(key)
    if adapter is None:
        adapter = _adapters[key] = _build(contract, base_url, timeout)
    return adapter


def _build(contract: EffectContract, base_url: str, timeout: float) -> ProviderAdapter:
    factory = ADAPTERS.get(contract.provider)
    if factory is not None:
        config = ProviderConfig(contract.provider, base_url, timeout, contract)
        adapter: ProviderAdapter = factory(config)
        return adapter
    if not base_url:
        raise ImproperlyConfigured(
            f"no URL for provider {contract.provider!r} in GATEWAY_PROVIDER_URLS"
        )
    return HttpProviderAdapter(base_url, completion_statuses=contract.completion_statuses)


def forget_adapters() -> None:
    """Drop the built adapters (the contract modules were loaded again)."""
    _adapters.clear()
