"""Which adapter serves a contract, built from configuration only, never from a request.

The order, per provider:

1. its ``GATEWAY_PROVIDERS`` entry (gateway.providers.config), when the deployment names
   it: the entry's adapter (a built-in kind or a factory's dotted path; left out, the
   contract module's factory if its pack has one, else the SPEC §6 adapter), its base URL,
   timeout, credential and options. The deployment's word overrides a pack's default: a
   team points a provider at its own server or account without editing the pack;
2. else the factory its contract module declares (``ADAPTERS``), at its
   ``GATEWAY_PROVIDER_URLS`` entry;
3. else the SPEC §6 HTTP adapter at its ``GATEWAY_PROVIDER_URLS`` entry.

Each built adapter comes with its ``Sender``: the adapter's name and its credential's
fingerprint, which the dispatch writes on the attempt (the effect page and the API show
which adapter and which credential sent it).

A tenant's own credential for the provider (``Credential``, chosen by
gateway.provider_credentials) replaces the deployment's: the same adapter, base URL, timeout
and options, built with the tenant's secret instead, and cached apart by its fingerprint.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from gateway.contracts import ADAPTERS, EffectContract
from gateway.providers.base import (
    CallResult,
    ExecuteRequest,
    LookupResult,
    ProviderAdapter,
    ProviderConfig,
)
from gateway.providers.config import ADAPTER_KINDS, fingerprint, parse_entry, resolve_factory
from gateway.providers.http import HttpProviderAdapter

# The sender of the bundled SPEC §6 adapter without a credential: the attempt's columns stay
# empty (NULL) for it, on the general and the fast dispatch path alike.
DEFAULT_ADAPTER = "http"


@dataclass(frozen=True)
class Sender:
    """Who sends a contract's effects: the adapter (a kind of ``ADAPTER_KINDS``, or the
    dotted path of a factory) and its credential's fingerprint ("" for none)."""

    adapter: str
    credential_fingerprint: str = ""

    def attempt_fields(self) -> dict[str, str | None]:
        """The attempt's ``adapter`` and ``credential_fingerprint``: NULL for the default
        sender (the SPEC §6 adapter, no credential)."""
        if self.adapter == DEFAULT_ADAPTER and not self.credential_fingerprint:
            return {"adapter": None, "credential_fingerprint": None}
        return {
            "adapter": self.adapter,
            "credential_fingerprint": self.credential_fingerprint or None,
        }


@dataclass(frozen=True)
class Credential:
    """A tenant's secret for one provider, opened from the vault for a send or a lookup, with
    its fingerprint (what the attempt records). Never in a repr, so never in a log."""

    fingerprint: str
    secret: str = field(repr=False)


@dataclass(frozen=True)
class _Built:
    contract: EffectContract
    adapter: ProviderAdapter
    sender: Sender


# (contract, configuration, tenant credential's fingerprint) -> what was built for them: a
# factory runs, and a credential is read, once per configuration in a process, not once per
# call. Emptied when the contracts are loaded again. Keyed by the contract's id (a contract
# holds dicts: no hash), and the contract kept beside the adapter so that a reused id never
# finds another's adapter.
_adapters: dict[tuple[int, str, str], _Built] = {}


def _configuration(provider: str) -> str:
    """Everything the provider's adapter is built from, as one string (the cache key)."""
    return json.dumps(
        [
            settings.GATEWAY_PROVIDERS.get(provider),
            settings.GATEWAY_PROVIDER_URLS.get(provider, ""),
            settings.GATEWAY_PROVIDER_TIMEOUT,
        ],
        sort_keys=True,
        default=str,
    )


def _built(contract: EffectContract, credential: Credential | None) -> _Built:
    key = (
        id(contract),
        _configuration(contract.provider),
        credential.fingerprint if credential else "",
    )
    built = _adapters.get(key)
    if built is None or built.contract is not contract:
        adapter, sender = _build(contract, credential)
        built = _adapters[key] = _Built(contract, adapter, sender)
    return built


def adapter_for(contract: EffectContract, credential: Credential | None = None) -> ProviderAdapter:
    """The adapter that sends ``contract``'s effects with ``credential`` (a tenant's), or with
    the deployment's credential when None."""
    return _built(contract, credential).adapter


def sender_of(contract: EffectContract, credential: Credential | None = None) -> Sender:
    """The adapter and credential that send ``contract``'s effects (built if need be)."""
    return _built(contract, credential).sender


