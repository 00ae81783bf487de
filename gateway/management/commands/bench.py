"""``manage.py bench``: N effects end to end (HTTP API → Celery worker → sandbox provider →
CONFIRMED) at a chosen concurrency, then the same keys replayed; prints throughput, latency
and provider duplicates for both passes.

It starts what it measures: a sandbox provider (in this process), gunicorn and one Celery
worker process, on whatever DATABASE_URL / CELERY_BROKER_URL say (SQLite and the filesystem
broker by default; PostgreSQL and Redis for figures worth quoting).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from gateway.choices import SETTLED, EffectStatus
from gateway.models import Effect
from gateway.providers.sandbox import SandboxProvider, SandboxServer

ROOT = Path(settings.BASE_DIR)
PROVIDERS = ("billing", "inventory", "shipping", "deploy", "tickets", "mail", "verify")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * len(ordered)) - 1))
    return ordered[index]


class Command(BaseCommand):
    help = "Benchmark: N effects end to end, then a replay of the same keys."

    def add_arguments(self, parser):
        parser.add_argument("--effects", type=int, default=200)
        parser.add_argument("--concurrency", type=int, default=8)
        parser.add_argument("--worker-concurrency", type=int, default=4)
        parser.add_argument("--timeout", type=float, default=300)

    def handle(
        self,
        *args,
        effects: int,
        concurrency: int,
        worker_concurrency: int,
        timeout: float,
        **options,
    ):
        if effects < 1 or concurrency < 1:
            raise CommandError("--effects and --concurrency must be positive")
        call_command("migrate", interactive=False, verbosity=0)
        run = uuid.uuid4().hex[:8]
        token = self._token(run)
        sandbox = SandboxServer(SandboxProvider(), port=0).start()
        urls = {name: sandbox.base_url(name) for name in PROVIDERS}
        env = {
            **os.environ,
            "GATEWAY_PROVIDER_URLS": json.dumps(urls),
            "GATEWAY_TASK_QUEUE": f"bench-{run}",
            "PYTHONUNBUFFERED": "1",
        }
        port = free_port()
        logs = settings.VAR_DIR / "bench"
        logs.mkdir(parents=True, exist_ok=True)
        children = [
            self._spawn(
                [
                    sys.executable,
                    "-m",
                    "gunicorn",
                    "gateway.wsgi",
                    "-b",
                    f"127.0.0.1:{port}",
                    "-w",
                    "2",
                    "--threads",
                    str(max(concurrency, 4)),
                    "-k",
                    "gthread",
                    "--log-level",
                    "warning",
                ],
                env,
                logs / "web.log",
            ),
            self._spawn(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "gateway",
                    "worker",
                    "--loglevel",
                    "WARNING",
                    "--concurrency",
                    str(worker_concurrency),
                    "--prefetch-multiplier",
                    "1",
                    "-Q",
                    f"bench-{run}",
                    "--without-heartbeat",
                    "--without-mingle",
                    "--without-gossip",
                ],
                env,
                logs / "worker.log",
            ),
        ]
        try:
            base = f"http://127.0.0.1:{port}"
            self._wait_ready(base)
            self.stdout.write(
                f"bench {run}: {effects} effects, concurrency {concurrency}, "
                f"worker concurrency {worker_concurrency}, database "
                f"{settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}, broker "
                f"{settings.CELERY_BROKER_URL.split('://')[0]}"
            )
            keys = [f"bench:{run}:{index}" for index in range(effects)]
            first = self._pass(base, token, keys, concurrency, timeout, expect=201)
            replay = self._pass(base, token, keys, concurrency, timeout, expect=200)
            duplicates = sum(
                1 for count in self._ops_per_key(sandbox.provider).values() if count > 1
            )
            self._report("first pass", first, duplicates)
            self._report("replay pass", replay, duplicates)
            self.stdout.write(
                f"provider operations: {len(sandbox.provider.operations())} "
                f"for {effects} keys; keys executed more than once: {duplicates}"
            )
        finally:
            for child in children:
                if child.poll() is None:
                    os.killpg(child.pid, signal.SIGTERM)
            for child in children:
                try:
                    child.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(child.pid, signal.SIGKILL)
            sandbox.stop()

    def _token(self, run: str) -> str:
        from io import StringIO

        out = StringIO()
        call_command(
            "issue_token", tenant="bench", principal=f"bench-{run}", role="agent", stdout=out
        )
        return out.getvalue().strip().splitlines()[-1]

    def _spawn(self, args: list[str], env: dict, log: Path) -> subprocess.Popen:
        return subprocess.Popen(
            args,
            cwd=ROOT,
            env=env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _wait_ready(self, base: str) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise CommandError("the web server did not start; see var/bench/web.log")

    def _pass(self, base, token, keys, concurrency, timeout, *, expect: int) -> dict:
        headers = {"Authorization": f"Bearer {token}"}
        body = {
            "type": "ticket.create",
            "resource": {"type": "queue", "id": "bench"},
            "intent": {"summary": "benchmark"},
        }
        api_latency: list[float] = []
        wrong: list[int] = []

        def submit(index_key):
            index, key = index_key
            payload = {"title": f"bench {index}", "priority": "P4"}
            with httpx.Client(timeout=30) as client:
                started = time.perf_counter()
                response = client.post(
                    f"{base}/api/v1/commands",
                    headers={**headers, "Idempotency-Key": key},
                    json={**body, "payload": payload},
                )
                api_latency.append(time.perf_counter() - started)
            if response.status_code != expect:
                wrong.append(response.status_code)
            return response.json().get("effect_id")

        started = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            ids = [i for i in pool.map(submit, enumerate(keys)) if i]
        submitted = time.perf_counter() - started
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            open_count = Effect.objects.filter(pk__in=ids).exclude(status__in=SETTLED).count()
            if open_count == 0:
                break
            time.sleep(0.2)
        elapsed = time.perf_counter() - started
        rows = list(
            Effect.objects.filter(pk__in=ids).values_list("status", "created_at", "confirmed_at")
        )
        end_to_end = [
            (confirmed - created).total_seconds()
            for status, created, confirmed in rows
            if status == EffectStatus.CONFIRMED and confirmed
        ]
        return {
            "count": len(keys),
            "ids": len(ids),
            "wrong": wrong,
            "submitted_s": submitted,
            "elapsed_s": elapsed,
            "api": api_latency,
            "e2e": end_to_end,
            "confirmed": sum(1 for row in rows if row[0] == EffectStatus.CONFIRMED),
        }

    def _ops_per_key(self, provider: SandboxProvider) -> dict[str, int]:
        counts: dict[str, int] = {}
        for op in provider.operations():
            counts[op["idempotency_key"]] = counts.get(op["idempotency_key"], 0) + 1
        return counts

    def _report(self, name: str, result: dict, duplicates: int) -> None:
        api, e2e = result["api"], result["e2e"]
        self.stdout.write(
            f"{name}: {result['count']} requests in {result['submitted_s']:.2f}s "
            f"({result['count'] / result['submitted_s']:.1f} req/s); API p50 "
            f"{percentile(api, 50) * 1000:.1f} ms, p99 {percentile(api, 99) * 1000:.1f} ms; "
            f"unexpected statuses: {len(result['wrong'])}"
        )
        if name == "first pass":
            self.stdout.write(
                f"  end to end: {result['confirmed']}/{result['count']} CONFIRMED in "
                f"{result['elapsed_s']:.2f}s ({result['confirmed'] / result['elapsed_s']:.1f} "
                f"effects/s); submit→CONFIRMED p50 {percentile(e2e, 50) * 1000:.0f} ms, "
                f"p99 {percentile(e2e, 99) * 1000:.0f} ms"
            )
        else:
            self.stdout.write(f"  provider duplicates after replay: {duplicates}")
