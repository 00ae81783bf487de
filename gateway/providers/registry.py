"""Which adapter serves a contract: the factory its provider's contract module declares
(``ADAPTERS``), else the SPEC §6 HTTP adapter; the base URL comes from configuration only,
never from a request."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from gateway.contracts import ADAPTERS, EffectContract
from gateway.providers.base import ProviderAdapter, ProviderConfig
from gateway.providers.http import HttpProviderAdapter

# (contract, base URL, timeout) -> the contract and the adapter built for them: a factory
# runs once per configuration in a process, not once per call. Emptied when the contracts
# are loaded again. Keyed by the contract's id (a contract holds dicts: no hash), and the
# contract kept beside the adapter so that a reused id never finds another's adapter.
_adapters: dict[tuple[int, str, float], tuple[EffectContract, ProviderAdapter]] = {}


def adapter_for(contract: EffectContract) -> ProviderAdapter:
    base_url = settings.GATEWAY_PROVIDER_URLS.get(contract.provider, "")
    timeout = settings.GATEWAY_PROVIDER_TIMEOUT
    key = (id(contract), base_url, timeout)
    built = _adapters.get(key)
    if built is None or built[0] is not contract:
        built = _adapters[key] = (contract, _build(contract, base_url, timeout))
    return built[1]


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
