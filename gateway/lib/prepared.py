"""Statements PostgreSQL parses and plans once per connection, not each time.

Django binds parameters on the client (psycopg's ``ClientCursor``): every execution reaches
the server as new text, which PostgreSQL parses, analyses and plans again. For the hot path's
statements — CTEs over three to five tables — that is most of what the server spends on them:
with ``pg_stat_statements``, planning the claim took 1.2 ms and running it 0.2 ms, the
submission 0.65 and 0.15 ms, the record 0.3 and 0.2 ms (docs/performance.md, "What PostgreSQL
spends"). On this cursor parameters are bound on the server and psycopg prepares a statement
at its first execution on a connection (``prepare_threshold`` 0 in the database OPTIONS, which
touches nothing else: Django's own cursors bind on the client and never prepare); PostgreSQL
then reuses the statement, and after five executions settles on one plan (these statements
look rows up by key, so its generic plan is the one it would pick each time).

Use it for statements that run often with the same text (``fetchone``, ``fetchall``). They run
on Django's wrapper around psycopg's cursor, so ``CaptureQueriesContext``, ``execute_wrapper``
and the debug log see them like any other.

A Python ``str`` parameter is sent as ``text``, where psycopg would send "unknown" and let the
server infer a type from each place the parameter appears: a parameter that appears in two
places (a varchar column and a text expression) then cannot be prepared ("inconsistent types
deduced"). That dumper is registered on this module's cursors only, never on the connection:
Django's own cursors (client-side binding) would then write a list of strings as
``'{…}'::text[]`` where they write ``'{…}'``.

Each thread keeps one psycopg cursor per statement for its current connection, and runs the
statement on it again: a new cursor copied the connection's adapters to register that dumper,
and each new cursor builds a new Transformer that looks every parameter's dumper and every
column's loader up again (``AdaptersMap.get_dumper`` and ``get_loader``: 6 % of the web
process's CPU). psycopg keeps a cursor's Transformer, with what it looked up, while the cursor
runs the same statement. The rows are fetched before ``fetchone`` / ``fetchall`` return, so no
caller holds a cursor another call may run on; a thread never uses another thread's cursors
(a connection shared between threads: each has its own); a new connection (Django closed the
old one: ``CONN_MAX_AGE``, a failed health check, an error) gets new cursors, and the old
connection's are let go.
"""

from __future__ import annotations

import threading
from typing import Any, cast

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.utils import CursorWrapper
from psycopg.types.string import StrDumper

# More statements than this on one connection: a caller builds statement text per call, which
# this module is not for; the cursors are dropped rather than kept without bound.
_MAX_STATEMENTS = 32


class _Cursors(threading.local):
    """This thread's cursors: the connection they belong to, and one per statement."""

    connection: psycopg.Connection[Any] | None = None
    by_statement: dict[str, psycopg.Cursor[Any]]

    def __init__(self) -> None:
        self.by_statement = {}


_cursors = _Cursors()


def fetchone(sql: str, params: dict[str, Any]) -> tuple[Any, ...] | None:
    """Run ``sql`` prepared on the default connection; its first row."""
    return _execute(sql, params).fetchone()


def fetchall(sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Run ``sql`` prepared on the default connection; its rows."""
    return _execute(sql, params).fetchall()


def _execute(sql: str, params: dict[str, Any]) -> CursorWrapper:
    """``sql`` executed on this thread's cursor for it, with server-side binding."""
    # The thread's connection, looked up once: each attribute read through Django's
    # ``connection`` proxy looks it up again (a thread-local read).
    connection = connections[DEFAULT_DB_ALIAS]
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    connection.validate_thread_sharing()
    raw = _cursor(connection, sql)
    # What Django's connection.cursor() does with the cursor it creates (the stubs type the
    # argument as Django's own wrapper; it is the driver's cursor). Made per call: it reads
    # ``queries_logged`` (CaptureQueriesContext) and the execute wrappers as they are now.
    wrapper: CursorWrapper
    if connection.queries_logged:
        wrapper = connection.make_debug_cursor(cast(Any, raw))
    else:
        wrapper = connection.make_cursor(cast(Any, raw))
    wrapper.execute(sql, params)
    return wrapper


def _cursor(connection: Any, sql: str) -> psycopg.Cursor[Any]:
    """This thread's cursor for ``sql`` on the connection's current psycopg connection."""
    raw_connection = connection.connection
    if _cursors.connection is not raw_connection or len(_cursors.by_statement) >= _MAX_STATEMENTS:
        # Another connection than the cursors were made on (Django closed that one): theirs
        # are never used again.
        _cursors.connection, _cursors.by_statement = raw_connection, {}
    cursor = _cursors.by_statement.get(sql)
    if cursor is None:
        with connection.wrap_database_errors:
            cursor = psycopg.Cursor(raw_connection)
        cursor.adapters.register_dumper(str, StrDumper)
        _cursors.by_statement[sql] = cursor
    return cursor
