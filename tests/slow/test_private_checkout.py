"""The two commands in a private checkout as root (slow tier, `make test-slow`): `make test`
and `make demo` in a clone in a 0700 directory under a 0700 parent, where the unprivileged
user PostgreSQL runs as reaches nothing; then `make clean`.

`make test` passes and leaves nothing behind but what installing made (the clients'
virtualenv, node_modules); `make demo` comes up, prints its URL, answers on it and names
where its database lives; `make clean` leaves the checkout as cloned and removes the
servers' data outside it. The clone's .venv is this run's (tests/embedded/checkout.py).

The inner `make test` is the whole suite (about as long again as the run that starts it);
EG_PRIVATE_CHECKOUT_PYTEST_ARGS narrows its pytest step, e.g. "tests/embedded -q".
"""

from __future__ import annotations

import os
import tempfile
import urllib.request
from pathlib import Path

import pytest

from tests.embedded.checkout import (
    MAKE,
    clone_env,
    private_clone,
    require_root_and_tools,
    run,
    run_until,
    shared_virtualenv_state,
    status,
    wait_gone,
)
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

# What installing makes in the checkout (`make clean` removes it): the clients' virtualenv and
# the npm packages of the console's accessibility checks and of the TypeScript client.
INSTALLED = {
    "!! .venv-clients/",
    "!! tests/console/node_modules/",
    "!! clients/typescript/node_modules/",
}
PYTEST_ARGS = os.environ.get("EG_PRIVATE_CHECKOUT_PYTEST_ARGS", "")


def leftovers(before: list[str], after: list[str]) -> list[str]:
    """What `git status --ignored` lists now and did not before, install products aside;
    entries deeper in an installed directory count as that directory."""
    return [
        line
        for line in after
        if line not in before and not any(line.startswith(dir_) for dir_ in INSTALLED)
    ]


def check_demo_is_up(port: int):
    def check(output: str) -> None:
        assert f"http://127.0.0.1:{port}/" in output, output[-3000:]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/", timeout=10) as response:
            assert response.status == 200

    return check


@pytest.mark.timeout(3600)
def test_make_test_and_make_demo_in_a_private_checkout():
    require_root_and_tools()
    shared = shared_virtualenv_state()
    with private_clone() as clone, tempfile.TemporaryDirectory() as cache:
        env = clone_env(Path(cache))
        before = status(clone)
        run([*MAKE, "test", f"PYTEST_ARGS={PYTEST_ARGS}"], clone, env, timeout=3000)
        assert shared_virtualenv_state() == shared, "make test installed into this virtualenv"
        assert leftovers(before, status(clone)) == []

        port, sandbox_port = free_port(), free_port()
        demo_args = f"DEMO_ARGS=--port {port} --sandbox-port {sandbox_port}"
        output, _ = run_until(
            [*MAKE, "demo", demo_args],
            clone,
            env,
            marker="Press Ctrl-C to stop.",
            timeout=900,
            while_up=check_demo_is_up(port),
        )
        assert "Press Ctrl-C to stop." in output, output[-3000:]
        home = (clone / "var" / "servers").resolve()
        assert f"data in {home / 'postgres'}" in output, output[-3000:]
        assert wait_gone(str(clone)) == [] and wait_gone(str(home)) == []

        run([*MAKE, "clean"], clone, env, timeout=120)
        assert not home.exists()
        assert status(clone) == [line for line in before if not line.startswith("!! .venv/")]
