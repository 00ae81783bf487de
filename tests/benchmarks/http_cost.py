"""What the provider client costs per call: the CPU of N execute + lookup pairs, against the
adapter module of another revision.

    .venv/bin/python -m tests.benchmarks.http_cost --calls 400 --rounds 9

It starts the sandbox provider as a child process (``manage.py run_sandbox_provider`` on a
free loopback port), so the CPU read here (``time.process_time``: user + system of this
process, one thread) is the client's alone. It loads the adapter module of a git revision
(``--baseline``; the default, ``c41cbd2``, holds a minimal client on the standard library's
sockets and ``http.client`` parser) from ``git show REV:gateway/providers/http.py`` into a
temporary module beside the worktree's, and runs rounds that alternate which goes first, each made
of N calls of ``execute`` (a new key each) and N lookups by key through one adapter, with
a warm-up call first (client, pool and connection made outside the measure). It prints each
side's median CPU and wall milliseconds per pair (an execute and its lookup) and the ratio.
Nothing here is timed in a test: it is a measuring tool.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _start_sandbox() -> tuple[subprocess.Popen[str], str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "gateway.settings",
        "DATABASE_URL": "postgres://nobody:nothing@127.0.0.1:9/none",
    }
    process = subprocess.Popen(
        [sys.executable, "manage.py", "run_sandbox_provider", "--port", "0"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    if not line.startswith("Sandbox provider listening on "):
        process.kill()
        raise SystemExit(f"the sandbox did not start: {line!r}")
    return process, line.rsplit(" ", 1)[-1]


def _module_at(revision: str, folder: Path) -> ModuleType:
    source = subprocess.run(
        ["git", "show", f"{revision}:gateway/providers/http.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = folder / "baseline_provider_http.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("baseline_provider_http", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _one_round(module: ModuleType, base_url: str, calls: int, tag: str) -> tuple[float, float]:
    """(CPU ms, wall ms) per execute + lookup pair."""
    from gateway.lib.digest import payload_digest
    from gateway.providers.base import ExecuteRequest

    adapter = module.HttpProviderAdapter(base_url)
    resource, payload = {"type": "queue", "id": "q"}, {"title": "cost"}
    digest = payload_digest(type="ticket.create", resource=resource, payload=payload)

    def pair(key: str) -> None:
        request = ExecuteRequest(
            effect_id=f"eff_{key}",
            type="ticket.create",
            idempotency_key=key,
            resource=resource,
            payload=payload,
            payload_digest=digest,
            timeout=5,
        )
        sent = adapter.execute(request)
        found = adapter.lookup(idempotency_key=key, timeout=5)
        if str(sent.outcome) != "confirmed" or found.status != "found":
            raise SystemExit(f"{module.__name__}: {sent} / {found}")

    pair(f"{tag}-warm")
    cpu, wall = time.process_time(), time.perf_counter()
    for n in range(calls):
        pair(f"{tag}-{n}")
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return cpu * 1000 / calls, wall * 1000 / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--baseline", default="c41cbd2")
    options = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")
    import django

    django.setup()
    from gateway.providers import http as current

    process, url = _start_sandbox()
    try:
        with tempfile.TemporaryDirectory() as folder:
            sides = {"baseline": _module_at(options.baseline, Path(folder)), "new": current}
            samples: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
            for r in range(options.rounds):
                order = list(sides) if r % 2 == 0 else list(reversed(sides))
                for name in order:
                    samples[name].append(
                        _one_round(sides[name], f"{url}/tickets", options.calls, f"{name}{r}")
                    )
    finally:
        process.terminate()
        process.wait(10)
    cpu = {name: statistics.median(s[0] for s in rows) for name, rows in samples.items()}
    wall = {name: statistics.median(s[1] for s in rows) for name, rows in samples.items()}
    print(f"{options.rounds} rounds x {options.calls} execute+lookup pairs, medians per pair")
    for name in sides:
        print(f"  {name:9} CPU {cpu[name]:.3f} ms   wall {wall[name]:.3f} ms")
    print(f"  new/baseline CPU {cpu['new'] / cpu['baseline']:.2f}x")


if __name__ == "__main__":
    main()
