"""``effect-gateway-mcp`` over streamable HTTP as a real process on a free loopback port, for
the tests (and checks) that drive it as a remote MCP client does."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.processes import free_port

ROOT = Path(__file__).resolve().parents[2]


def wait_for_port(port: int, *, timeout: float = 30) -> None:
    """Until loopback ``port`` accepts a connection, or ``timeout`` seconds have passed (the
    caller's first request then says what is wrong)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)


@contextmanager
def streamable_http_mcp(
    gateway_url: str,
    *,
    port: int | None = None,
    command: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[str]:
    """The MCP server (``command``, default ``python -m gateway.mcp_server``) for
    ``gateway_url`` on ``port`` (default a free one), without a token of its own; yields its
    URL and stops it on leaving. Without ``env`` it imports this checkout's client package
    first (an editable install may point at another)."""
    port = port or free_port()
    if env is None:
        paths = [str(ROOT / "clients" / "python" / "src"), str(ROOT)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    env = {k: v for k, v in env.items() if k != "GATEWAY_TOKEN"}
    argv = command or [sys.executable, "-m", "gateway.mcp_server"]
    process = subprocess.Popen(
        [
            *argv,
            *["--gateway-url", gateway_url, "--transport", "streamable-http"],
            *["--port", str(port)],
        ],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=10)
