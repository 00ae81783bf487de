"""The bench's arithmetic (tests.benchmarks.bench.stats): the percentiles, medians and ratios
every table and verdict is computed with."""

from __future__ import annotations

import math

import pytest

from tests.benchmarks.bench.stats import (
    by_node,
    median,
    offered_rate,
    pass_size,
    percentile,
    ratio,
    slowest_during,
)


def test_a_percentile_is_the_nearest_rank_of_the_values_in_any_order():
    values = [float(v) for v in range(100, 0, -1)]  # 100 … 1, unsorted on purpose
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile(values, 0) == 1  # never before the first
    assert percentile([7.0, 1.0, 3.0], 50) == 3  # rank round(1.5) = 2
    assert percentile([4.0], 99) == 4
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 90) == 9


def test_no_values_have_no_percentile_rather_than_a_zero():
    assert math.isnan(percentile([], 50))


def test_a_median_leaves_out_what_was_not_measured():
    assert median([3.0, math.nan, 1.0, 2.0]) == 2
    assert median([1.0, 4.0]) == 2.5
    assert math.isnan(median([math.nan]))
    assert math.isnan(median([]))


def test_a_ratio_to_a_floor_that_did_not_run_is_not_a_number():
    assert ratio(120.0, 300.0) == 0.4
    assert math.isnan(ratio(120.0, 0.0))


def test_the_slowest_submissions_are_set_beside_what_was_busy():
    spans = [(float(t), t + 0.003) for t in range(100)]  # a hundred submissions of 3 ms
    spans[10] = (10.0, 10.05)  # two slow ones: one during a busy interval, one not
    spans[60] = (60.0, 60.04)
    assert slowest_during(spans, busy=[(9.9, 10.01)]) == (1, 2)
    assert slowest_during(spans, busy=[(9.9, 10.01), (60.02, 61)]) == (2, 2)
    assert slowest_during(spans, busy=[(30, 40)]) == (0, 2)
    assert slowest_during([], busy=[(0, 1)]) == (0, 0)


def test_a_paced_rate_given_is_offered_as_it_is_and_a_fraction_follows_the_throughput():
    measured = [400.0, 520.0, 480.0]
    assert offered_rate(0.5, 0, measured) == 240.0  # half the median
    assert offered_rate(0.5, 260, measured) == 260  # the same load in runs to compare
    assert offered_rate(0, 260, measured) == 260
    assert offered_rate(0, 0, measured) == 0  # no paced pass


def test_latencies_are_split_by_the_web_node_they_went_to():
    split = by_node([0.1, 0.2, 0.3, 0.4, 0.5], [0, 1, 0, 1, 0])
    assert split == {0: [0.1, 0.3, 0.5], 1: [0.2, 0.4]}
    with pytest.raises(ValueError):  # a node for every latency, or the split would lie
        by_node([0.1, 0.2], [0])


def test_a_pass_is_long_enough_to_measure_a_rate_unless_told_otherwise():
    assert pass_size(1, 0, quick=False) == 1000
    assert pass_size(32, 0, quick=False) == 1600
    assert pass_size(1, 0, quick=True) == 16
    assert pass_size(8, 0, quick=True) == 32
    assert pass_size(8, 250, quick=False) == pass_size(8, 250, quick=True) == 250
