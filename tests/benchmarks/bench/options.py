"""The bench's command line: ``python -m tests.benchmarks.bench --help`` (``make bench
BENCH_ARGS=…``). Parsed and checked before anything starts: a malformed option stops the run
with argparse's usage line, not after the servers are up."""

from __future__ import annotations

import argparse
from typing import Any

PROG = "python -m tests.benchmarks.bench"
DESCRIPTION = "Benchmark: the product over HTTP against a raw-psycopg floor, interleaved."


class BenchError(Exception):
    """The bench cannot go on; the message says why (printed as one line, exit status 1)."""


def web_node_env(specs: list[str], nodes: int) -> dict[int, dict[str, str]]:
    """``--web-node-env``'s ``NODE:NAME=VALUE`` items, by node."""
    by_node: dict[int, dict[str, str]] = {}
    for spec in specs:
        node, _, assignment = spec.partition(":")
        name, equals, value = assignment.partition("=")
        if not node.isdigit() or not name or not equals:
            raise BenchError(f"--web-node-env {spec!r}: expected NODE:NAME=VALUE")
        if int(node) >= nodes:
            raise BenchError(f"--web-node-env {spec!r}: there are {nodes} web node(s), from 0")
        by_node.setdefault(int(node), {})[name] = value
    return by_node


def concurrencies(text: str) -> list[int]:
    """``--concurrency``'s comma-separated list, e.g. ``1,8,32``: positive integers."""
    try:
        levels = [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected integers such as 1,8,32") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected integers ≥ 1 such as 1,8,32")
    return levels


def parser() -> argparse.ArgumentParser:
    """Every option, with its default and what it changes."""
    parse = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    _passes(parse)
    _paced(parse)
    _web_tier(parse)
    _workers_and_floor(parse)
    _submitters(parse)
    _ledger_and_run(parse)
    return parse


def parse(argv: list[str]) -> dict[str, Any]:
    """The options as a dict (``options["web_workers"]``); exits with argparse's usage line
    (status 2) on a malformed one."""
    parse_ = parser()
    options = vars(parse_.parse_args(argv))
    for name in ("rounds", "web_nodes", "web_workers", "web_threads", "worker_concurrency",
                 "worker_processes", "floor_pool", "tenants"):  # fmt: skip
        if options[name] < 1:
            parse_.error(f"--{name.replace('_', '-')} must be at least 1")
    try:
        web_node_env(options["web_node_env"], options["web_nodes"])
    except BenchError as error:
        parse_.error(str(error))
    if options["fault_effects"] < 0 or options["fault_leases"] < 0:
        parse_.error("--fault-effects and --fault-leases must not be negative")
    options["fault_effects"] = options["fault_effects"] or (24 if options["quick"] else 160)
    options["fault_leases"] = options["fault_leases"] or (6 if options["quick"] else 20)
    return options


def _passes(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--concurrency",
        default=[1, 8, 32],
        type=concurrencies,
        help="comma-separated client concurrencies (default 1,8,32)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds per concurrency")
    parser.add_argument(
        "--effects",
        type=int,
        default=0,
        help="effects per pass (default: 50 × c, ≥ 1000; --quick: 4 × c, ≥ 16)",
    )
    parser.add_argument("--quick", action="store_true", help="one round, small passes")
    parser.add_argument(
        "--loop",
        default="submission",
        choices=["submission", "effect", "api"],
        help="what a client thread waits for before its next submission: the answer (c "
        "submissions in flight, the effects queue behind them), its effect CONFIRMED in "
        "the ledger (c effects in flight, as in the floor; tests.benchmarks.bench.client.Oracle), "
        "or the same learnt through the API's long poll, as an agent learns it (api)",
    )


