"""What the bench prints: the header, a line per round, the paced lines, the two Markdown
tables and the verdicts. Each function returns the lines; the figures come in as the passes
measured them (tests.benchmarks.bench.run), so that the formatting is tested on its own."""

from __future__ import annotations

import os
from typing import Any

from tests.benchmarks.bench import targets
from tests.benchmarks.bench.machine import python_speed, scheduler_grouping
from tests.benchmarks.bench.stats import by_node, median, percentile, ratio

# What a client thread waits for before its next submission, per --loop.
WAITS_FOR = {
    "submission": "its answer",
    "effect": "its effect, CONFIRMED in the ledger",
    "api": "its effect, through the API's long poll",
}
SUMMARY_HEAD = (
    "| c | floor/s | product/s | ratio | strict floor/s | ratio | submit p50/p99 ms | "
    "e2e p50/p99 ms | CPU ms/effect web+worker+pg (floor pg+own) | commits/effect | "
    "seal lag p50/p99 ms | dups | load |"
)
SUMMARY_RULE = "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
PACED_HEAD = (
    "| c | offered/s (paced) | confirmed/s | late | submit p50/p99 ms | e2e p50/p99 ms | "
    "CPU ms/effect web+worker+pg | dups | load |"
)
PACED_RULE = "|---|---:|---:|---:|---:|---:|---:|---:|---:|"


def ms(values: list[float], pct: float) -> float:
    """A percentile of latencies in seconds, in milliseconds."""
    return percentile(values, pct) * 1000


def header(
    o: dict[str, Any], run: str, rounds: int, autovacuum_mode: str, speed: float | None = None
) -> str:
    """The run's first line: its shape, the machine, and the state of the ledger."""
    speed = python_speed() if speed is None else speed
    return (
        f"bench {run}: c={o['concurrency']}, {rounds} round(s); {o['web_nodes']} "
        f"{o['web_server']} × {o['web_workers']}×{o['web_threads']} threads, "
        f"{o['worker_processes']} Celery worker(s) ×"
        f"{o['worker_concurrency']} {o['worker_pool']}, floor pool {o['floor_pool']}, "
        f"tenants {o['tenants']}, a client thread waits for {WAITS_FOR[o['loop']]}"
        + (f", grants with a budget of {o['budget_count']}" if o["budget_count"] else "")
        + (", a webhook endpoint per tenant" if o["webhook_endpoint"] else "")
        + (", every provider gated (never binding)" if o["provider_gates"] else "")
        + f"; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
        + f"; pure Python: 5 M additions in {speed:.2f} s of CPU"
        + f"; scheduler: {scheduler_grouping()}"
        + f"; autovacuum: {autovacuum_mode}"
        + (
            f"; ledger: {o['ledger']:,} settled effects loaded"
            if o["ledger"]
            else "; ledger: empty at the start"
        )
    )


def round_lines(c: int, r: int, row: dict) -> list[str]:
    """One round at concurrency ``c``: rates and ratios, then CPU per effect per group."""
    floor, strict, product = row["floor"], row["strict"], row["product"]
    cpu = product["cpu"]
    strict_part = ""
    if strict is not None:
        strict_part = (
            f"  strict floor {strict['rate']:6.1f}/s ratio "
            f"{ratio(product['rate'], strict['rate']):.3f}"
        )
    first = (
        f"  c={c:<3} round {r + 1}: floor {floor['rate']:6.1f}/s  product "
        f"{product['rate']:6.1f}/s ({product['ok']}/{product['n']}, "
        f"wrong {len(product['wrong'])})  ratio {ratio(product['rate'], floor['rate']):.3f}"
        f"{strict_part}  e2e p50 {ms(product['e2e'], 50):.0f} ms"
    )
    line = (
        f"      CPU ms/effect: product web {cpu['web']:.1f} worker {cpu['worker']:.1f} pg "
        f"{cpu['pg']:.1f}, its client {cpu['client']:.1f}, sandbox+poll {cpu['bench']:.1f};"
        f" floor pg {floor['cpu']['pg']:.1f} own {floor['cpu']['client']:.1f} sandbox "
        f"{floor['cpu']['bench']:.1f}"
    )
    if strict is not None:
        line += (
            f"; strict pg {strict['cpu']['pg']:.1f} own {strict['cpu']['client']:.1f} "
            f"sandbox {strict['cpu']['bench']:.1f}"
        )
    dups = [floor["dups"], *([strict["dups"]] if strict else []), product["dups"]]
    second = f"{line}; dups {'/'.join(map(str, dups))}; load {product['load']:.2f}"
    return [first, second, *node_lines(product)]


def node_lines(p: dict) -> list[str]:
    """With several web nodes, each one's submit latency (``--web-node-env``)."""
    split = by_node(p["submit"], p["nodes"])
    if len(split) < 2:
        return []
    return [
        "      submit p50/p90/p99 ms by web node: "
        + ", ".join(
            f"{node}: {ms(values, 50):.1f} / {ms(values, 90):.1f} / {ms(values, 99):.1f}"
            for node, values in sorted(split.items())
        )
    ]


