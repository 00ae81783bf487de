"""A stand-in for PostgreSQL's autovacuum, for the bench on a server that runs without it
(a shared development server may not: ``SHOW autovacuum`` says ``off``).

Why the benchmark needs one: the drainer prepares its claim statement once per connection, and
PostgreSQL plans it from the tables' statistics. A benchmark starts on an almost empty ledger,
so the plan it settles on scans ``gateway_command`` whole and hash-joins it to the due
effects; only an ``ANALYZE`` (which invalidates the cached plan) makes it read the indexes.
Without one every claim reads every command written so far: a pass of 8,000 effects at c = 8
ran at 174 effects/s with PostgreSQL spending 4.8 ms per effect and claims of 10–20 ms
(``auto_explain``), against 360 effects/s and 1.4 ms with an ``ANALYZE`` every two seconds.
A deployment runs autovacuum, which analyzes a table once a tenth of it has changed; this does
the same, with PostgreSQL's default thresholds.

It looks every ``naptime`` seconds (autovacuum's default is a minute per database; the
benchmark's tables grow from nothing to thousands of rows within that, where a production
ledger's tenth takes hours) and, per table of the database:

- ``ANALYZE`` once ``n_mod_since_analyze`` exceeds 50 + 10 % of its rows
  (``autovacuum_analyze_threshold``, ``autovacuum_analyze_scale_factor``);
- ``VACUUM`` once ``n_dead_tup`` exceeds 50 + 20 % of its rows, or the rows inserted since the
  last vacuum exceed 1,000 + 20 % (the ``autovacuum_vacuum_*`` and ``*_insert_*`` defaults).

It works on one connection of its own, so the benchmark counts what it spends as PostgreSQL's
CPU (autovacuum's work is the deployment's cost too), throttled as autovacuum's workers are
(``autovacuum_vacuum_cost_delay`` 2 ms per ``vacuum_cost_limit`` of 200): an unthrottled
``VACUUM`` of the effects table took the disk and the cores for a tenth of a second, and the
submissions committing meanwhile waited (a paced pass's submit p99 50 ms against 24 without it).
"""

from __future__ import annotations

import logging
import threading
import time

import psycopg
from psycopg import sql

logger = logging.getLogger(__name__)

# PostgreSQL's defaults (postgresql.conf, "AUTOVACUUM"); a manual VACUUM's cost delay is 0.
COST_DELAY, COST_LIMIT = "2ms", 200
ANALYZE_THRESHOLD, ANALYZE_SCALE = 50, 0.1
VACUUM_THRESHOLD, VACUUM_SCALE = 50, 0.2
INSERT_THRESHOLD, INSERT_SCALE = 1000, 0.2

_DUE = """
SELECT s.relname,
       s.n_mod_since_analyze > %(at)s + %(as)s * greatest(c.reltuples, 0) AS analyze,
       s.n_dead_tup > %(vt)s + %(vs)s * greatest(c.reltuples, 0)
         OR s.n_ins_since_vacuum > %(it)s + %(is)s * greatest(c.reltuples, 0) AS vacuum
  FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
 WHERE s.schemaname = 'public'
"""
_THRESHOLDS = {
    "at": ANALYZE_THRESHOLD,
    "as": ANALYZE_SCALE,
    "vt": VACUUM_THRESHOLD,
    "vs": VACUUM_SCALE,
    "it": INSERT_THRESHOLD,
    "is": INSERT_SCALE,
}


def throttle(conn: psycopg.Connection) -> None:
    """Vacuum and analyze on ``conn`` at autovacuum's pace, not a manual command's."""
    conn.execute(f"SET vacuum_cost_delay = '{COST_DELAY}'")
    conn.execute(f"SET vacuum_cost_limit = {COST_LIMIT}")


def due_work(conn: psycopg.Connection) -> list[tuple[str, bool, bool]]:
    """(table, analyze?, vacuum?) for each table that autovacuum would work on now."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    rows = conn.execute(_DUE, _THRESHOLDS).fetchall()
    return [(name, bool(analyze), bool(vacuum)) for name, analyze, vacuum in rows
            if analyze or vacuum]  # fmt: skip


def work_once(conn: psycopg.Connection) -> list[str]:
    """Vacuum and analyze what is due, once; what was done, as ``VACUUM t`` / ``ANALYZE t``."""
    done = []
    for table, analyze, vacuum in due_work(conn):
        if vacuum:
            # VACUUM (ANALYZE) when both are due: one pass over the table, as autovacuum does.
            options = sql.SQL("(ANALYZE)") if analyze else sql.SQL("")
            conn.execute(sql.SQL("VACUUM {} {}").format(options, sql.Identifier(table)))
            done.append(f"VACUUM{' (ANALYZE)' if analyze else ''} {table}")
        else:
            conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table)))
            done.append(f"ANALYZE {table}")
    return done


class AutovacuumStandIn:
    """A thread that runs :func:`work_once` every ``naptime`` seconds while it is active
    (``resume`` / ``pause``), until ``stop``. Its connection is open from ``start``, so a
    benchmark that lists the database's backends at a pass's start counts it."""

    def __init__(self, dsn: str, naptime: float = 1.0) -> None:
        self.dsn = dsn
        self.naptime = naptime
        self.runs: list[str] = []
        # (start, end) on the wall clock of each pass that did work: what a submission that
        # took long may have waited behind (the bench sets them beside its tail).
        self.spans: list[tuple[float, float]] = []
        self._active = threading.Event()
        self._stopped = threading.Event()
        self._busy = threading.Lock()  # held while a pass works
        self._thread: threading.Thread | None = None
        self.conn: psycopg.Connection | None = None

    @property
    def backend_pid(self) -> int | None:
        return self.conn.info.backend_pid if self.conn is not None else None

    def start(self) -> AutovacuumStandIn:
        self.conn = psycopg.connect(self.dsn, autocommit=True)
        throttle(self.conn)
        self._thread = threading.Thread(target=self._loop, name="autovacuum-stand-in", daemon=True)
        self._thread.start()
        return self

    def resume(self) -> None:
        self._active.set()

    def pause(self) -> None:
        """No further pass; returns once the one under way (if any) has finished."""
        self._active.clear()
        with self._busy:
            pass

    def stop(self) -> None:
        self._stopped.set()
        self._active.set()  # wake the loop so that it sees the stop
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.conn is not None:
            self.conn.close()

    def _loop(self) -> None:
        assert self.conn is not None
        while not self._stopped.is_set():
            self._active.wait()
            with self._busy:
                if self._stopped.is_set():
                    return
                if not self._active.is_set():
                    continue  # paused while it waited for the lock
                try:
                    started = time.time()
                    done = work_once(self.conn)
                    if done:
                        self.spans.append((started, time.time()))
                    self.runs.extend(done)
                except psycopg.Error:
                    # A table dropped under it, a lock it could not take: autovacuum skips too.
                    logger.warning("autovacuum stand-in: a pass failed", exc_info=True)
            self._stopped.wait(self.naptime)
