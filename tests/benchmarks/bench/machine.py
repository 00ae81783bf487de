"""What the bench reads off the machine: CPU time per process from ``/proc``, a process's
descendants, how fast this machine runs pure Python and how its kernel shares the cores.

No Django: the floor's process (tests.benchmarks.bench.floor) reads its backends' CPU with
it too."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

TICKS = os.sysconf("SC_CLK_TCK")


def stat_seconds(stat: str, ticks: int = TICKS) -> float:
    """utime + stime, in seconds, of one ``/proc/PID/stat`` line. The command name (field 2)
    is in parentheses and may itself hold spaces and parentheses: the fields are counted from
    the last ``)``."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / ticks


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (all its threads), in seconds; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat_seconds(stat.read())
    except OSError:
        return 0.0


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (children, their children, …), as now."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            with open(f"/proc/{current}/task/{current}/children") as children:
                todo.extend(int(child) for child in children.read().split())
        except OSError:
            continue
    return found


@dataclass
class CpuGroups:
    """Per group, a snapshot {pid: cpu seconds}; the difference of two is what was spent."""

    groups: dict[str, dict[int, float]] = field(default_factory=dict)

    @classmethod
    def take(cls, pids: dict[str, list[int]]) -> CpuGroups:
        return cls({name: {pid: cpu_seconds(pid) for pid in ids} for name, ids in pids.items()})

    def spent_since(self, before: CpuGroups) -> dict[str, float]:
        """CPU seconds per group since ``before``: a process born since counts from 0; one
        gone since (0 now) counts nothing, not a negative."""
        spent = {}
        for name, now in self.groups.items():
            then = before.groups.get(name, {})
            spent[name] = sum(max(0.0, cpu - then.get(pid, 0.0)) for pid, cpu in now.items())
        return spent


def python_speed(additions: int = 5_000_000) -> float:
    """CPU seconds of this thread for a loop of ``additions`` in pure Python: how fast the
    machine runs the interpreter, which the milliseconds of every CPU figure depend on (one
    machine ran the same code at 3.1 ms per effect and the next at 7.1). Runs that read
    differently here were made on different machines: compare their ratios to the floor, not
    their milliseconds."""
    started = time.thread_time()
    total = 0
    for number in range(additions):
        total += number
    return time.thread_time() - started


def scheduler_grouping(path: str = "/proc/sys/kernel/sched_autogroup_enabled") -> str:
    """How the kernel shares the cores out, which moves the ratio more than most changes to
    the product do. With autogroups, every session weighs the same: a PostgreSQL backend
    (PostgreSQL gives each its own) as much as the whole web server or the whole Celery
    worker. Without, every runnable thread weighs the same."""
    try:
        with open(path) as setting:
            enabled = setting.read().strip()
    except OSError:
        return "unknown"
    return "autogroup (a share per session)" if enabled == "1" else "per thread, no autogroup"