def _factory_name(factory: Any) -> str:
    return f"{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', factory)}"


def _build(
    contract: EffectContract, credential: Credential | None = None
) -> tuple[ProviderAdapter, Sender]:
    provider = contract.provider
    raw = settings.GATEWAY_PROVIDERS.get(provider)
    if raw is not None:
        return _build_configured(contract, raw, credential)
    base_url = settings.GATEWAY_PROVIDER_URLS.get(provider, "")
    timeout = settings.GATEWAY_PROVIDER_TIMEOUT
    secret = credential.secret if credential else ""
    shown = credential.fingerprint if credential else ""
    factory = ADAPTERS.get(provider)
    if factory is not None:
        config = ProviderConfig(provider, base_url, timeout, contract, credential=secret)
        adapter: ProviderAdapter = factory(config)
        return adapter, Sender(_factory_name(factory), shown)
    if not base_url:
        raise ImproperlyConfigured(
            f"no URL for provider {provider!r} in GATEWAY_PROVIDER_URLS or GATEWAY_PROVIDERS"
        )
    http = HttpProviderAdapter(
        base_url, completion_statuses=contract.completion_statuses, credential=secret
    )
    return http, Sender(DEFAULT_ADAPTER, shown)


def _build_configured(
    contract: EffectContract, raw: Any, tenant_credential: Credential | None = None
) -> tuple[ProviderAdapter, Sender]:
    """The adapter of the provider's ``GATEWAY_PROVIDERS`` entry, with its credential read
    now (from the environment or its file) and kept only by the adapter; or, given a
    tenant's credential, with that one instead (the deployment's is then not read)."""
    entry = parse_entry(contract.provider, raw)
    pack_factory = ADAPTERS.get(contract.provider)
    if entry.adapter:
        factory, name = resolve_factory(entry.adapter), entry.adapter
    elif pack_factory is not None:
        factory, name = pack_factory, _factory_name(pack_factory)
    else:
        factory, name = resolve_factory(DEFAULT_ADAPTER), DEFAULT_ADAPTER
    if entry.adapter in ADAPTER_KINDS and not entry.base_url:
        raise ImproperlyConfigured(f"provider {contract.provider!r}: base_url is missing")
    if tenant_credential is not None:
        credential = tenant_credential.secret
    else:
        credential = entry.read_credential()
    config = ProviderConfig(
        name=contract.provider,
        base_url=entry.base_url or settings.GATEWAY_PROVIDER_URLS.get(contract.provider, ""),
        timeout=float(entry.timeout or settings.GATEWAY_PROVIDER_TIMEOUT),
        contract=contract,
        credential=credential,
        options=entry.options,
    )
    adapter: ProviderAdapter = factory(config)
    if entry.timeout:
        adapter = _Timed(adapter, float(entry.timeout))
    return adapter, Sender(name, fingerprint(credential))


class _Timed:
    """An adapter whose calls and lookups get the provider's own timeout (its entry's
    ``timeout``) instead of ``GATEWAY_PROVIDER_TIMEOUT``."""

    def __init__(self, adapter: ProviderAdapter, timeout: float) -> None:
        self.adapter, self.timeout = adapter, timeout

    def __repr__(self) -> str:
        return f"{self.adapter!r} (timeout {self.timeout:g}s)"

    def execute(self, request: ExecuteRequest) -> CallResult:
        return self.adapter.execute(dataclasses.replace(request, timeout=self.timeout))

    def lookup(
        self,
        *,
        idempotency_key: str,
        provider_operation_id: str = "",
        timeout: float,
        payload_digest: str = "",
    ) -> LookupResult:
        return self.adapter.lookup(
            idempotency_key=idempotency_key,
            provider_operation_id=provider_operation_id,
            timeout=self.timeout,
            payload_digest=payload_digest,
        )


def check_build(contract: EffectContract) -> str:
    """Build the contract's adapter once, outside the cache, and say what went wrong ("" when
    nothing did): the start-up check of a configured provider. No call is made."""
    try:
        _build(contract)
    except Exception as exc:  # whatever a factory raises is a problem to report, not a crash
        return f"{type(exc).__name__}: {exc}"
    return ""


def forget_adapters() -> None:
    """Drop the built adapters (the contract modules were loaded again)."""
    _adapters.clear()
