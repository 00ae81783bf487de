"""Does the sandbox provider stay flat? Its lookups timed on data files of growing size.

    .venv/bin/python -m tests.benchmarks.sandbox_scale --sizes 1k,10k,100k

Per size, in a scratch directory: a sandbox with a data file gets N operations through its
protocol handler (``handle_create``, timed), is closed, and a new one replays the file
(timed); then lookups by idempotency key and by operation id of operations spread over the
whole history, in process (``handle_lookup``) and over HTTP (one kept-alive connection to a
``SandboxServer``, the way the gateway's adapter calls it). Each lookup also appends its log
line to the file, as in production.

Printed per size: p50 / p99 of each, the data file's size, the replay time, and the ratio of
each in-process p50 to a plain ``dict.get`` on a dict of the same size timed the same way in
the same process (so figures from different machines compare). No database, no assertion:
these are figures (the test suite checks correctness, in
``tests/providers/test_sandbox_journal.py``).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpx

from gateway.lib.digest import payload_digest
from gateway.providers.sandbox import SandboxProvider, SandboxServer


def parse_size(text: str) -> int:
    text = text.strip().lower()
    factor = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
    return int(float(text.rstrip("km")) * factor)


def bodies(count: int) -> list[bytes]:
    """A few distinct valid request bodies (digest computed once each)."""
    out = []
    for n in range(count):
        data: dict[str, Any] = {
            "type": "billing.charge.create",
            "resource": {"type": "order", "id": f"ord_{n}"},
            "payload": {"amount": 100 + n, "currency": "EUR", "description": f"order {n}"},
        }
        data["payload_digest"] = payload_digest(**data)
        out.append(json.dumps(data).encode())
    return out


def timed(call: Callable[[Any], object], items: Iterable[Any]) -> list[float]:
    """The wall time of ``call(item)`` for each item, in microseconds."""
    times = []
    for item in items:
        start = time.perf_counter_ns()
        call(item)
        times.append((time.perf_counter_ns() - start) / 1000)
    return times


def interleaved(
    first: Callable[[str], object], second: Callable[[str], object], keys: list[str]
) -> tuple[list[float], list[float]]:
    """Time ``first(key)`` and ``second(key)`` alternately, so both see the same machine."""
    times = timed(lambda pair: pair[0](pair[1]), [(f, k) for k in keys for f in (first, second)])
    return times[0::2], times[1::2]


def percentiles(times: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(times, n=100, method="inclusive")
    return cuts[49], cuts[98]


def build(data_file: Path, size: int) -> list[float]:
    sandbox = SandboxProvider(data_file=data_file)
    samples = bodies(16)

    def create(n: int) -> object:
        return sandbox.handle_create(
            provider="billing", idempotency_key=f"key-{n}", body=samples[n % 16]
        )

    times = timed(create, range(size))
    sandbox.close()
    return times


def measure(size: int, samples: int, http_samples: int, workdir: Path) -> dict[str, Any]:
    data_file = workdir / f"sandbox-{size}.json"
    creates = build(data_file, size)
    start = time.perf_counter()
    sandbox = SandboxProvider(data_file=data_file)
    replay = time.perf_counter() - start
    ids = {op["idempotency_key"]: op["id"] for op in sandbox.operations()}
    keys = random.sample(sorted(ids), min(samples, size))
    reference = {f"key-{n}": {"id": n} for n in range(size)}

    def by_key(key: str) -> object:
        return sandbox.handle_lookup(provider="billing", idempotency_key=key)

    def by_id(key: str) -> object:
        return sandbox.handle_lookup(provider="billing", operation_id=ids[key])

    key_times, id_times = interleaved(by_key, by_id, keys)
    figures: dict[str, Any] = {
        "size": size,
        "replay_s": replay,
        "create": percentiles(creates),
        "dict": percentiles(timed(reference.get, keys)),
        "by key": percentiles(key_times),
        "by id": percentiles(id_times),
    }
    figures.update(measure_http(sandbox, keys[:http_samples], ids))
    figures["file_bytes"] = data_file.stat().st_size
    sandbox.close()
    data_file.unlink()
    return figures


def measure_http(sandbox: SandboxProvider, keys: list[str], ids: dict[str, str]) -> dict[str, Any]:
    with SandboxServer(sandbox) as server, httpx.Client(base_url=server.base_url("billing")) as c:
        c.get("/operations", params={"idempotency_key": keys[0]}).raise_for_status()  # connect

        def by_key(key: str) -> None:
            c.get("/operations", params={"idempotency_key": key}).raise_for_status()

        def by_id(key: str) -> None:
            c.get(f"/operations/{ids[key]}").raise_for_status()

        key_times, id_times = interleaved(by_key, by_id, keys)
        return {"http by key": percentiles(key_times), "http by id": percentiles(id_times)}


def report(rows: list[dict[str, Any]]) -> None:
    columns = ("create", "by key", "by id", "http by key", "http by id", "dict")
    print("p50 / p99 in microseconds; x = in-process p50 / dict.get p50 at the same size")
    print(
        f"{'operations':>10}  "
        + "  ".join(f"{name:>17}" for name in columns)
        + f"  {'x key':>6}  {'x id':>6}  {'file':>9}  {'replay':>7}"
    )
    for row in rows:
        cells = "  ".join(f"{row[name][0]:>8.1f}/{row[name][1]:<8.1f}" for name in columns)
        ratio_key = row["by key"][0] / row["dict"][0]
        ratio_id = row["by id"][0] / row["dict"][0]
        megabytes = row["file_bytes"] / 1e6
        print(
            f"{row['size']:>10,}  {cells}  {ratio_key:>6.0f}  {ratio_id:>6.0f}"
            f"  {megabytes:>7.1f}MB  {row['replay_s']:>6.2f}s"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1k,10k,100k")
    parser.add_argument("--samples", type=int, default=2000, help="in-process lookups per kind")
    parser.add_argument("--http-samples", type=int, default=500, help="HTTP lookups per kind")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    random.seed(args.seed)
    rows = []
    with tempfile.TemporaryDirectory(prefix="sandbox-scale-") as workdir:
        for size in (parse_size(s) for s in args.sizes.split(",")):
            rows.append(measure(size, args.samples, args.http_samples, Path(workdir)))
            print(f"... {size:,} operations measured", flush=True)
    report(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
