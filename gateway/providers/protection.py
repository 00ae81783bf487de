"""Protection of the providers and of the gateway: per provider and credential, a rate limit
and the pause a provider asked for (``Retry-After``); per provider, a cap on calls in flight
and a circuit breaker; shared by every worker process (the rules: ``gateway.providers.gates``).

**Per credential.** A rate and a pause are kept per (provider, credential fingerprint): the
deployment's credential (``policy``) or a tenant's own (``credential_policy``: its own rate
when its admin set one, else the provider's). The dispatcher learns which credential each due
effect will be sent with before it claims it (gateway.fastpath_batch), and asks for permits
per credential (``admit_many``); a 429 is observed against the credential it answered.

**Where it acts.** Before a claim, never after: a dispatcher asks ``outlook`` which providers
it may claim for freely, which need permits, and which are held back; it claims only what
``admit`` granted, and gives back what its claim did not use (``Permit.keep``). An effect held
back is not claimed: it stays PREPARED or NOT_STARTED, due, and is claimed once its gate
opens. Once claimed, an effect is sent or recorded as always (claim-before-call): no gate
ever stands between a claim and its call, and no gate ever sends anything again — an
UNKNOWN effect is the reconciler's, which asks the provider before anything.

**Where the state lives.** One JSON document per provider in the broker's Redis, changed in
an optimistic transaction (``WATCH``: two workers that change it at once, one tries again),
so every worker sees one rate, one count of calls in flight, one circuit. A lease on a call in
flight or on a probe expires (``GATEWAY_DISPATCH_LEASE``): a killed worker's slots come back
by themselves. While Redis does not answer, each process keeps the same state for itself
(``_Local``): the limits hold per process, and dispatch goes on — a Redis outage never
stops the gateway from sending. It tries Redis again after ``REST`` seconds.

``snapshot`` reads every provider's state for the console and ``/metrics``.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from prometheus_client import Counter

from gateway.lib import broker
from gateway.providers import gates
from gateway.providers.base import CallResult
from gateway.providers.config import fingerprint, parse_entry
from gateway.providers.gates import CLOSED, GateState, Hold, Policy, Rate

logger = logging.getLogger(__name__)

REST = 5.0  # seconds of process-local state after Redis failed, before Redis is tried again
WARN_EVERY = 60.0
_TRIES = 8  # optimistic transactions lost in a row before the change is made locally

HELD = Counter(
    "gateway_provider_held",
    "Admissions to a provider refused before any claim, by the gate that held them back "
    "(paused, circuit, in-flight, rate). The effects stay queued.",
    ["provider", "gate"],
)

T = TypeVar("T")


# --- policies ----------------------------------------------------------------------------------


_policies: dict[str, tuple[str, Policy]] = {}


def _configuration(provider: str) -> str:
    """What the provider's policy is made from (read at every claim: a repr, not JSON)."""
    return repr(
        (
            settings.GATEWAY_PROVIDERS.get(provider),
            settings.GATEWAY_CIRCUIT_FAILURES,
            settings.GATEWAY_CIRCUIT_OPEN_SECONDS,
            settings.GATEWAY_DISPATCH_LEASE,
        )
    )


def policy(provider: str) -> Policy:
    """What protects ``provider``: its ``GATEWAY_PROVIDERS`` entry's ``rate_limit``,
    ``max_in_flight`` and ``circuit``, with the deployment's circuit defaults."""
    configuration = _configuration(provider)
    cached = _policies.get(provider)
    if cached is not None and cached[0] == configuration:
        return cached[1]
    made = _policies[provider] = (configuration, _policy(provider))
    return made[1]


