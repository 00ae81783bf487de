"""Prometheus metrics. Counters and histograms live in-process; ledger gauges are read from
the database at scrape time (``LedgerCollector``), so every web node reports the same truth.
The providers' protection (circuit, calls in flight, rate use) is read from Redis at scrape
time the same way (``ProtectionCollector``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime

from prometheus_client import REGISTRY, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.providers import protection
from gateway.providers.gates import CLOSED, HALF_OPEN, OPEN

DISPATCH_SECONDS = Histogram(
    "gateway_dispatch_seconds",
    "Time from sending a command to the provider until its answer was classified.",
    ["type", "outcome"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)

# The admissions a gate refused, counted by the process it refused
# (gateway_provider_held_total{provider,gate}), are gateway.providers.protection's HELD.


class ProtectionCollector(Collector):
    """Each provider's circuit, calls in flight and rate use, as every worker shares them."""

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The families without their values: registering asks for these, and reads nothing
        (a process starts without touching Redis)."""
        return self._families()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        circuit, failures, in_flight, rate_used, credential_used, paused = self._families()
        now = time.time()
        for name, state in protection.snapshot().items():
            for value in (CLOSED, OPEN, HALF_OPEN):
                circuit.add_metric([name, value], 1.0 if state.circuit == value else 0.0)
            failures.add_metric([name], state.consecutive_failures)
            in_flight.add_metric([name], state.in_flight)
            rate_used.add_metric([name], state.rate_used)
            paused.add_metric([name, "deployment"], _left(state.paused_until, now))
            for use in state.credentials:  # tenants' credentials at work, by fingerprint
                credential_used.add_metric([name, use.fingerprint], use.rate_used)
                paused.add_metric([name, use.fingerprint], _left(use.paused_until, now))
        yield from (circuit, failures, in_flight, rate_used, credential_used, paused)

    @staticmethod
    def _families() -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "gateway_provider_circuit",
            "1 for the provider's circuit state (closed, open, half-open), 0 for the others.",
            labels=["provider", "state"],
        )
        yield GaugeMetricFamily(
            "gateway_provider_consecutive_failures",
            "Failures in a row (no connection, or a 5xx) the breaker has counted.",
            labels=["provider"],
        )
        yield GaugeMetricFamily(
            "gateway_provider_in_flight",
            "Calls out to the provider now, across workers (counted when it has a cap).",
            labels=["provider"],
        )
        yield GaugeMetricFamily(
            "gateway_provider_rate_used",
            "Permits of the provider's rate limit (its deployment credential's) taken in the "
            "current window.",
            labels=["provider"],
        )
        yield GaugeMetricFamily(
            "gateway_provider_credential_rate_used",
            "Permits of a tenant credential's rate limit taken in the current window, by the "
            "credential's fingerprint (credentials that sent within the last hour).",
            labels=["provider", "credential"],
        )
        yield GaugeMetricFamily(
            "gateway_provider_paused_seconds",
            "Seconds left of a Retry-After pause, per credential: 'deployment' or a tenant "
            "credential's fingerprint.",
            labels=["provider", "credential"],
        )


def _left(until: datetime | None, now: float) -> float:
    return max(0.0, until.timestamp() - now) if until is not None else 0.0


_collector: ProtectionCollector | None = None


def register_collector() -> ProtectionCollector:
    """Add the protection collector to the default registry once per process."""
    global _collector
    if _collector is None:
        _collector = ProtectionCollector()
        REGISTRY.register(_collector)
    return _collector
