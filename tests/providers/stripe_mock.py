"""stripe-stateful-mock, the Stripe-compatible server the Stripe adapter is tested against, run
as a child process on a free loopback port.

The server is an npm package pinned in ``scripts/stripe_server/package.json`` and its
lock file (the demo runs it too); ``npm ci`` installs it into its ``node_modules``
(gitignored) the first time, under a lock so that parallel test workers install it once.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.processes import free_port

SERVER_DIR = Path(__file__).resolve().parents[2] / "scripts" / "stripe_server"
ENTRY = SERVER_DIR / "node_modules" / "stripe-stateful-mock" / "dist" / "autostart.js"
API_KEY = "sk_test_effect_gateway"  # the mock accepts any key that starts with sk_test_


def node_missing() -> str:
    """Why the server cannot run here, or "" when it can."""
    if shutil.which("node") is None:
        return "node is not installed: stripe-stateful-mock cannot run"
    if not ENTRY.exists() and shutil.which("npm") is None:
        return "npm is not installed and stripe-stateful-mock is not installed yet"
    return ""


def ensure_installed() -> None:
    lock_path = Path(tempfile.gettempdir()) / "effect-gateway-stripe-mock-npm.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ENTRY.exists():
            subprocess.run(
                ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=SERVER_DIR,
                check=True,
                timeout=300,
            )


class StripeMock:
    """One running stripe-stateful-mock; ``url`` is its API base."""

    def __init__(self) -> None:
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, wait: float = 20.0) -> None:
        ensure_installed()
        for _ in range(3):  # the free port can be taken between choosing and binding it
            self.port = free_port()
            env = {**os.environ, "PORT": str(self.port), "LOG_LEVEL": "silent"}
            self.process = subprocess.Popen(
                ["node", str(ENTRY)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if self._wait_ready(wait):
                return
            self.stop()
        raise RuntimeError("stripe-stateful-mock did not start")

    def _wait_ready(self, wait: float) -> bool:
        assert self.process is not None
        deadline = time.monotonic() + wait
        request = urllib.request.Request(
            f"{self.url}/", headers={"Authorization": f"Bearer {API_KEY}"}
        )
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(request, timeout=1) as answer:
                    return bool(answer.status == 200)
            except (urllib.error.URLError, OSError):
                time.sleep(0.05)
        return False

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None
