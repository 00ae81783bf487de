"""The checkout itself: migrations match the models, and in a private directory as root (a
`mktemp -d` clone, a checkout under /root) the embedded servers start where the unprivileged
server user can reach them, and a test run leaves nothing behind in the checkout.

The full two commands (`make test`, `make demo`) in such a checkout: tests/slow/.
"""

from __future__ import annotations

import io
import os
import pwd
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from django.core.management import call_command

from gateway import embedded
from tests.embedded.checkout import (
    MAKE,
    clone_env,
    private_clone,
    require_root_and_tools,
    run,
    status,
    wait_gone,
)


@pytest.mark.django_db
def test_the_migrations_match_the_models():
    # --check exits with status 1 (SystemExit, failing the test) when a migration is missing.
    call_command("makemigrations", "--check", "--dry-run", stdout=io.StringIO())


@pytest.mark.timeout(600)
def test_a_test_run_in_a_private_checkout_starts_its_servers_and_leaves_nothing_behind():
    require_root_and_tools()
    with private_clone() as clone, tempfile.TemporaryDirectory() as cache:
        before = status(clone)
        output = run(
            [
                *MAKE,
                "pytest",
                "PYTEST_WORKERS=0",
                "PYTEST_ARGS=tests/embedded/test_api_root.py -q",
            ],
            clone,
            clone_env(Path(cache)),
            timeout=540,
        )
        assert " passed" in output, output[-3000:]  # run() checked the exit status
        assert status(clone) == before


@pytest.mark.timeout(300)
def test_a_command_in_a_private_checkout_keeps_its_servers_where_they_can_run():
    require_root_and_tools()
    with private_clone() as clone, tempfile.TemporaryDirectory() as cache:
        show_host = (
            "from django.db import connection; connection.ensure_connection();"
            "print(connection.settings_dict['HOST'])"
        )
        env = clone_env(Path(cache), PYTHONPYCACHEPREFIX=str(Path(cache) / "pycache"))
        output = run([sys.executable, "manage.py", "shell", "-c", show_host], clone, env, 240)
        link = clone / "var" / "servers"
        assert link.is_symlink(), output
        home = link.resolve()
        assert not home.is_relative_to(clone.parent)
        assert output.strip().splitlines()[-1] == str(home / "run")
        data = home / "postgres"
        assert (data / "PG_VERSION").read_text().strip() == embedded.PG_MAJOR
        assert data.stat().st_uid == pwd.getpwnam(embedded.UNPRIVILEGED_USER).pw_uid
        assert data.stat().st_mode & 0o777 == 0o700
        assert wait_gone(str(home)) == []  # stopped with the command
        assert not (clone / "var" / "postgres").exists()


def test_make_test_told_not_to_install_never_installs_not_even_from_a_sub_make():
    """`make -o .venv/.installed test` must run nothing that installs: -o does not reach a
    sub-make, which would find the stamp older than pyproject.toml and reinstall."""
    if shutil.which("git") is None or shutil.which("make") is None:
        pytest.skip("git and make are needed")
    with private_clone() as clone, tempfile.TemporaryDirectory() as cache:
        os.utime(clone / ".venv" / ".installed", (0, 0))  # older than pyproject.toml
        output = run([*MAKE, "-n", "test", "demo", "test-slow"], clone, clone_env(Path(cache)), 60)
        assert "pytest" in output and "manage.py demo" in output
        assert "install.sh" not in output and "pip install -e" not in output, output
