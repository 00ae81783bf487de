"""Issue 13 item 6: schemathesis against /api/schema/, NUL bytes on, failing on any 5xx.

Only ``not_a_server_error`` is checked here: OpenAPI conformance of the answers is a separate
concern. Bounded (a handful of examples per operation, a few minutes at most) so that it runs
in the suite; ``GATEWAY_FUZZ_EXAMPLES`` raises the count for a longer run.
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from gateway.wsgi import application
from tests.conftest import Persona

EXAMPLES = int(os.environ.get("GATEWAY_FUZZ_EXAMPLES", "25"))


@pytest.fixture
def api_schema(db):
    # Called through WSGI in this thread: keep the test's connection (and its transaction)
    # open across requests, as Django's own test client does.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", application)
    schema.config.generation.update(allow_x00=True, codec="utf-8")
    yield schema
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def fuzzer(db) -> Persona:
    return Persona("acme", "fuzz-admin", "admin")


def test_no_input_is_a_server_error(api_schema, fuzzer):
    headers = {"Authorization": f"Bearer {fuzzer.token}"}
    failures: dict[str, str] = {}
    operations = 0
    for result in api_schema.get_all_operations():
        operation = result.ok()
        operations += 1

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def run(case):
            response = case.call(headers=headers)
            case.validate_response(response, checks=[not_a_server_error])

        try:
            run()
        except Exception as exc:  # collected: one report for every operation that failed
            failures[operation.label] = str(exc)[:2000]
    assert operations > 20
    assert not failures, "\n\n".join(f"{label}: {text}" for label, text in failures.items())
