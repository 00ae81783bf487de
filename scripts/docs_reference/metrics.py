"""docs/reference/metrics.md: every metric ``/metrics`` exposes, with its type, labels and help,
from the Prometheus registry the web process serves (gateway.health.metrics)."""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from prometheus_client import REGISTRY, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from scripts.docs_reference.markdown import code, header, table

INTRO = """
`GET /metrics` serves the Prometheus text format. Counters and histograms count what the
serving process did; the ledger's gauges are read from the database at scrape time, so every
node reports the same truth. A scraper sends `Authorization: Bearer $GATEWAY_METRICS_TOKEN`;
without that setting only loopback may scrape (never in production).
"""

# The modules that define the product's metrics: imported here as the web process imports
# them, so that the registry holds everything /metrics shows. A test fails on a module that
# defines a metric and is missing here.
METRIC_MODULES = ("gateway.metrics", "gateway.providers.protection", "reconciliation.metrics")


def _labels(metric: Metric, collector: Collector) -> list[str]:
    names = getattr(metric, "_labelnames", None) or getattr(collector, "_labelnames", None)
    if names:
        return list(names)
    labels: list[str] = []
    for sample in metric.samples:
        labels.extend(name for name in sample.labels if name not in labels and name != "le")
    return labels


def families() -> Iterable[tuple[Metric, list[str], bool]]:
    """Each metric family of the default registry, with its label names and whether it is
    read at scrape time by a collector of ours; read without collecting a value (no database
    query: collectors are asked to describe themselves)."""
    for module in METRIC_MODULES:
        importlib.import_module(module)
    # prometheus_client has no public list of collectors; the registry's own map is stable
    # within the pinned version (the metrics reference test fails if it moves).
    collectors = list(REGISTRY._collector_to_names)
    for collector in collectors:
        describe = getattr(collector, "describe", None)
        at_scrape = (
            not isinstance(collector, MetricWrapperBase)
            and type(collector).__module__ in METRIC_MODULES
        )
        for metric in describe() if describe else collector.collect():
            yield metric, _labels(metric, collector), at_scrape


def render() -> str:
    product: list[list[str]] = []
    runtime: list[list[str]] = []
    for metric, labels, at_scrape in sorted(families(), key=lambda found: found[0].name):
        name = metric.name + ("_total" if metric.type == "counter" else "")
        kind = f"{metric.type}, read from the ledger at each scrape" if at_scrape else metric.type
        if metric.type == "histogram":
            kind += " (series `_bucket`, `_sum`, `_count`)"
        row = [code(name), kind, ", ".join(map(code, labels)), metric.documentation]
        (product if metric.name.startswith("gateway_") else runtime).append(row)
    return "\n".join(
        [
            header("Metrics", INTRO, "the Prometheus registry `/metrics` serves"),
            "## The gateway's metrics\n",
            table(["metric", "type", "labels", "help"], product),
            "## The process's own\n",
            "Standard metrics of `prometheus_client` about the serving process (CPU, memory, "
            "file descriptors, Python's garbage collector).\n",
            table(["metric", "type", "labels", "help"], runtime),
        ]
    )
