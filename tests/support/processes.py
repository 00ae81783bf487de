"""Real worker and beat processes for tests: started against the test database, the test's
broker and the test's sandbox, stopped (or killed) by the test."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def database_url() -> str:
    """The URL of the database this test runs on (pytest-django's test database, of this
    xdist worker), reached as the test reaches it: TCP, or the embedded server's socket."""
    db = connection.settings_dict
    auth = db["USER"] or "postgres"
    if db.get("PASSWORD"):
        auth += f":{quote(db['PASSWORD'], safe='')}"
    host = db["HOST"] or "127.0.0.1"
    if host.startswith("/"):
        return f"postgres://{auth}@{quote(host, safe='')}/{db['NAME']}"
    return f"postgres://{auth}@{host}:{db['PORT'] or 5432}/{db['NAME']}"


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url(),
        CELERY_BROKER_URL=settings.CELERY_BROKER_URL,
        GATEWAY_PROVIDER_URLS=json.dumps(settings.GATEWAY_PROVIDER_URLS),
        GATEWAY_PROVIDER_TIMEOUT=str(settings.GATEWAY_PROVIDER_TIMEOUT),
        GATEWAY_VAR_DIR=str(settings.VAR_DIR),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


class Celery:
    """A ``celery -A gateway worker`` (or beat) process on a queue of its own."""

    def __init__(
        self, kind: str, queue: str, log: Path, *, pool: str = "prefork", **env: str
    ) -> None:
        self.kind = kind
        self.queue = queue
        self.log = log
        args = [sys.executable, "-m", "celery", "-A", "gateway", kind, "--loglevel", "INFO"]
        if kind == "worker":
            args += [
                "--pool",
                pool,
                "--concurrency",
                "2",
                "--prefetch-multiplier",
                "1",
                "-Q",
                queue,
                "--without-heartbeat",
                "--without-mingle",
                "--without-gossip",
                "--hostname",
                f"test-{queue}@%h",
            ]
        else:
            args += ["--schedule", str(log.with_suffix(".schedule"))]
        self.handle = log.open("ab")
        self.process = subprocess.Popen(
            args,
            cwd=ROOT,
            stdout=self.handle,
            stderr=subprocess.STDOUT,
            # A pool's children start slowly beside two pytest processes on two cores.
            env=child_env(GATEWAY_TASK_QUEUE=queue, GATEWAY_WORKER_PROC_ALIVE_TIMEOUT="30", **env),
            start_new_session=True,
        )

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)
        self.handle.close()

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def free_port() -> int:
    """A loopback port free at the time of asking."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def new_queue() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


def wait_until(predicate: Callable[[], bool], *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