def paced_lines(c: int, p: dict, *, stand_in: bool) -> list[str]:
    """The paced pass at concurrency ``c``; with the autovacuum stand-in, how many of the
    slowest submissions overlapped one of its passes."""
    cpu = p["cpu"]
    lines = [
        f"  c={c:<3} paced: offered {p['offered']:6.1f}/s, confirmed {p['rate']:6.1f}/s "
        f"({p['ok']}/{p['n']}, late {p['late']}, wrong {len(p['wrong'])})  submit p50/p99 "
        f"{ms(p['submit'], 50):.1f} / {ms(p['submit'], 99):.1f}"
        f" ms  e2e p50/p99 {ms(p['e2e'], 50):.0f} / "
        f"{ms(p['e2e'], 99):.0f} ms  CPU ms/effect "
        f"{cpu['web']:.1f}+{cpu['worker']:.1f}+{cpu['pg']:.1f}; commits/effect "
        f"{p['commits']:.2f}; dups {p['dups']}; load {p['load']:.2f}",
        *node_lines(p),
    ]
    if stand_in:
        during, slow = p["tail"]
        lines.append(
            f"      slowest 1 % of submissions: {during} of {slow} overlapped a pass of the "
            "autovacuum stand-in"
        )
    return lines


def paced_table(paced: dict[int, dict]) -> tuple[list[str], dict[int, float]]:
    """The paced passes' table, and each concurrency's submit p99 in ms (for the verdicts)."""
    lines, p99 = ["", PACED_HEAD, PACED_RULE], {}
    for c, p in paced.items():
        cpu = p["cpu"]
        p99[c] = ms(p["submit"], 99)
        lines.append(
            f"| {c} | {p['offered']:.0f} | {p['rate']:.1f} | {p['late']} | "
            f"{ms(p['submit'], 50):.1f} / {ms(p['submit'], 99):.1f} | "
            f"{ms(p['e2e'], 50):.0f} / {ms(p['e2e'], 99):.0f} | "
            f"{cpu['web']:.1f}+{cpu['worker']:.1f}+{cpu['pg']:.1f} = "
            f"{cpu['web'] + cpu['worker'] + cpu['pg']:.1f} | {p['dups']} | {p['load']:.2f} |"
        )
    return lines, p99


def summary_row(c: int, rows: list[dict]) -> tuple[str, targets.Line]:
    """One concurrency's medians over its rounds: the table's row and the verdicts' line."""
    floors = [row["floor"] for row in rows]
    products = [row["product"] for row in rows]
    stricts = [row["strict"] for row in rows if row["strict"] is not None]
    # Each round's product against the floor measured beside it, then the median: the floor
    # swings with the machine (755-1165/s within one run), and a ratio of the two medians
    # would set a product pass against another round's floor.
    product_ratio = median(
        [ratio(p["rate"], f["rate"]) for f, p in zip(floors, products, strict=True)]
    )
    strict_ratio = median(
        [ratio(r["product"]["rate"], r["strict"]["rate"]) for r in rows if r["strict"]]
    )
    submit = [x for p in products for x in p["submit"]]
    e2e = [x for p in products for x in p["e2e"]]
    seal = [x for p in products for x in p["seal"]]
    web, worker, pg = (
        median([p["cpu"][group] for p in products]) for group in ("web", "worker", "pg")
    )
    fpg = median([f["cpu"]["pg"] for f in floors])
    fclient = median([f["cpu"]["client"] for f in floors])
    dups = sum(f["dups"] for f in floors + stricts), sum(p["dups"] for p in products)
    rate = median([p["rate"] for p in products])
    line = targets.Line(
        rate=rate,
        ratio=product_ratio,
        strict_ratio=strict_ratio,
        cpu_ms=web + worker + pg,
        submit_p99_ms=ms(submit, 99),
        e2e_p50_ms=ms(e2e, 50),
        seal_p99_ms=ms(seal, 99),
        duplicates=dups[0] + dups[1],
        floor_cpu_ms=fpg + fclient,
    )
    row = (
        f"| {c} | {median([f['rate'] for f in floors]):.0f} | {rate:.1f} | "
        f"{product_ratio:.3f} | {median([f['rate'] for f in stricts]):.0f} | "
        f"{strict_ratio:.3f} | {ms(submit, 50):.0f} / {ms(submit, 99):.0f} | "
        f"{ms(e2e, 50):.0f} / {ms(e2e, 99):.0f} | "
        f"{web:.1f}+{worker:.1f}+{pg:.1f} = {web + worker + pg:.1f} "
        f"({fpg:.1f}+{fclient:.1f}) | {median([p['commits'] for p in products]):.1f} | "
        f"{ms(seal, 50):.0f} / {ms(seal, 99):.0f} | "
        f"{dups[0]}/{dups[1]} | {max(p['load'] for p in products):.2f} |"
    )
    return row, line


def summary_table(
    results: dict[int, list[dict]], replay: list[float]
) -> tuple[list[str], dict[int, targets.Line]]:
    """The closed-loop table (a row per concurrency) and the replay line; the verdicts'
    lines by concurrency."""
    lines, by_level = ["", SUMMARY_HEAD, SUMMARY_RULE], {}
    for c, rows in results.items():
        row, by_level[c] = summary_row(c, rows)
        lines.append(row)
    lines.append(
        f"replay over HTTP at c=1: p50 {ms(replay, 50):.1f} ms, "
        f"p99 {ms(replay, 99):.1f} ms ({len(replay)} requests)"
    )
    return lines, by_level


def round_trips_line(submitted: Any, dispatched: Any, drained: int, batch: Any) -> str:
    """What one effect costs the database, counted in process (tests.support.querycount)."""
    return (
        f"round trips per effect (in process): submission {submitted.summary()}; "
        f"dispatch {dispatched.summary()}; total "
        f"{submitted.round_trips + dispatched.round_trips} round trips, "
        f"{submitted.commits + dispatched.commits} commits; a drainer's batch of "
        f"{drained}: {batch.summary()}"
    )