def _policy(provider: str) -> Policy:
    raw = settings.GATEWAY_PROVIDERS.get(provider)
    failures = settings.GATEWAY_CIRCUIT_FAILURES
    open_seconds = settings.GATEWAY_CIRCUIT_OPEN_SECONDS
    lease = settings.GATEWAY_DISPATCH_LEASE
    if raw is None:
        return Policy(provider, None, None, failures, open_seconds, lease, provider)
    entry = parse_entry(provider, raw)
    rate_key = provider
    if entry.has_credential and entry.rate_limit is not None:
        # One rate per credential: a rotated or another credential has a budget of its own.
        # One that cannot be read fails the send, which says so.
        with contextlib.suppress(ImproperlyConfigured):
            rate_key = f"{provider}|{fingerprint(entry.read_credential())}"
    return Policy(
        provider,
        entry.rate_limit,
        entry.max_in_flight,
        entry.circuit_failures or failures,
        entry.circuit_open_seconds or open_seconds,
        lease,
        rate_key,
    )


def credential_key(provider: str, credential: str) -> str:
    """The rate key of a tenant's credential (by its fingerprint) at ``provider``."""
    return f"{provider}|{credential}"


def credential_policy(provider: str, credential: str | None, rate: str = "") -> Policy:
    """``provider``'s policy for sends with a tenant's credential (its fingerprint; None: the
    deployment's, ``policy``): the key of that credential, its own ``rate`` ("25/s") when it
    has one, else the provider's. The cap and the circuit stay the provider's."""
    rules = policy(provider)
    if credential is None:
        return rules
    own = _parsed_rate(rate) if rate else None
    return replace(rules, rate=own or rules.rate, rate_key=credential_key(provider, credential))


@functools.lru_cache(maxsize=256)
def _parsed_rate(text: str) -> Rate | None:
    try:
        return gates.parse_rate(text)
    except ValueError:  # checked when it was set: only a hand-edited row gets here
        logger.warning("unreadable credential rate %r; the provider's applies", text)
        return None


def lookup_key(provider: str, credential: str | None) -> str:
    """The rate key a call with ``credential`` (a tenant's fingerprint; None: the
    deployment's) is paused under."""
    return credential_key(provider, credential) if credential else policy(provider).rate_key


def known_providers() -> list[str]:
    """Every provider a contract sends to, and every one ``GATEWAY_PROVIDERS`` names."""
    from gateway.contracts import CONTRACTS

    names = {contract.provider for contract in CONTRACTS.values()}
    return sorted(names | set(settings.GATEWAY_PROVIDERS))


# --- where the state is kept -------------------------------------------------------------------


def _key(provider: str) -> str:
    """One ledger's (database's) state of a provider: gateways sharing a Redis stay apart."""
    return f"gateway:protect:{settings.DATABASES['default']['NAME']}:{provider}"


def _ttl_ms() -> int:
    """A state nobody changed for this long is dropped (it was closed and quiet by then, or
    what it held has long expired)."""
    return int(max(86400.0, 4 * settings.GATEWAY_DISPATCH_LEASE) * 1000)


class _Redis:
    """The states in the broker's Redis."""

    def read(self, providers: list[str]) -> dict[str, GateState]:
        values = broker.client().mget([_key(name) for name in providers])
        return {name: _decode(value) for name, value in zip(providers, values, strict=True)}

    def change(self, provider: str, change: Callable[[GateState], T]) -> T:
        key = _key(provider)
        with broker.client().pipeline() as pipe:
            for _ in range(_TRIES):
                try:
                    pipe.watch(key)
                    state = _decode(pipe.get(key))
                    result = change(state)
                    pipe.multi()
                    pipe.set(key, json.dumps(state.as_data()), px=_ttl_ms())
                    pipe.execute()
                    return result
                except redis.WatchError:
                    continue  # another worker changed it between our read and our write
        raise redis.RedisError(f"the state of {provider!r} kept changing under us")


class _Local:
    """The states of this process alone: while Redis is down."""

    def __init__(self) -> None:
        self.states: dict[str, GateState] = {}
        self.lock = threading.Lock()

    def read(self, providers: list[str]) -> dict[str, GateState]:
        with self.lock:
            return {
                name: GateState.from_data(self.states.get(name, GateState()).as_data())
                for name in providers
            }

    def change(self, provider: str, change: Callable[[GateState], T]) -> T:
        with self.lock:
            state = self.states.setdefault(provider, GateState())
            return change(state)


