"""What every provider adapter returns: one outcome vocabulary with its evidence (STYLE 9)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from gateway.choices import Outcome

if TYPE_CHECKING:
    from gateway.contracts import EffectContract


@dataclass(frozen=True)
class ProviderOperation:
    """An operation as the provider reports it."""

    id: str
    status: str
    payload_digest: str
    result: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ExecuteRequest:
    """Everything an adapter needs to send one command; no ORM objects."""

    effect_id: str
    type: str
    idempotency_key: str
    resource: dict[str, Any]
    payload: dict[str, Any]
    payload_digest: str
    timeout: float


@dataclass(frozen=True)
class CallResult:
    """The classified outcome of a send or a lookup, with what proves it."""

    outcome: Outcome
    reason: str
    operation: ProviderOperation | None = None
    http_status: int | None = None
    error: str = ""
    # The provider recorded something other than the command (digest, key reuse).
    mismatch: bool = False
    # Seconds the provider asked to wait before the next call (``Retry-After`` of a 429 or
    # 503), when it said.
    retry_after: float | None = None


class LookupStatus:
    FOUND = "found"
    NOT_FOUND = "not_found"
    UNREACHABLE = "unreachable"


def not_found_proves_not_started(*, age: timedelta, key_retention: timedelta) -> bool:
    """Whether a lookup by key that finds nothing proves the provider never received the
    command: only while the provider still keeps keys as old as the command. Past its key
    retention it may have executed the command and forgotten the key; sending again would
    execute it twice. (The reconciler's rule; the conformance kit checks adapters by it.)"""
    return age < key_retention


@dataclass(frozen=True)
class LookupResult:
    """What a lookup proved: found (with the operation), not found, or nothing (unreachable)."""

    status: str
    operation: ProviderOperation | None = None
    http_status: int | None = None
    error: str = ""


class ProviderAdapter(Protocol):
    def execute(self, request: ExecuteRequest) -> CallResult: ...

    def lookup(
        self,
        *,
        idempotency_key: str,
        provider_operation_id: str = "",
        timeout: float,
        payload_digest: str = "",
    ) -> LookupResult:
        """Find the operation by its id when one is given, else by the key.

        ``payload_digest`` is the command's digest: an adapter for a provider that keeps no
        digest (a declared REST API) reports a match by id or key with it, the match being
        the evidence; one whose provider reports the digest it recorded ignores it, and
        reports what the provider says, so that a mismatch is seen."""
        ...


@dataclass(frozen=True)
class ProviderConfig:
    """What an adapter factory is built from: the provider's name, its base URL (its
    ``GATEWAY_PROVIDERS`` entry's, else its ``GATEWAY_PROVIDER_URLS`` entry; "" when none is
    configured), the call timeout in seconds, the contract whose effects it will send (its
    completion statuses, its lookups), and from ``GATEWAY_PROVIDERS``: the credential read
    from where the entry says it is kept ("" for none; never in a repr, so never in a log) and
    the adapter's options."""

    name: str
    base_url: str
    timeout: float
    contract: EffectContract
    credential: str = field(default="", repr=False)
    options: Mapping[str, Any] = field(default_factory=dict)
