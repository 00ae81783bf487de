"""psycopg parses a statement's placeholders once and caches the result only for statements
up to a length; a longer hot-path statement is parsed again at every execution (measured: a
tenth of a submission's CPU). A column added to Command, Effect, Principal or Receipt grows
the submission statement: this says when it no longer fits."""

from __future__ import annotations

import pytest
from psycopg import _queries

from gateway import fastpath


@pytest.mark.parametrize(
    "name", ["_SUBMIT_OR_EXISTING", "_SUBMIT_RESERVING_OR_EXISTING", "_REPLAY", "_CLAIM", "_RECORD"]
)
def test_hot_statements_fit_psycopgs_parse_cache(name):
    statement = getattr(fastpath, name)
    assert len(statement.encode()) <= _queries.MAX_CACHED_STATEMENT_LENGTH, len(statement)


@pytest.mark.django_db
def test_the_submission_statement_is_prepared_on_its_connection(agent):
    """Planned once per connection, not at every execution (GATEWAY_DB_PREPARE): after a few
    submissions on one connection PostgreSQL holds it as a prepared statement."""
    from django.db import connection

    from tests.conftest import TICKET

    for n in range(7):
        assert agent.submit(TICKET, f"prepared-{n % 2}").status_code in (200, 201)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements "
            "WHERE statement LIKE 'WITH cmd AS ( INSERT INTO gateway_command%%'"
        )
        assert cursor.fetchone()[0] >= 1


def prepared_statements() -> list[tuple[str, int, int]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements "
            "ORDER BY prepare_time"
        )
        return cursor.fetchall()


def hot_statement_plans(agent, prefix: str) -> dict[str, tuple[int, int]]:
    """Seven effects submitted and dispatched on this connection; then each hot statement's
    generic and custom plans, by the name of its first CTE."""
    from gateway import services
    from tests.conftest import TICKET

    for index in range(7):
        effect_id = agent.submit(TICKET, f"{prefix}{index}").json()["effect_id"]
        services.effect_dispatch(effect_id=effect_id, worker="test")
    return {
        statement.split()[1]: (generic, custom)
        for statement, generic, custom in prepared_statements()
        if statement.lstrip().startswith("WITH")
    }


def test_the_hot_statements_are_prepared_once_per_connection(agent, sandbox):
    """PostgreSQL plans a prepared statement once, not at every execution: planning was most
    of what the server spent on these CTEs (gateway.lib.prepared)."""
    statements = hot_statement_plans(agent, "p")
    # cmd (submit), old (claim), o (record): each one statement, reused.
    assert set(statements) >= {"cmd", "old", "o"}, statements
    assert all(generic + custom >= 7 for generic, custom in statements.values())


def test_the_hot_statements_are_planned_once_not_six_times(agent, sandbox):
    """With plan_cache_mode force_generic_plan (GATEWAY_DB_GENERIC_PLANS) a prepared statement
    is planned at its first execution and never again on its connection; PostgreSQL's default
    plans the first five executions for their parameters (custom plans) before settling on
    the generic plan, and those plans cost more than running the statements."""
    statements = hot_statement_plans(agent, "g")
    assert set(statements) >= {"cmd", "old", "o"}, statements
    assert all(custom == 0 for _generic, custom in statements.values()), statements


# gateway.lib.prepared keeps a cursor per statement for the thread's connection.
_ECHO = "SELECT %(n)s::int, 1 / %(n)s::int"


@pytest.mark.django_db(transaction=True)
def test_a_new_connection_gets_new_cursors_and_a_failed_statement_runs_again():
    from django.db import connection, utils

    from gateway.lib import prepared

    assert prepared.fetchone(_ECHO, {"n": 1}) == (1, 1)
    closed = connection.connection
    connection.close()  # CONN_MAX_AGE, a failed health check, an error: Django closes it
    assert closed.closed
    assert prepared.fetchall(_ECHO, {"n": 2}) == [(2, 0)]
    assert connection.connection is not closed
    with pytest.raises(utils.DataError):
        prepared.fetchone(_ECHO, {"n": 0})
    assert prepared.fetchone(_ECHO, {"n": 4}) == (4, 0)


@pytest.mark.django_db
def test_the_prepared_cursors_keep_their_str_dumper_to_themselves():
    """Django's cursors on the same connection bind on the client exactly as before."""
    from django.db import connection

    from gateway.lib import prepared

    assert prepared.fetchone("SELECT %(s)s || 'x', %(s)s = ANY(%(l)s)", {"s": "a", "l": ["a"]})
    with connection.cursor() as cursor:
        assert cursor.mogrify("SELECT %s, %s", ["a", ["a", "b"]]) == "SELECT 'a', '{a,b}'"


@pytest.mark.django_db(transaction=True)
def test_each_thread_runs_a_statement_on_a_cursor_of_its_own():
    """A cursor holds its last result until it runs again: two threads on one cursor would
    read each other's rows. Here both use one connection (Django's thread sharing, as its
    live server thread does)."""
    import threading

    from django.db import DEFAULT_DB_ALIAS, connection, connections

    from gateway.lib import prepared

    assert prepared.fetchone(_ECHO, {"n": 1}) == (1, 1)
    mine = prepared._cursor(connection, _ECHO)
    assert prepared._cursor(connection, _ECHO) is mine  # reused: its Transformer with it
    shared, theirs = connections[DEFAULT_DB_ALIAS], []

    def other_thread():
        connections[DEFAULT_DB_ALIAS] = shared
        assert prepared.fetchone(_ECHO, {"n": 2}) == (2, 0)
        theirs.append(prepared._cursor(shared, _ECHO))

    shared.inc_thread_sharing()
    try:
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    finally:
        shared.dec_thread_sharing()
    assert theirs and theirs[0] is not mine
    assert prepared.fetchone(_ECHO, {"n": 3}) == (3, 0)


def test_an_outcome_row_has_exactly_the_columns_both_records_read():
    """``fastpath.outcome_row`` gives what the single record binds as parameters and the batch
    record reads from its JSON rows (``OUTCOME_COLUMNS``): a value it lacks would be NULL in
    the batch, a name it adds would be read by neither."""
    from datetime import UTC, datetime

    from gateway.choices import Outcome
    from gateway.providers.base import CallResult, ProviderOperation

    claim = fastpath.FastClaim(
        "eff_x", 1, 1, 7, 1, 0, "ticket.create", "acme:k", {}, "sealed", "sha256:x", "PREPARED"
    )
    operation = ProviderOperation(id="op_1", status="succeeded", payload_digest="sha256:x")
    result = CallResult(Outcome.CONFIRMED, "ok", operation=operation, http_status=201)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    row = fastpath.outcome_row(claim, result, {"confirmed_at": now}, provider="tickets", now=now)
    assert list(row) == [name for name, _ in fastpath.OUTCOME_COLUMNS]
    assert row["to_status"] == "CONFIRMED" and row["seal"] and row["confirmed"] == now
