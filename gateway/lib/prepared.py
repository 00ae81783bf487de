"""A cursor whose statements PostgreSQL parses and plans once per connection, not each time.

Django binds parameters on the client (psycopg's ``ClientCursor``): every execution reaches
the server as new text, which PostgreSQL parses, analyses and plans again. For the hot path's
statements — CTEs over three to five tables — that is most of what the server spends on them:
with ``pg_stat_statements``, planning the claim took 1.2 ms and running it 0.2 ms, the
submission 0.65 and 0.15 ms, the record 0.3 and 0.2 ms (docs/reliability.md, "What PostgreSQL
spends"). On this cursor parameters are bound on the server and psycopg prepares a statement
at its first execution on a connection (``prepare_threshold`` 0 in the database OPTIONS, which
touches nothing else: Django's own cursors bind on the client and never prepare); PostgreSQL
then reuses the statement, and after five executions settles on one plan (these statements
look rows up by key, so its generic plan is the one it would pick each time).

Use it for statements that run often with the same text. The cursor is Django's wrapper
around psycopg's, so ``CaptureQueriesContext``, ``execute_wrapper`` and the debug log see its
statements like any other.

A Python ``str`` parameter is sent as ``text``, where psycopg would send "unknown" and let the
server infer a type from each place the parameter appears: a parameter that appears in two
places (a varchar column and a text expression) then cannot be prepared ("inconsistent types
deduced").
"""

from __future__ import annotations

from typing import Any, cast

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.utils import CursorWrapper
from psycopg.types.string import StrDumper


def cursor() -> CursorWrapper:
    """A cursor of the default connection with server-side binding, prepared statements."""
    # The thread's connection, looked up once: each attribute read through Django's
    # ``connection`` proxy looks it up again (a thread-local read), seven times here.
    connection = connections[DEFAULT_DB_ALIAS]
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    with connection.wrap_database_errors:
        raw = psycopg.Cursor(connection.connection)
    raw.adapters.register_dumper(str, StrDumper)
    connection.validate_thread_sharing()
    # What Django's connection.cursor() does with the cursor it creates (the stubs type the
    # argument as Django's own wrapper; it is the driver's cursor).
    if connection.queries_logged:
        return connection.make_debug_cursor(cast(Any, raw))
    return connection.make_cursor(cast(Any, raw))
