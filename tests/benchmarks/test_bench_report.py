"""What the bench prints (tests.benchmarks.bench.report): the docs quote these lines and tables,
so their shape is pinned here, and the medians behind them are the ones the text says."""

from __future__ import annotations

import math

from tests.benchmarks.bench import report


def _floor(rate: float, pg: float = 1.0) -> dict:
    return {
        "n": 10, "rate": rate, "e2e": [0.004] * 10, "load": 2.5, "dups": 0,
        "cpu": {"pg": pg, "client": 0.8, "bench": 0.5},
    }  # fmt: skip


def _product(rate: float, nodes: tuple[int, ...] = (0, 0, 0, 0), **overrides) -> dict:
    return {
        "n": 4, "ok": 4, "wrong": [], "rate": rate, "submit": [0.002, 0.004, 0.006, 0.050],
        "e2e": [0.010, 0.020, 0.030, 0.040], "commits": 3.0, "nodes": list(nodes),
        "cpu": {"web": 2.0, "worker": 1.5, "pg": 1.0, "client": 0.4, "bench": 0.3},
        "offered": 0.0, "late": 0, "tail": (0, 1), "load": 3.0, "dups": 0, "seal": [0.2] * 4,
        **overrides,
    }  # fmt: skip


def test_a_round_prints_the_rates_the_ratios_and_the_cpu_of_each_group():
    row = {"floor": _floor(300.0), "strict": _floor(400.0, pg=0.9), "product": _product(150.0)}
    assert report.round_lines(8, 0, row) == [
        "  c=8   round 1: floor  300.0/s  product  150.0/s (4/4, wrong 0)  ratio 0.500  "
        "strict floor  400.0/s ratio 0.375  e2e p50 20 ms",
        "      CPU ms/effect: product web 2.0 worker 1.5 pg 1.0, its client 0.4, sandbox+poll "
        "0.3; floor pg 1.0 own 0.8 sandbox 0.5; strict pg 0.9 own 0.8 sandbox 0.5; dups 0/0/0; "
        "load 3.00",
    ]


def test_without_the_strict_floor_its_figures_are_left_out_and_two_nodes_are_split():
    row = {"floor": _floor(300.0), "strict": None, "product": _product(150.0, (0, 1, 0, 1))}
    assert report.round_lines(8, 1, row) == [
        "  c=8   round 2: floor  300.0/s  product  150.0/s (4/4, wrong 0)  ratio 0.500  "
        "e2e p50 20 ms",
        "      CPU ms/effect: product web 2.0 worker 1.5 pg 1.0, its client 0.4, sandbox+poll "
        "0.3; floor pg 1.0 own 0.8 sandbox 0.5; dups 0/0; load 3.00",
        "      submit p50/p90/p99 ms by web node: 0: 2.0 / 6.0 / 6.0, 1: 4.0 / 50.0 / 50.0",
    ]


def test_a_paced_pass_says_what_was_offered_and_what_overlapped_the_stand_in():
    paced = _product(90.0, offered=100.0, late=3, tail=(1, 2))
    lines = report.paced_lines(32, paced, stand_in=True)
    assert lines == [
        "  c=32  paced: offered  100.0/s, confirmed   90.0/s (4/4, late 3, wrong 0)  submit "
        "p50/p99 4.0 / 50.0 ms  e2e p50/p99 20 / 40 ms  CPU ms/effect 2.0+1.5+1.0; "
        "commits/effect 3.00; dups 0; load 3.00",
        "      slowest 1 % of submissions: 1 of 2 overlapped a pass of the autovacuum stand-in",
    ]
    assert report.paced_lines(32, paced, stand_in=False) == lines[:1]
    table, p99 = report.paced_table({32: paced})
    assert table == [
        "",
        report.PACED_HEAD,
        report.PACED_RULE,
        "| 32 | 100 | 90.0 | 3 | 4.0 / 50.0 | 20 / 40 | 2.0+1.5+1.0 = 4.5 | 0 | 3.00 |",
    ]
    assert p99 == {32: 50.0}


def test_the_ratio_is_the_median_of_each_rounds_ratio_not_a_ratio_of_medians():
    # The floor swings with the machine: each product pass is set against the floor measured
    # beside it. Per round 0.5, 0.3, 0.5 (median 0.5); the medians' ratio would read 0.3.
    rows = [
        {"floor": _floor(f), "strict": None, "product": _product(p)}
        for f, p in ((100.0, 50.0), (200.0, 60.0), (300.0, 150.0))
    ]
    printed, line = report.summary_row(8, rows)
    assert line.ratio == 0.5 and line.rate == 60.0
    assert math.isnan(line.strict_ratio)  # no strict floor ran: the verdict says nothing of it
    assert printed == (
        "| 8 | 200 | 60.0 | 0.500 | nan | nan | 4 / 50 | 20 / 40 | 2.0+1.5+1.0 = 4.5 (1.0+0.8) "
        "| 3.0 | 200 / 200 | 0/0 | 3.00 |"
    )


def test_the_summary_feeds_the_verdicts_the_figures_it_prints():
    rows = [{"floor": _floor(300.0), "strict": _floor(400.0), "product": _product(150.0)}]
    lines, by_level = report.summary_table({8: rows}, replay=[0.001] * 99 + [0.009])
    assert lines[:3] == ["", report.SUMMARY_HEAD, report.SUMMARY_RULE]
    assert lines[-1] == "replay over HTTP at c=1: p50 1.0 ms, p99 1.0 ms (100 requests)"
    line = by_level[8]
    assert (line.ratio, line.strict_ratio, line.cpu_ms, line.floor_cpu_ms) == (0.5, 0.375, 4.5, 1.8)
    assert (line.submit_p99_ms, line.e2e_p50_ms, line.seal_p99_ms) == (50.0, 20.0, 200.0)


def test_the_header_names_the_machine_and_what_a_client_waits_for():
    from tests.benchmarks.bench.options import parse

    options = parse(["--loop", "effect", "--ledger", "200000", "--budget-count", "5"])
    header = report.header(options, "abcd1234", 3, "the server's", speed=0.31)
    assert header.startswith(
        "bench abcd1234: c=[1, 8, 32], 3 round(s); 1 gunicorn × 2×3 threads, 1 Celery worker(s) "
        "×4 threads, floor pool 4, tenants 1, a client thread waits for its effect, CONFIRMED in "
        "the ledger, grants with a budget of 5; "
    )
    assert "; pure Python: 5 M additions in 0.31 s of CPU; scheduler: " in header
    assert header.endswith("; autovacuum: the server's; ledger: 200,000 settled effects loaded")
    empty = report.header(parse([]), "r", 1, "none", speed=0.1)
    assert empty.endswith("; ledger: empty at the start")
    assert "budget" not in empty and "webhook" not in empty
