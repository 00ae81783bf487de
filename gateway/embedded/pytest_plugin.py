"""pytest plugin (``-p gateway.embedded.pytest_plugin``): the test run's own servers.

With no ``DATABASE_URL``, the run starts one embedded PostgreSQL and one Valkey before Django
reads its settings, points the environment at them, and stops them when the run ends, also
after Ctrl-C or a failure. xdist workers inherit the environment, so all workers share the
two servers; pytest-django gives each worker its own test database (``test_gateway_gw0``…),
and each worker gets its own default task queue so their messages never mix.

The run also gets a private ``GATEWAY_VAR_DIR`` (with its development vault key written once,
before the workers start): a demo running in the same checkout, or a ``make clean``, can then
neither see nor disturb what the tests and their worker processes keep there.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from gateway import embedded

# PostgreSQL refuses connection number max_connections+1: the run cannot hold more than this.
# The largest single test holds 21 (twenty racing threads and its own); tests/conftest.py
# runs such tests one at a time (docs/internals/testing.md).
MAX_CONNECTIONS = 30

_servers: embedded.TestServers | None = None
_var_dir: Path | None = None


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """Runs before pytest-django loads the settings, which read the environment."""
    global _servers, _var_dir
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None and not os.environ.get("GATEWAY_VAR_DIR"):
        _var_dir = Path(tempfile.mkdtemp(prefix="eg-test-var-"))
        key = _var_dir / "vault.key"
        key.write_text(Fernet.generate_key().decode())
        key.chmod(0o600)
        os.environ["GATEWAY_VAR_DIR"] = str(_var_dir)
    if worker is None and not os.environ.get("DATABASE_URL"):
        if os.environ.get("CELERY_BROKER_URL"):
            raise pytest.UsageError(
                "CELERY_BROKER_URL is set but DATABASE_URL is not: set both (servers of your "
                "own) or neither (embedded servers)"
            )
        _servers = embedded.TestServers(MAX_CONNECTIONS)
        try:
            os.environ.update(_servers.start())
        except embedded.EmbeddedError as exc:
            _servers = None
            raise pytest.UsageError(str(exc)) from None
    if worker is not None:
        os.environ.setdefault("GATEWAY_TASK_QUEUE", f"celery-{worker}")
    return (yield)


def servers() -> embedded.TestServers | None:
    """This run's embedded servers, for a test that stops and starts them (the slow tier's
    fault run); None under an xdist worker or when the run uses servers of its own."""
    return _servers


def pytest_report_header(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    where = "embedded (this run's own)" if _servers else "from DATABASE_URL / CELERY_BROKER_URL"
    return f"database and broker: {where}"


def pytest_unconfigure(config):
    global _servers, _var_dir
    if _servers is not None:
        _servers.stop()
        _servers = None
    if _var_dir is not None:
        shutil.rmtree(_var_dir, ignore_errors=True)
        _var_dir = None
