"""A checkout of this repository in a private directory, as root: where containers and CI
runners start, and where the unprivileged user PostgreSQL runs as cannot reach anything.

`private_clone()` clones HEAD into a 0700 directory under a 0700 parent, brings over the
working tree's uncommitted changes (so the code under test is the code being edited), and
gives the clone a .venv made of links to this interpreter's virtualenv instead of
installing one. That .venv has an install stamp of its own, newer than the clone's
pyproject.toml: make never reinstalls into the shared virtualenv, also not from a sub-make
(which `make -o .venv/.installed` would not cover).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What this run (or the machine) sets and a command in the clone must choose afresh: this
# run's servers and settings, make's and the tools' own variables (bytecode off would hide
# the __pycache__ a run leaves behind).
RUN_ENV = {
    "PYTHONDONTWRITEBYTECODE",
    "DATABASE_URL",
    "CELERY_BROKER_URL",
    "GATEWAY_VAR_DIR",
    "GATEWAY_TASK_QUEUE",
    "PYTEST_XDIST_WORKER",
    "PYTEST_XDIST_WORKER_COUNT",
    "PYTEST_CURRENT_TEST",
    "PYTEST_ADDOPTS",
    "MAKEFLAGS",
    "MFLAGS",
    "MAKELEVEL",
    "PYTHONPYCACHEPREFIX",
    "RUFF_CACHE_DIR",
    "MYPY_CACHE_DIR",
    "HYPOTHESIS_STORAGE_DIRECTORY",
    "DJANGO_SETTINGS_MODULE",
}
MAKE = ["make", "-o", ".venv/.installed"]


def running_with(marker: str) -> list[int]:
    """PIDs of processes whose command line mentions `marker` (a unique temporary path)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline:
            pids.append(int(entry.name))
    return pids


def wait_gone(marker: str, timeout: float = 15) -> list[int]:
    """Wait for the processes that mention `marker` to end; return those still running."""
    deadline = time.monotonic() + timeout
    while (left := running_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def require_root_and_tools() -> None:
    if os.geteuid() != 0:
        pytest.skip(
            "runs a checkout in a private directory as root (PostgreSQL then runs as "
            "'nobody', which cannot reach it); this run is not root"
        )
    for tool in ("git", "make"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")


def _git(*args: str, cwd: Path = ROOT) -> str:
    result = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=120
    )
    return result.stdout


def _bring_over_changes(clone: Path) -> None:
    """Copy the working tree's changed and new (not ignored) files into the clone."""
    changed = _git("diff", "--name-only", "HEAD").splitlines()
    new = _git("ls-files", "--others", "--exclude-standard").splitlines()
    for name in [*changed, *new]:
        source, target = ROOT / name, clone / name
        if source.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
        else:
            target.unlink(missing_ok=True)


def status(clone: Path) -> list[str]:
    """`git status --ignored` of the clone: what the checkout holds beyond its commit."""
    return _git(
        "status", "--porcelain", "--ignored", "--untracked-files=all", cwd=clone
    ).splitlines()


def shared_virtualenv_state() -> tuple[float | None, list[str]]:
    """This interpreter's install stamp time and installed distributions: a command in a clone
    must leave both as they were (it links to this virtualenv, never installs into it)."""
    prefix = Path(sys.prefix).resolve()
    stamp = prefix / ".installed"
    stamp_time = stamp.stat().st_mtime if stamp.exists() else None
    installed = sorted(
        f"{path.name}:{path.stat().st_mtime}"
        for path in prefix.glob("lib/*/site-packages/*.dist-info")
    )
    return stamp_time, installed


def _link_virtualenv(venv: Path) -> None:
    """A virtualenv whose entries link to this interpreter's, with its own install stamp."""
    venv.mkdir()
    for entry in Path(sys.prefix).iterdir():
        if entry.name != ".installed":
            (venv / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    (venv / ".installed").touch()  # after the clone: newer than its pyproject.toml


@contextmanager
def private_clone() -> Iterator[Path]:
    """A clone at <0700 dir>/<0700 dir>/eg, removed afterwards (with its servers' data)."""
    parent = Path(tempfile.mkdtemp(prefix="eg-private-"))
    clone = Path(tempfile.mkdtemp(dir=parent)) / "eg"
    try:
        _git("clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone))
        _bring_over_changes(clone)
        _link_virtualenv(clone / ".venv")
        yield clone
    finally:
        servers = clone / "var" / "servers"
        if servers.is_symlink():
            shutil.rmtree(servers.resolve(), ignore_errors=True)
        shutil.rmtree(parent, ignore_errors=True)


def clone_env(cache: Path, **extra: str) -> dict[str, str]:
    """The environment of a command in the clone: none of this run's servers or settings."""
    env = {key: value for key, value in os.environ.items() if key not in RUN_ENV}
    env.update(EG_CACHE_DIR=str(cache / "tools"), PYTHONUNBUFFERED="1", **extra)
    return env


def run(argv: list[str], clone: Path, env: dict[str, str], timeout: float) -> str:
    """Run a command in the clone; fail the test with its output when it fails."""
    result = subprocess.run(
        argv,
        cwd=clone,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
        start_new_session=True,
    )
    assert result.returncode == 0, f"{' '.join(argv)} failed:\n{result.stdout[-6000:]}"
    return result.stdout


def run_until(
    argv: list[str],
    clone: Path,
    env: dict[str, str],
    marker: str,
    timeout: float,
    while_up: Callable[[str], None] = lambda output: None,
) -> tuple[str, int]:
    """Start a long-running command in the clone, read its output until a line contains
    `marker`, call `while_up` with the output so far, then stop the command with Ctrl-C's
    signal; return its whole output and its exit status."""
    process = subprocess.Popen(
        argv,
        cwd=clone,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    timer = _Alarm(timeout, process)
    try:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if marker in line:
                break
        try:
            while_up("".join(lines))
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGINT)
            rest, _ = process.communicate(timeout=60)
            lines.append(rest)
    finally:
        timer.cancel()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return "".join(lines), process.returncode


class _Alarm:
    """Kill a process group after `seconds` (a read loop cannot time out by itself)."""

    def __init__(self, seconds: float, process: subprocess.Popen) -> None:
        self._timer = threading.Timer(seconds, self._fire, args=(process,))
        self._timer.daemon = True
        self._timer.start()

    @staticmethod
    def _fire(process: subprocess.Popen) -> None:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)

    def cancel(self) -> None:
        self._timer.cancel()
