"""What the bench reads off the machine (tests.benchmarks.bench.machine): CPU per process from
/proc, a process tree, and the probe of how fast the machine runs Python."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

from tests.benchmarks.bench.machine import (
    CpuGroups,
    cpu_seconds,
    descendants,
    python_speed,
    scheduler_grouping,
    stat_seconds,
)


def _stat(comm: str, utime: int, stime: int) -> str:
    """A /proc/PID/stat line: pid (comm) state, then fields 4 … 13, utime (14), stime (15), …"""
    return f"4242 ({comm}) S 1 4242 4242 0 -1 4194560 100 0 0 0 {utime} {stime} 0 0 20 0 3 0"


def test_cpu_time_is_user_plus_system_in_clock_ticks():
    assert stat_seconds(_stat("gunicorn", 250, 50), ticks=100) == 3.0


def test_a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields():
    assert stat_seconds(_stat("celery (worker) x", 7, 3), ticks=10) == 1.0


def test_this_process_has_spent_cpu_and_a_gone_one_has_spent_none():
    started = cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass
    assert cpu_seconds(os.getpid()) > started
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert cpu_seconds(gone.pid) == 0.0


def test_a_process_tree_is_listed_whole():
    shell = subprocess.Popen(["sh", "-c", "sleep 5 & sleep 5 & wait"])
    found = [shell.pid]
    try:
        deadline = time.monotonic() + 5
        while len(found := descendants(shell.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert found[0] == shell.pid and len(found) == 3
    finally:
        for pid in reversed(found):  # the sleeps, then the shell: only what this test started
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        shell.wait(5)


def test_what_a_group_spent_counts_newborns_from_zero_and_the_departed_as_nothing():
    before = CpuGroups({"web": {1: 1.0, 2: 5.0}, "pg": {9: 2.0}})
    now = CpuGroups({"web": {1: 1.5, 2: 0.0, 3: 0.25}, "pg": {9: 2.0}})
    assert now.spent_since(before) == {"web": 0.75, "pg": 0.0}


def test_a_snapshot_of_this_process_sees_the_cpu_it_spends():
    before = CpuGroups.take({"bench": [os.getpid()]})
    python_speed(2_000_000)
    assert CpuGroups.take({"bench": [os.getpid()]}).spent_since(before)["bench"] > 0


def test_the_header_says_how_the_kernel_shares_the_cores(tmp_path):
    setting = tmp_path / "sched_autogroup_enabled"
    setting.write_text("1\n")
    assert scheduler_grouping(str(setting)).startswith("autogroup")
    setting.write_text("0\n")
    assert scheduler_grouping(str(setting)).startswith("per thread")
    assert scheduler_grouping(str(tmp_path / "absent")) == "unknown"


def test_the_machines_python_speed_is_the_cpu_the_loop_took():
    # No loop takes next to nothing; a million additions take milliseconds on any machine.
    assert 0 <= python_speed(0) < 0.005 < python_speed(1_000_000)
