"""psycopg parses a statement's placeholders once and caches the result only for statements
up to a length; a longer hot-path statement is parsed again at every execution (measured: a
tenth of a submission's CPU). A column added to Command, Effect, Principal or Receipt grows
the submission statement: this says when it no longer fits."""

from __future__ import annotations

import pytest
from psycopg import _queries

from gateway import fastpath


@pytest.mark.parametrize("name", ["_SUBMIT_OR_EXISTING", "_CLAIM", "_RECORD"])
def test_hot_statements_fit_psycopgs_parse_cache(name):
    statement = getattr(fastpath, name)
    assert len(statement.encode()) <= _queries.MAX_CACHED_STATEMENT_LENGTH, len(statement)
