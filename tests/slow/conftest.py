"""The slow tests' shared fixture: the run's own embedded servers, which a fault test stops and
starts."""

from __future__ import annotations

import pytest

from gateway.embedded import pytest_plugin


@pytest.fixture
def servers():
    found = pytest_plugin.servers()
    if found is None:
        pytest.skip(
            "this test stops and starts PostgreSQL and the broker: it needs the run's own "
            "embedded servers (DATABASE_URL unset) in one process (-n 0); `make test-slow`"
        )
    return found