def _paced(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--paced",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="after each concurrency's rounds, one more product pass whose submissions are "
        "offered at FRACTION of the throughput just measured (an open loop, e.g. 0.5): "
        "latency under a load the machine carries, where a closed loop at saturation "
        "measures its queue (c ÷ throughput)",
    )
    parser.add_argument(
        "--paced-rate",
        type=float,
        default=0.0,
        metavar="PER_SECOND",
        help="as --paced, at this many submissions a second instead of a fraction of the "
        "throughput just measured: the same offered load in runs to compare",
    )


def _web_tier(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--web-nodes", type=int, default=1, help="gunicorn servers")
    parser.add_argument(
        "--web-node-env",
        action="append",
        default=[],
        metavar="NODE:NAME=VALUE",
        help="an environment variable for one web node only (0-based, repeatable), e.g. "
        "--web-nodes 2 --web-node-env 1:GATEWAY_TOKEN_CACHE_TTL=0: two settings of the web "
        "tier side by side in the same passes, with each node's submit latency printed (runs "
        "one after the other on this machine differ more than most such settings do)",
    )
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument("--web-threads", type=int, default=3)
    parser.add_argument(
        "--web-server",
        default="gunicorn",
        choices=["gunicorn", "granian"],
        help="gunicorn's gthread worker (the deployment advice, docs/operations.md) or "
        "granian, measured against it",
    )


def _workers_and_floor(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--worker-concurrency", type=int, default=4)
    parser.add_argument("--worker-processes", type=int, default=1)
    # threads: the deployment advice (docs/operations.md): no pipe to a child per task.
    parser.add_argument("--worker-pool", default="threads", choices=["prefork", "threads"])
    parser.add_argument(
        "--no-autovacuum",
        action="store_true",
        help="on a server without autovacuum, run no stand-in for it during the product's "
        "passes (the prepared claim then keeps the plan of an empty ledger: "
        "tests/benchmarks/bench/autovacuum.py)",
    )
    parser.add_argument("--floor-pool", type=int, default=4)
    parser.add_argument(
        "--no-strict-floor",
        action="store_true",
        help="run only the httpx floor (httpx to the provider, the one the targets were set "
        "against), not also the strict one (the standard library's client, as the product's "
        "adapter uses)",
    )


def _submitters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tenants", type=int, default=1, help="submitting tenants")
    parser.add_argument(
        "--provider-gates",
        action="store_true",
        help="every provider with a rate limit and a cap too high to bind: what the gates' "
        "permits and leases cost an effect (without it, only the circuit's outlook is read)",
    )
    parser.add_argument(
        "--webhook-endpoint",
        action="store_true",
        help="each tenant has an enabled webhook endpoint (subscribed to an event the run "
        "never fires, so nothing is delivered): what an endpoint costs the record path",
    )
    parser.add_argument(
        "--budget-count",
        type=int,
        default=0,
        help="agents submit under a grant with a count budget this large (reserved at "
        "every submission), not under an unlimited one",
    )


def _ledger_and_run(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ledger",
        type=int,
        default=0,
        metavar="EFFECTS",
        help="before the passes, load a history of this many settled effects (another "
        "tenant's, tests/benchmarks/ledger_load.py) into the fresh database: a ledger the "
        "size of a deployment's, whose tables autovacuum analyzes when a tenth of them has "
        "changed, not every second as it does an empty ledger's growing tables",
    )
    parser.add_argument("--timeout", type=float, default=180)
    parser.add_argument(
        "--no-fault-pass",
        action="store_true",
        help="skip the fault pass (tests/benchmarks/bench/faults.py): answers dropped after "
        "commit then lookups answering, and claims left to their lease, at c = 8",
    )
    parser.add_argument(
        "--fault-effects",
        type=int,
        default=0,
        help="effects of the fault pass's UNKNOWN part (default 160; --quick: 24)",
    )
    parser.add_argument(
        "--fault-leases",
        type=int,
        default=0,
        help="claims of the fault pass's lease part (default 20; --quick: 6)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=0,
        help="first of the ports to use (web nodes from it, the provider at +9); "
        "default: free ports",
    )
