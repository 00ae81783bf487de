"""Prometheus metrics. Counters and histograms live in-process; ledger gauges are read from
the database at scrape time (``LedgerCollector``), so every web node reports the same truth."""

from __future__ import annotations

from prometheus_client import Histogram

DISPATCH_SECONDS = Histogram(
    "gateway_dispatch_seconds",
    "Time from sending a command to the provider until its answer was classified.",
    ["type", "outcome"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
