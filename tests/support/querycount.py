"""Count what a piece of code costs the database: statements, transactions and round trips.

``CaptureQueriesContext`` sees statements only. A transaction costs two more round trips
than its statements (psycopg sends ``BEGIN`` before the first statement, Django sends
``COMMIT`` at the end of the outermost ``atomic``); a statement outside any ``atomic`` is its
own (implicit) transaction and costs one. Django's connection health check (``SELECT 1`` at
the first use of a connection after each request, CONN_HEALTH_CHECKS) is counted too when it
runs; Django's test client does not run it (it keeps connections across requests), gunicorn
does: one more round trip per HTTP request. Used by the bench (tests/benchmarks/bench) and by
the test that pins the round trips of one effect.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.db import connection


@dataclass
class RoundTrips:
    statements: list[str] = field(default_factory=list)
    transactions: int = 0  # explicit (atomic) transactions that committed
    autocommits: int = 0  # statements that were their own transaction
    rollbacks: int = 0
    health_checks: int = 0  # Django's CONN_HEALTH_CHECKS "SELECT 1", outside its cursors

    @property
    def commits(self) -> int:
        return self.transactions + self.autocommits

    @property
    def round_trips(self) -> int:
        return len(self.statements) + 2 * self.transactions + self.rollbacks + self.health_checks

    def summary(self) -> str:
        return (
            f"{len(self.statements)} statements, {self.commits} commits, "
            f"{self.round_trips} round trips"
        )


@contextmanager
def count_round_trips(using=connection) -> Iterator[RoundTrips]:
    counted = RoundTrips()

    def wrapper(execute, sql, params, many, context):
        counted.statements.append(sql)
        if using.get_autocommit():
            counted.autocommits += 1
        return execute(sql, params, many, context)

    commit, rollback, is_usable = using.commit, using.rollback, using.is_usable

    def counting_commit():
        counted.transactions += 1
        return commit()

    def counting_rollback():
        counted.rollbacks += 1
        return rollback()

    def counting_is_usable():
        counted.health_checks += 1
        return is_usable()

    using.commit, using.rollback = counting_commit, counting_rollback
    using.is_usable = counting_is_usable
    try:
        with using.execute_wrapper(wrapper):
            yield counted
    finally:
        del using.commit, using.rollback, using.is_usable  # back to the class's methods