def _decode(value: bytes | str | None) -> GateState:
    if not value:
        return GateState()
    try:
        return GateState.from_data(json.loads(value))
    except (ValueError, TypeError, AttributeError):
        logger.warning("unreadable provider protection state; starting closed")
        return GateState()


class _Stores:
    """Redis, or this process's own while Redis fails (``REST`` seconds after each failure)."""

    def __init__(self) -> None:
        self.shared = _Redis()
        self.local = _Local()
        self.failed_at = -REST
        self.warned_at = -WARN_EVERY

    def degraded(self) -> bool:
        return time.monotonic() - self.failed_at < REST

    def run(self, action: Callable[[Any], T]) -> T:
        if not self.degraded():
            try:
                return action(self.shared)
            except redis.RedisError:
                self.failed_at = now = time.monotonic()
                if now - self.warned_at >= WARN_EVERY:
                    self.warned_at = now
                    logger.warning(
                        "provider protection: Redis does not answer; limits hold per process",
                        exc_info=True,
                    )
        return action(self.local)


_stores = _Stores()

# The last state this process saw of each provider: an answer that changes nothing in a quiet
# state (a success, with no pause asked) is then not written at all.
_seen: dict[str, GateState] = {}

_lease_ids = itertools.count(1)
_lease_prefix = uuid.uuid4().hex[:8]


def _new_leases(count: int) -> list[str]:
    return [f"{_lease_prefix}.{os.getpid()}.{next(_lease_ids)}" for _ in range(count)]


# --- before a claim ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Outlook:
    """What a dispatcher may claim now: ``held`` providers not at all (an open circuit, with
    when to look again), ``permits`` only what ``admit`` grants; any other provider freely.
    ``keys``: per provider of ``permits``, the rate keys that take no send now (paused or
    their rate spent) and when each reopens; ``paused``: those paused (``Retry-After``)."""

    held: dict[str, Hold]
    permits: list[str]
    keys: dict[str, dict[str, float]] = field(default_factory=dict)
    paused: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def restricted(self) -> list[str]:
        """The providers a free claim must leave out."""
        return sorted(set(self.held) | set(self.permits))

    def reopens_at(self) -> float | None:
        """The earliest time one of the held providers may be looked at again."""
        return min((hold.until for hold in self.held.values()), default=None)


def outlook(providers: Iterable[str] | None = None) -> Outlook:
    """Read every provider's state (one round trip) and say what may be claimed."""
    names = list(providers) if providers is not None else known_providers()
    states = _stores.run(lambda store: store.read(names))
    now = time.time()
    held: dict[str, Hold] = {}
    permits: list[str] = []
    keys: dict[str, dict[str, float]] = {}
    paused: dict[str, dict[str, float]] = {}
    for name, state in states.items():
        _seen[name] = state
        rules = policy(name)
        hold = gates.circuit_hold(state, now)  # whatever credential is paused besides
        if hold is not None:
            held[name] = hold
        elif rules.needs_permits or state.circuit != CLOSED or state.any_paused(now):
            # A cap or a rate to count, a probe to take, or a credential paused: which
            # credential an effect is sent with decides.
            permits.append(name)
            keys[name] = gates.keys_held(state, rules, now)
            if state.any_paused(now):
                paused[name] = {k: until for k, until in state.paused.items() if until > now}
    return Outlook(held, permits, keys, paused)


@dataclass
class Permit:
    """Sends granted to one provider before a claim: give back what the claim did not use
    (``keep``), and each lease when its call answered (``release``)."""

    provider: str
    granted: int
    leases: list[str]
    probe: bool
    rules: Policy | None = None  # the credential's (None: the provider's)

    def keep(self, claimed: int) -> None:
        """The claim took ``claimed`` of the granted sends: return the rest, their leases and,
        when nothing was claimed, the probe."""
        unused = self.granted - claimed
        if unused <= 0:
            return
        spare, self.leases = self.leases[claimed:], self.leases[:claimed]
        probe, self.probe = self.probe and not claimed, self.probe and bool(claimed)
        self.granted = claimed
        rules = self.rules or policy(self.provider)
        _give_back(self.provider, rules, leases=spare, unused=unused, probe=probe)

    def lease(self, index: int) -> str | None:
        return self.leases[index] if index < len(self.leases) else None


