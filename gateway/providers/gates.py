"""The rules of a provider's protection, without storage: its rate limit (GCRA), its cap on
calls in flight (leases that expire), the pause it asked for (``Retry-After``) and its circuit
breaker, as functions of one provider's ``GateState`` and the time. ``gateway.providers.
protection`` keeps the states in Redis (shared by every worker) or, while Redis is down, in
the process, and runs these rules on them; tests run the arithmetic on its own.

**Rate limit** (``Rate``, "50/s"): the generic cell rate algorithm. One permit every
``interval`` seconds (``per / count``), evenly spaced, so that no stretch of ``per`` seconds
holds more than ``count`` sends, however the windows of the provider's own limiter fall. The
state is one number, the theoretical arrival time ``tat``: a permit is granted while
``tat - now`` stays within the tolerance (``(burst - 1) * interval``; a burst of one: none),
and each permit granted moves ``tat`` on by ``interval``. Permits taken and not used (the
claim found fewer effects) are given back by moving it back. What the console shows as the
rate's use is counted per window of ``per`` seconds beside it (``window``).

**Keys.** The rate and the ``Retry-After`` pause belong to a credential, not to the provider:
one key per (provider, credential fingerprint), ``Policy.rate_key``, the deployment's or a
tenant's own (``protection.credential_policy``: the same provider's policy with the
credential's key and rate). A 429 answered to one account pauses that account's sends; every
other credential at the provider goes on. The cap on calls in flight and the circuit breaker
are the provider's, whatever credential a call carries.

**Circuit breaker**: ``closed`` until ``failures`` answers in a row are failures to connect
or 5xx (``is_failure``); then ``open`` for ``open_seconds``; then the next
admission takes the one probe (``half-open``): a success closes the circuit, a failure opens
it again for as long. A probe whose call never answered (its worker died) is given up after
its lease, and the next admission probes again. The breaker gates sends of effects not yet
sent; what was sent stays with the reconciler, whatever the circuit says.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from gateway.choices import Outcome

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"

# The gates that hold an admission back, as named in logs, metrics and the console.
PAUSED, CIRCUIT, IN_FLIGHT, RATE = "paused", "circuit", "in-flight", "rate"

# A claim may take this long's worth of a rate's permits at once (``Rate.burst``): one
# permit per claim would cap a drainer at one send per round trip (a few tens a second),
# whatever the rate; a rate of 50/s or less stays evenly spaced.
BURST_SECONDS = 0.02

# A rate key not used for this long is dropped from the state (``GateState.prune``).
IDLE = 3600.0

# A cap on calls in flight reached by other workers frees up when one of their calls answers,
# which nothing here announces: look again after this long.
IN_FLIGHT_RETRY = 0.25

_UNITS = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0,
          "h": 3600.0, "hour": 3600.0}  # fmt: skip
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*([a-z]+)\s*$")


@dataclass(frozen=True)
class Rate:
    """``count`` calls per ``per`` seconds, a burst of ``count`` at most."""

    count: int
    per: float
    text: str = ""
    burst: int = 1  # sends that may go at once (1: evenly spaced, never two in an interval)

    @property
    def interval(self) -> float:
        return self.per / self.count

    @property
    def tolerance(self) -> float:
        """How far ahead of now ``tat`` may run: the burst, less the permit being granted."""
        return (self.burst - 1) * self.interval


def parse_rate(text: str) -> Rate:
    """``"50/s"``, ``"600/min"``, ``"10/2s"``, ``"1000/hour"``; ValueError on anything else."""
    match = _RATE.match(text.lower()) if isinstance(text, str) else None
    if match is None or match.group(3) not in _UNITS:
        raise ValueError(f"{text!r} is not a rate such as '50/s', '600/min' or '10/2s'")
    count = int(match.group(1))
    per = float(match.group(2) or 1) * _UNITS[match.group(3)]
    if count < 1 or per <= 0:
        raise ValueError(f"{text!r}: the count and the period must be positive")
    return Rate(count, per, text.strip(), burst=max(1, math.floor(count * BURST_SECONDS / per)))


def rate_take(rate: Rate, tat: float, now: float, wanted: int) -> tuple[int, float]:
    """(permits granted, up to ``wanted``; the new ``tat``)."""
    tat = max(tat, now)
    ahead = tat - now
    if ahead > rate.tolerance + 1e-9:
        return 0, tat
    # ``tat`` may run ``tolerance`` ahead after the last permit is granted, not after it.
    room = math.floor((rate.tolerance - ahead) / rate.interval + 1e-9) + 1
    granted = max(0, min(wanted, room))
    return granted, tat + granted * rate.interval


def rate_give_back(rate: Rate, tat: float, now: float, unused: int) -> float:
    """``tat`` with ``unused`` permits returned (never before now: time gone is not credit)."""
    return max(now, tat - unused * rate.interval)


def window_count(
    rate: Rate, window: tuple[float, int] | list[float], now: float, add: int = 0
) -> list[float]:
    """The count of sends in the current window of ``per`` seconds, ``[start, used]``, with
    ``add`` more (negative: given back). For show: the limit itself is ``tat``'s."""
    start, used = (float(window[0]), int(window[1])) if window else (now, 0)
    if now - start >= rate.per:
        start, used = now, 0
    return [start, max(0, used + add)]


