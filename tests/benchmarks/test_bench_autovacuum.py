"""The bench's stand-in for autovacuum (tests.benchmarks.bench.autovacuum): it must analyze and
vacuum a table when PostgreSQL's autovacuum would, and nothing else, or the bench would measure a
ledger that no deployment has (plans of an empty ledger, or one analyzed more than autovacuum
ever does)."""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest

from tests.benchmarks.bench import autovacuum
from tests.benchmarks.test_bench_harness import _dsn

pytestmark = pytest.mark.usefixtures("transactional_db")


@pytest.fixture
def table():
    name = f"av_probe_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(_dsn(), autocommit=True) as conn:
        # Out of the server's own autovacuum (the embedded server runs it): only the stand-in
        # may analyze or vacuum this table while a test watches.
        conn.execute(
            f"CREATE TABLE {name} (id int PRIMARY KEY, note text) WITH (autovacuum_enabled = false)"
        )
    yield name
    with psycopg.connect(_dsn(), autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {name}")


def _write(sql: str) -> None:
    """``sql`` on a connection of its own, closed after: a backend reports its table
    counters when it exits, so the stand-in's next look sees them."""
    with psycopg.connect(_dsn(), autocommit=True) as conn:
        conn.execute(sql)


def _due(conn, table: str, seconds: float = 10) -> tuple[bool, bool]:
    """(analyze?, vacuum?) for ``table`` once the statistics collector shows it due."""
    deadline = time.monotonic() + seconds
    while True:
        due = {name: (analyze, vacuum) for name, analyze, vacuum in autovacuum.due_work(conn)}
        if table in due or time.monotonic() > deadline:
            return due.get(table, (False, False))
        time.sleep(0.1)


def _analyzed_rows(conn, table: str) -> float:
    return conn.execute("SELECT reltuples FROM pg_class WHERE relname = %s", (table,)).fetchone()[0]


def test_a_table_a_tenth_changed_is_analyzed_once_and_then_left(table):
    _write(f"INSERT INTO {table} SELECT g, 'x' FROM generate_series(1, 500) g")
    with psycopg.connect(_dsn(), autocommit=True) as conn:
        # 500 changes > 50 + 10 % of "never analyzed" (0 rows); 500 inserts < 1,000: no vacuum.
        assert _due(conn, table) == (True, False)
        assert f"ANALYZE {table}" in autovacuum.work_once(conn)
        assert _analyzed_rows(conn, table) == 500
        assert table not in {name for name, *_ in autovacuum.due_work(conn)}

        # 40 more changes: under 50 + 10 % of 500, so autovacuum would leave it, and so does this.
        _write(f"UPDATE {table} SET note = 'y' WHERE id <= 40")
        time.sleep(0.5)
        assert table not in {name for name, *_ in autovacuum.due_work(conn)}
        assert not any(table in run for run in autovacuum.work_once(conn))


def test_a_table_whose_dead_rows_pass_a_fifth_is_vacuumed(table):
    _write(f"INSERT INTO {table} SELECT g, 'x' FROM generate_series(1, 500) g")
    with psycopg.connect(_dsn(), autocommit=True) as conn:
        _due(conn, table)
        autovacuum.work_once(conn)
        _write(f"DELETE FROM {table} WHERE id <= 300")  # 300 dead > 50 + 20 % of 500
        analyze, vacuum = _due(conn, table)
        assert vacuum and analyze
        assert f"VACUUM (ANALYZE) {table}" in autovacuum.work_once(conn)
        dead = conn.execute(
            "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = %s", (table,)
        ).fetchone()[0]
        assert dead == 0
        assert _analyzed_rows(conn, table) == 200


def test_the_thread_works_only_while_resumed(table):
    stand_in = autovacuum.AutovacuumStandIn(_dsn(), naptime=0.05).start()
    try:
        _write(f"INSERT INTO {table} SELECT g, 'x' FROM generate_series(1, 500) g")
        time.sleep(1.5)  # due by now, but paused: nothing done
        assert not any(table in run for run in stand_in.runs)
        stand_in.resume()
        deadline = time.monotonic() + 10
        while not any(table in run for run in stand_in.runs) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert f"ANALYZE {table}" in stand_in.runs
        stand_in.pause()
        done, spans = len(stand_in.runs), list(stand_in.spans)
        # When each pass that did work ran, for the benchmark to set beside its slowest requests.
        assert spans and all(start <= end <= time.time() for start, end in spans)
        _write(f"UPDATE {table} SET note = 'z'")  # due again, paused again
        time.sleep(1.5)
        assert len(stand_in.runs) == done
        assert stand_in.spans == spans
    finally:
        stand_in.stop()