def admit(
    provider: str, wanted: int, *, credential: str | None = None, rate: str = ""
) -> Permit | Hold:
    """Grant up to ``wanted`` sends to ``provider`` with ``credential`` (a tenant's
    fingerprint and its own ``rate``; None: the deployment's) now, or say what holds them
    back."""
    return admit_many(provider, [(credential, rate, wanted)])[credential]


def admit_many(
    provider: str, wants: Sequence[tuple[str | None, str, int]]
) -> dict[str | None, Permit | Hold]:
    """``admit`` for several credentials of one provider, in one change of its state: per
    (credential, its own rate, sends wanted), in that order, a permit or a hold. They share
    the provider's cap and its one probe."""
    wanted_rules = [(credential, credential_policy(provider, credential, rate), wanted)
                    for credential, rate, wanted in wants]  # fmt: skip
    capped = policy(provider).max_in_flight is not None
    ids = {credential: _new_leases(wanted) if capped else [] for credential, _, wanted in wants}

    def change(state: GateState) -> dict[str | None, gates.Admission]:
        now = time.time()
        made = {
            credential: gates.admit(state, rules, now, wanted, ids[credential])
            for credential, rules, wanted in wanted_rules
        }
        _seen[provider] = state
        return made

    admissions = _stores.run(lambda store: store.change(provider, change))
    out: dict[str | None, Permit | Hold] = {}
    for credential, rules, _ in wanted_rules:
        admission = admissions[credential]
        if admission.hold is not None:
            HELD.labels(provider=provider, gate=admission.hold.gate).inc()
            out[credential] = admission.hold
            continue
        if admission.probe:
            logger.warning("provider circuit half-open: one probe", extra={"provider": provider})
        leases = list(admission.leases)
        out[credential] = Permit(provider, admission.granted, leases, admission.probe, rules)
    return out


def note_held(provider: str, hold: Hold) -> None:
    """Count a provider left out of a claim (``outlook``'s held ones)."""
    HELD.labels(provider=provider, gate=hold.gate).inc()


def _give_back(
    provider: str, rules: Policy, *, leases: list[str] | tuple[str, ...] = (), unused: int = 0,
    probe: bool = False,
) -> None:  # fmt: skip
    if not leases and not probe and not (unused and rules.rate is not None):
        return

    def change(state: GateState) -> None:
        gates.give_back(state, rules, time.time(), leases=leases, unused=unused, probe=probe)
        _seen[provider] = state

    _stores.run(lambda store: store.change(provider, change))


# --- after a call ------------------------------------------------------------------------------


def release(provider: str, leases: Iterable[str | None], *, probe: bool = False) -> None:
    """Calls answered (or that raised): their slots are free again."""
    names = [lease for lease in leases if lease]
    try:
        _give_back(provider, policy(provider), leases=names, probe=probe)
    except Exception:  # its lease expires by itself
        logger.warning("could not give provider leases back", exc_info=True)


def observe(provider: str, results: Iterable[CallResult], *, credential: str | None = None) -> None:
    """Count answers of ``provider`` for its circuit, and the pause a 429 or 503 asked for
    (``Retry-After``: every worker waits that long before its next call there with the same
    ``credential``, a tenant's fingerprint or None for the deployment's). Never raises: the
    answers are recorded whatever becomes of this."""
    failures = [gates.is_failure(r.outcome, r.http_status) for r in results]
    pauses = [r.retry_after for r in results if r.retry_after]
    retry_after = max(pauses, default=None)
    seen = _seen.get(provider)
    if not any(failures) and retry_after is None and (seen is None or seen.quiet()):
        return  # a success in a quiet state changes nothing: no write on the hot path
    rules = credential_policy(provider, credential)

    def change(state: GateState) -> tuple[str, str]:
        before = state.circuit
        gates.observe(state, rules, time.time(), failures, retry_after)
        _seen[provider] = state
        return before, state.circuit

    try:
        before, after = _stores.run(lambda store: store.change(provider, change))
    except Exception:
        logger.warning("could not count provider answers", exc_info=True)
        return
    if before != after:
        logger.warning("provider circuit %s", after, extra={"provider": provider, "from": before})


