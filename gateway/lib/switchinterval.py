"""How long a thread of a web process may run while another one, ready to go on, waits.

A gunicorn ``gthread`` process serves its requests on a few threads that share one interpreter
lock. A thread that waits for PostgreSQL or Redis lets the lock go; when its answer comes, it
needs the lock back, and gets it when the thread holding it blocks, or when Python's switch
interval (``sys.setswitchinterval``, 5 ms by default) has passed and the holder is made to let
go. A request spends up to a millisecond of Python between two waits (parsing the body, the
digest, building the answer), so with three threads busy a request that has its answer can
wait several milliseconds, more than once, for a neighbour's Python. Those waits were part of
the submissions' tail under load: at c = 32, offered at about half of what the machine
carries, a 1 ms interval gave a lower submit p99 in 12 of 18 interleaved pairs (median 22.9 ms
against 32.2 ms), with no loss of throughput; 0.5 ms was no better (docs/reliability.md,
session 13).

Only the web processes: the Celery worker's drainer and call threads measured less
throughput with it, and its latency is not an agent's wait.
"""

from __future__ import annotations

import sys


def set_switch_interval(milliseconds: float) -> float:
    """Let a ready thread wait at most ``milliseconds`` for the lock; the interval in seconds."""
    sys.setswitchinterval(milliseconds / 1000)
    return sys.getswitchinterval()
