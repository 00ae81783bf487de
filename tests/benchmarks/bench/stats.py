"""The bench's arithmetic: percentiles, medians of rounds, ratios to the floor, the paced rate.

No Django, no I/O: what the tables and the verdicts are computed with, tested on its own
(tests/benchmarks/test_bench_stats.py)."""

from __future__ import annotations

import statistics


def percentile(values: list[float], pct: float) -> float:
    """The nearest-rank percentile (``pct`` of 100): the value at rank ⌈pct/100 × n⌉, at least
    the first; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * len(ordered)) - 1))
    return ordered[index]


def median(values: list[float]) -> float:
    """The median of the values that are numbers (NaN, a figure not measured, is left out)."""
    values = [v for v in values if v == v]  # drop NaN
    return statistics.median(values) if values else float("nan")


def ratio(product: float, floor: float) -> float:
    """The product's figure over the floor's; NaN when the floor has none."""
    return product / floor if floor else float("nan")


def slowest_during(
    spans: list[tuple[float, float]], busy: list[tuple[float, float]], pct: float = 99
) -> tuple[int, int]:
    """Of the submissions at or above the ``pct`` percentile of latency (their (sent, answered)
    ``spans``), how many overlapped one of the ``busy`` intervals; and how many there were."""
    if not spans:
        return 0, 0
    cut = percentile([end - start for start, end in spans], pct)
    slow = [(start, end) for start, end in spans if end - start >= cut]
    during = sum(1 for start, end in slow if any(a < end and start < b for a, b in busy))
    return during, len(slow)


def offered_rate(fraction: float, per_second: float, measured: list[float]) -> float:
    """The paced pass's rate (0: none): ``--paced-rate`` as given, else ``--paced``'s fraction
    of the median throughput just measured."""
    if per_second > 0:
        return per_second
    return fraction * median(measured) if fraction > 0 else 0.0


def by_node(latencies: list[float], nodes: list[int]) -> dict[int, list[float]]:
    """Each web node's latencies (the client sends submission i to node i mod nodes)."""
    split: dict[int, list[float]] = {}
    for latency, node in zip(latencies, nodes, strict=True):
        split.setdefault(node, []).append(latency)
    return split


def pass_size(c: int, effects: int, quick: bool) -> int:
    """Effects per pass at concurrency ``c``: ``--effects`` when given, else 50 × c (at least
    1000), or with ``--quick`` 4 × c (at least 16). A pass of a second or less measures the
    ramp (a worker's window opens one effect at a time, pools warm up) and the last effect's
    tail, not the rate."""
    if effects:
        return effects
    return max(16, 4 * c) if quick else max(1000, 50 * c)