def rate_next_at(rate: Rate, tat: float) -> float:
    """When the next permit is granted."""
    return tat - rate.tolerance


@dataclass(frozen=True)
class Policy:
    """What protects one provider (its ``GATEWAY_PROVIDERS`` entry and the defaults)."""

    provider: str
    rate: Rate | None = None
    max_in_flight: int | None = None
    failures_to_open: int = 5
    open_seconds: float = 10.0
    lease_seconds: float = 60.0  # a lease (call in flight, probe) not given back expires
    rate_key: str = ""  # the provider, and its credential's fingerprint when it has one

    @property
    def needs_permits(self) -> bool:
        """Whether every admission has to be counted (a rate, a cap), not only looked at."""
        return self.rate is not None or self.max_in_flight is not None


@dataclass
class GateState:
    """One provider's shared state (seconds since the epoch throughout)."""

    circuit: str = CLOSED
    since: float = 0.0  # when the circuit entered its state (0: never left closed)
    failures: int = 0  # failures in a row
    open_until: float = 0.0
    probe_until: float = 0.0  # a probe is out until then (half-open)
    paused: dict[str, float] = field(default_factory=dict)  # rate key -> paused until
    tat: dict[str, float] = field(default_factory=dict)  # rate key -> theoretical arrival
    window: dict[str, list[float]] = field(default_factory=dict)  # rate key -> [start, used]
    rates: dict[str, str] = field(default_factory=dict)  # rate key -> its rate, for show
    leases: dict[str, float] = field(default_factory=dict)  # lease -> expires at

    @classmethod
    def from_data(cls, data: dict[str, Any] | None) -> GateState:
        data = data or {}
        return cls(
            circuit=str(data.get("circuit", CLOSED)),
            since=float(data.get("since", 0.0)),
            failures=int(data.get("failures", 0)),
            open_until=float(data.get("open_until", 0.0)),
            probe_until=float(data.get("probe_until", 0.0)),
            paused={str(k): float(v) for k, v in dict(data.get("paused", {})).items()},
            tat={str(k): float(v) for k, v in dict(data.get("tat", {})).items()},
            rates={str(k): str(v) for k, v in dict(data.get("rates", {})).items()},
            leases={str(k): float(v) for k, v in dict(data.get("leases", {})).items()},
            window={
                str(k): [float(v[0]), int(v[1])] for k, v in dict(data.get("window", {})).items()
            },
        )

    def as_data(self) -> dict[str, Any]:
        return {
            "circuit": self.circuit,
            "since": self.since,
            "failures": self.failures,
            "open_until": self.open_until,
            "probe_until": self.probe_until,
            "paused": self.paused,
            "tat": self.tat,
            "rates": self.rates,
            "leases": self.leases,
            "window": self.window,
        }

    def live_leases(self, now: float) -> int:
        return sum(1 for until in self.leases.values() if until > now)

    def quiet(self) -> bool:
        """Closed, no failure counted, nothing out: what every provider is most of the time."""
        return self.circuit == CLOSED and not self.failures and not self.leases

    def paused_until(self, key: str, now: float) -> float:
        """Until when ``key``'s credential is paused (0: it is not)."""
        until = self.paused.get(key, 0.0)
        return until if until > now else 0.0

    def any_paused(self, now: float) -> bool:
        return any(until > now for until in self.paused.values())

    def prune(self, now: float) -> None:
        """Forget what no longer counts: pauses run out, and the rate of a key nobody sent
        with for ``IDLE`` seconds (its ``tat`` long past: the same as none). A provider's
        document then holds the credentials at work, not every one that ever sent."""
        self.paused = {key: until for key, until in self.paused.items() if until > now}
        idle = [key for key, tat in self.tat.items() if tat < now - IDLE]
        for key in idle:
            self.tat.pop(key, None)
            self.window.pop(key, None)
            self.rates.pop(key, None)


@dataclass(frozen=True)
class Hold:
    """Why an admission was refused, and when to look again."""

    gate: str
    until: float


def circuit_hold(state: GateState, now: float) -> Hold | None:
    """The circuit's hold on every credential's sends: open, or its probe out."""
    if state.circuit == OPEN and now < state.open_until:
        return Hold(CIRCUIT, state.open_until)
    if state.circuit != CLOSED and state.probe_until > now:
        return Hold(CIRCUIT, state.probe_until)
    return None


def hold_of(state: GateState, policy: Policy, now: float) -> Hold | None:
    """The gate that holds every admission back now, without taking anything (a pause, an
    open circuit, a probe out, a full cap, a spent rate); None when one may be tried."""
    paused = state.paused_until(policy.rate_key, now)
    if paused:
        return Hold(PAUSED, paused)
    circuit = circuit_hold(state, now)
    if circuit is not None:
        return circuit
    if policy.max_in_flight is not None and state.live_leases(now) >= policy.max_in_flight:
        return Hold(IN_FLIGHT, now + IN_FLIGHT_RETRY)
    if policy.rate is not None:
        tat = state.tat.get(policy.rate_key, 0.0)
        if rate_take(policy.rate, tat, now, 1)[0] == 0:
            return Hold(RATE, rate_next_at(policy.rate, tat))
    return None


