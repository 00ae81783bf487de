"""The product's processes in a bench run: web nodes (gunicorn or granian) and Celery workers
(the first with the beat embedded, so that the sweeper and the audit sequencer run), each in a
session of its own, logging to ``var/bench/``, stopped with their whole process group."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.benchmarks.bench.machine import descendants
from tests.benchmarks.bench.options import BenchError, web_node_env

ROOT = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def web_server_command(options: dict[str, Any], port: int) -> list[str]:
    """One web node: ``--web-workers`` processes × ``--web-threads`` threads each."""
    workers, threads = str(options["web_workers"]), str(options["web_threads"])
    if options["web_server"] == "granian":
        return [
            sys.executable, "-m", "granian", "--interface", "wsgi",
            "--host", "127.0.0.1", "--port", str(port),
            "--workers", workers, "--blocking-threads", threads, "--runtime-threads", "1",
            "--log-level", "warning", "gateway.wsgi:application",
        ]  # fmt: skip
    return [
        sys.executable, "-m", "gunicorn", "gateway.wsgi", "-b", f"127.0.0.1:{port}",
        "-w", workers, "--threads", threads, "-k", "gthread", "--log-level", "warning",
    ]  # fmt: skip


def worker_command(options: dict[str, Any], run: str, index: int, logs: Path) -> list[str]:
    """Celery worker ``index`` on the run's queues; the first embeds the one beat (the
    sweeper and the audit sequencer)."""
    worker = [
        sys.executable, "-m", "celery", "-A", "gateway", "worker",
        "--loglevel", "WARNING",
        "--concurrency", str(options["worker_concurrency"]),
        "--pool", options["worker_pool"],
        "--prefetch-multiplier", "1",
        "-Q", f"bench-{run},bench-{run}-audit",
        "-n", f"bench{index}-{run}@%h",
        "--without-heartbeat", "--without-mingle", "--without-gossip",
    ]  # fmt: skip
    if index == 0:
        worker += ["-B", "-s", str(logs / f"beat-{run}")]
    return worker


# Gates that count every call but never bind at the bench's rates: what the permit path
# (a Redis admit per claim, a lease per call, their release) costs an effect.
OPEN_GATES = {"rate_limit": "100000/s", "max_in_flight": 1000}


def product_env(run: str, urls: dict[str, str], *, gates: bool = False) -> dict[str, str]:
    """The environment of every product process of the run; ``gates``: every provider
    rate-limited and capped (``OPEN_GATES``), not only the circuit's outlook per claim."""
    providers = {"GATEWAY_PROVIDERS": json.dumps(
        {name: {"base_url": url, **OPEN_GATES} for name, url in urls.items()}
    )} if gates else {}  # fmt: skip
    return {
        **os.environ,
        **providers,
        "GATEWAY_PROVIDER_URLS": json.dumps(urls),
        "GATEWAY_TASK_QUEUE": f"bench-{run}",
        "PYTHONUNBUFFERED": "1",
        "LOG_LEVEL": "WARNING",
        # Backends that live for the whole run: their CPU is read from /proc per pass.
        "GATEWAY_DB_CONN_MAX_AGE": "600",
        # The sequencer on a queue of its own: a seal pass does not wait behind dispatches.
        "GATEWAY_AUDIT_QUEUE": f"bench-{run}-audit",
    }


class Stack:
    """The web nodes and the workers of one run, by group (``web``, ``worker``)."""

    def __init__(self, options: dict[str, Any], logs: Path) -> None:
        self.options = options
        self.logs = logs
        self.children: list[subprocess.Popen] = []
        self.groups: dict[str, list[subprocess.Popen]] = {"web": [], "worker": []}

    def start(self, run: str, ports: list[int], urls: dict[str, str]) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        env = product_env(run, urls, gates=self.options["provider_gates"])
        node_env = web_node_env(self.options["web_node_env"], len(ports))
        for node, port in enumerate(ports):
            command = web_server_command(self.options, port)
            web = self._spawn(command, {**env, **node_env.get(node, {})}, f"web{node}.log")
            self.groups["web"].append(web)
        for index in range(self.options["worker_processes"]):
            command = worker_command(self.options, run, index, self.logs)
            self.groups["worker"].append(self._spawn(command, env, f"worker{index}.log"))

    def pids(self) -> dict[str, list[int]]:
        """Every process of each group, as now (a worker's pool children included)."""
        return {
            name: [pid for child in children for pid in descendants(child.pid)]
            for name, children in self.groups.items()
        }

    def wait_ready(self, bases: list[str], seconds: float = 60) -> None:
        """Until every web node answers ``/healthz``."""
        deadline = time.monotonic() + seconds
        waiting = list(bases)
        while waiting and time.monotonic() < deadline:
            try:
                if httpx.get(f"{waiting[0]}/healthz", timeout=1).status_code == 200:
                    waiting.pop(0)
                    continue
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        if waiting:
            raise BenchError(f"the web server did not start; see {self.logs}/web0.log")

    def stop(self) -> None:
        for child in self.children:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGTERM)
        for child in self.children:
            try:
                child.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)

    def _spawn(self, args: list[str], env: dict[str, str], log: str) -> subprocess.Popen:
        """A child in a session of its own (stopped with its group), listed at once so that
        a failure while its siblings start still stops it."""
        child = subprocess.Popen(
            args,
            cwd=ROOT,
            env=env,
            stdout=(self.logs / log).open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.children.append(child)
        return child
