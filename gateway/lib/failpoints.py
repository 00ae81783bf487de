"""Failpoints: named places where a test can make this process die, to prove recovery.

Inert unless ``GATEWAY_FAILPOINTS`` is set, e.g. ``dispatch.after_call=2,dispatch.after_claim=1``:
each named point then kills the process with SIGKILL — no cleanup, no ack, exactly like a
machine losing power — the first N times any process reaches it. ``name=N@K`` lets the first
K reaches pass and kills at the N after them (a worker killed in the middle of its work, not
at its first step). The count lives in files under ``<var>/failpoints/`` so that it survives
the deaths it causes.
"""

from __future__ import annotations

import fcntl
import os
import signal
from functools import cache
from pathlib import Path

from django.conf import settings


def parse(spec: str) -> dict[str, tuple[int, int]]:
    """``name=N@K,…`` → {name: (N kills, after K reaches)}."""
    budget: dict[str, tuple[int, int]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, count = item.partition("=")
        times, _, skip = count.partition("@")
        budget[name] = (int(times or 1), int(skip or 0))
    return budget


@cache
def _budget() -> dict[str, tuple[int, int]]:
    return parse(os.environ.get("GATEWAY_FAILPOINTS", ""))


def failpoint(name: str) -> None:
    times, skip = _budget().get(name, (0, 0))
    if not times:
        return
    folder = Path(os.environ.get("GATEWAY_FAILPOINT_DIR") or Path(settings.VAR_DIR) / "failpoints")
    folder.mkdir(parents=True, exist_ok=True)
    tally = folder / name
    # One byte per reach, appended under an exclusive lock that a killing reach holds until
    # the process is gone: a sibling thread waits on the lock and dies with it, so the tally
    # counts kills exactly (one byte within the budget = one dead process).
    fd = os.open(tally, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, b".")
        if skip < os.fstat(fd).st_size <= skip + times:
            os.kill(os.getpid(), signal.SIGKILL)
    finally:
        os.close(fd)