def keys_held(state: GateState, policy: Policy, now: float) -> dict[str, float]:
    """The rate keys of the provider that may take no send now, with when to look again:
    paused, or their rate spent (read with the rate each was last admitted under)."""
    held = {key: until for key, until in state.paused.items() if until > now}
    for key, tat in state.tat.items():
        text = state.rates.get(key, "")
        rate = policy.rate if policy.rate is not None and policy.rate.text == text else None
        if rate is None:
            try:
                rate = parse_rate(text)
            except ValueError:
                continue
        if tat - now > rate.tolerance + 1e-9:
            held[key] = max(held.get(key, 0.0), rate_next_at(rate, tat))
    return held


@dataclass(frozen=True)
class Admission:
    """What ``admit`` granted: ``granted`` sends, a lease per send when the provider has a cap,
    whether the one probe of a half-open circuit is among them; or the hold."""

    granted: int
    leases: tuple[str, ...] = ()
    probe: bool = False
    hold: Hold | None = None


def admit(
    state: GateState, policy: Policy, now: float, wanted: int, lease_ids: list[str]
) -> Admission:
    """Grant up to ``wanted`` sends (changing ``state``): one probe when the circuit has been
    open long enough, as many as the cap and the rate allow otherwise. ``lease_ids``: at
    least ``wanted`` fresh names for the leases."""
    state.leases = {lease: until for lease, until in state.leases.items() if until > now}
    state.prune(now)
    hold = hold_of(state, policy, now)
    if hold is not None:
        return Admission(0, hold=hold)
    probe = state.circuit != CLOSED  # open past its time, or a probe given up
    wanted = 1 if probe else wanted
    if policy.max_in_flight is not None:
        wanted = min(wanted, policy.max_in_flight - len(state.leases))
    if policy.rate is not None:
        key, rate = policy.rate_key, policy.rate
        wanted, state.tat[key] = rate_take(rate, state.tat.get(key, 0.0), now, wanted)
        state.window[key] = window_count(rate, state.window.get(key, []), now, max(wanted, 0))
        state.rates[key] = rate.text
    if wanted <= 0:  # hold_of looked at one permit: only a wanted of 0 gets here
        return Admission(0, hold=Hold(RATE, now))
    leases: tuple[str, ...] = ()
    if policy.max_in_flight is not None:
        leases = tuple(lease_ids[:wanted])
        state.leases.update(dict.fromkeys(leases, now + policy.lease_seconds))
    if probe:
        state.circuit, state.since = HALF_OPEN, now
        state.probe_until = now + policy.lease_seconds
    return Admission(wanted, leases, probe)


def give_back(
    state: GateState,
    policy: Policy,
    now: float,
    *,
    leases: tuple[str, ...] | list[str] = (),
    unused: int = 0,
    probe: bool = False,
) -> None:
    """Return leases (calls answered, or never made), ``unused`` rate permits (the claim found
    fewer effects than were granted) and a probe (its call answered or was never made)."""
    for lease in leases:
        state.leases.pop(lease, None)
    if unused and policy.rate is not None and policy.rate_key in state.tat:
        key, rate = policy.rate_key, policy.rate
        state.tat[key] = rate_give_back(rate, state.tat[key], now, unused)
        state.window[key] = window_count(rate, state.window.get(key, []), now, -unused)
    if probe:
        state.probe_until = 0.0


def is_failure(outcome: Outcome, http_status: int | None) -> bool:
    """An answer the breaker counts against the provider: a failure to connect (not started,
    no status) or a 5xx. A connection lost after the request went out (unknown, no status)
    is the reconciler's to settle, not a sign the provider is down; a 429 is its own pacing
    (``Retry-After``), a 4xx a refusal: answers, not failures."""
    if http_status is None:
        return outcome == Outcome.NOT_STARTED
    return http_status >= 500


def observe(
    state: GateState,
    policy: Policy,
    now: float,
    failures: list[bool],
    retry_after: float | None = None,
) -> None:
    """Count answers, in the order they came (True: a failure), and a pause asked for (it
    pauses ``policy.rate_key``: the credential the answer was given to)."""
    for failed in failures:
        if not failed:
            state.failures = 0
            if state.circuit != CLOSED:
                state.circuit, state.since, state.probe_until = CLOSED, now, 0.0
            continue
        state.failures += 1
        reopen = state.circuit == HALF_OPEN
        if reopen or (state.circuit == CLOSED and state.failures >= policy.failures_to_open):
            state.circuit, state.since = OPEN, now
            state.open_until, state.probe_until = now + policy.open_seconds, 0.0
    if retry_after is not None and retry_after > 0:
        key = policy.rate_key
        state.paused[key] = max(state.paused.get(key, 0.0), now + retry_after)
