"""PostgreSQL out of reach: the API answers 503 problem+json with Retry-After (not a 500),
the console a readable 503 page, and nothing is written. The database is really unreachable
for the request: the connection points at a closed port, or its backend is terminated."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection, connections
from django.test import Client

from gateway.models import Effect
from tests.conftest import TICKET

pytestmark = pytest.mark.django_db(transaction=True)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # nothing listens once the probe is closed


@contextmanager
def database_unreachable() -> Iterator[None]:
    """This thread's connection (the one the request uses) points at a port where no server
    listens, as when PostgreSQL is down; the settings come back afterwards."""
    saved = dict(connection.settings_dict)
    connection.close()
    connection.settings_dict.update(HOST="127.0.0.1", PORT=str(closed_port()))
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)


def assert_database_unavailable_problem(response) -> None:
    assert response.status_code == 503, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert 1 <= int(response["Retry-After"]) <= 30
    body = response.json()
    assert body["type"] == "https://effect-gateway.dev/problems/database-unavailable"
    assert body["status"] == 503 and body["title"] == "The database is unavailable"


def test_a_submission_while_postgres_is_down_is_503_problem_json(agent):
    with database_unreachable():
        answer = agent.submit(TICKET, "db-down-1")
    assert_database_unavailable_problem(answer)
    assert Effect.objects.count() == 0


def test_an_api_read_while_postgres_is_down_is_503_problem_json(agent):
    with database_unreachable():
        answer = agent.client.get("/api/v1/effects")
    assert_database_unavailable_problem(answer)


def test_a_claude_code_hook_while_postgres_is_down_is_503_problem_json(db):
    """The hook command reads a JSON answer; it fails closed on this one like on any error."""
    hook = Client(raise_request_exception=False)
    with database_unreachable():
        answer = hook.post(
            "/hooks/claude-code/pre-tool-use",
            {"hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": {}},
            content_type="application/json",
            HTTP_AUTHORIZATION="Bearer egw_looked_up_in_the_database",
        )
    assert_database_unavailable_problem(answer)


def test_a_submission_on_a_terminated_backend_is_503_and_the_retry_is_recorded(agent):
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    killer = connections.create_connection("default")
    try:
        with killer.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        killer.close()
    answer = agent.submit(TICKET, "db-down-2")
    assert_database_unavailable_problem(answer)
    connection.close()  # what Django does at the end of a request that broke its connection
    assert Effect.objects.count() == 0
    retried = agent.submit(TICKET, "db-down-2")
    assert retried.status_code == 201, retried.content
    assert Effect.objects.count() == 1


def test_the_console_shows_a_readable_503_page(db):
    from tests.console.conftest import person

    oscar = person("acme", "oscar", "operator")
    browser = Client(raise_request_exception=False)
    browser.force_login(oscar.principal.user)
    with database_unreachable():
        page = browser.get("/")
    assert page.status_code == 503
    assert page["Content-Type"].startswith("text/html")
    assert page["Retry-After"]
    html = page.content.decode()
    assert "The database is unavailable" in html and "Reload in a few" in html
    assert "Traceback" not in html