# --- what the console and /metrics show --------------------------------------------------------


@dataclass(frozen=True)
class ProviderProtection:
    """One provider's protection as it stands."""

    provider: str
    circuit: str  # "closed", "open" or "half-open"
    since: datetime | None  # when the circuit entered that state (None: closed from the start)
    consecutive_failures: int
    failures_to_open: int
    rate_limit: str  # as configured ("50/s"), "" for none
    rate_used: int  # permits taken in the current window
    rate_capacity: int | None  # permits per window (None: no rate limit)
    in_flight: int  # calls with a live lease (counted only with a cap)
    max_in_flight: int | None
    paused_until: datetime | None  # a Retry-After to the deployment's credential, running
    shared: bool  # False: Redis is down, this is this process's own state
    # Tenants' own credentials sending now (a rate counted or a pause running), by fingerprint.
    credentials: tuple[CredentialUse, ...] = ()


@dataclass(frozen=True)
class CredentialUse:
    """The rate use and the pause of one tenant credential at a provider (by fingerprint,
    never the secret; which tenant holds it is the ledger's to say)."""

    fingerprint: str
    rate_limit: str
    rate_used: int
    rate_capacity: int | None
    paused_until: datetime | None


def _credential_uses(provider: str, state: GateState, now: float) -> tuple[CredentialUse, ...]:
    prefix = credential_key(provider, "")
    keys = sorted({*state.tat, *state.paused} - {policy(provider).rate_key})
    uses = []
    for key in keys:
        if not key.startswith(prefix):
            continue
        rate = _parsed_rate(state.rates[key]) if state.rates.get(key) else None
        window = gates.window_count(rate, state.window.get(key, []), now) if rate else []
        uses.append(
            CredentialUse(
                fingerprint=key[len(prefix) :],
                rate_limit=rate.text if rate else "",
                rate_used=int(window[1]) if rate else 0,
                rate_capacity=rate.count if rate else None,
                paused_until=_when(state.paused_until(key, now)),
            )
        )
    return tuple(uses)


def _when(seconds: float) -> datetime | None:
    return datetime.fromtimestamp(seconds, tz=UTC) if seconds > 0 else None


def snapshot() -> dict[str, ProviderProtection]:
    """Every known provider's protection, read now (one round trip to Redis)."""
    names = known_providers()
    states = _stores.run(lambda store: store.read(names))
    shared = not _stores.degraded()
    now = time.time()
    out: dict[str, ProviderProtection] = {}
    for name in names:
        state, rules = states[name], policy(name)
        rate = rules.rate
        window = gates.window_count(rate, state.window.get(rules.rate_key, []), now) if rate else []
        out[name] = ProviderProtection(
            provider=name,
            circuit=state.circuit,
            since=_when(state.since),
            consecutive_failures=state.failures,
            failures_to_open=rules.failures_to_open,
            rate_limit=rate.text if rate else "",
            rate_used=int(window[1]) if rate else 0,
            rate_capacity=rate.count if rate else None,
            in_flight=state.live_leases(now),
            max_in_flight=rules.max_in_flight,
            paused_until=_when(state.paused_until(rules.rate_key, now)),
            shared=shared,
            credentials=_credential_uses(name, state, now),
        )
    return out


def touched() -> bool:
    """Whether this process has read or changed any provider's state."""
    return bool(_seen or _stores.local.states)


def reset(provider: str | None = None) -> None:
    """Forget the state of one provider (or all): a closed circuit, nothing counted. For an
    operator who knows the provider is back, and for tests."""
    names = (
        [provider]
        if provider
        else sorted(set(known_providers()) | set(_seen) | set(_stores.local.states))
    )
    for name in names:
        _seen.pop(name, None)
        with _stores.local.lock:
            _stores.local.states.pop(name, None)
    _stores.failed_at = -REST  # try Redis at once
    try:
        broker.client().delete(*[_key(name) for name in names])
    except redis.RedisError:
        logger.warning("could not reset provider protection in Redis", exc_info=True)
