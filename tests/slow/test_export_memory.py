"""A console export of 100,000 rows holds a few chunks in memory, not the list: the peak of
Python's allocations while the whole body goes by (tracemalloc) is a fraction of the body's
size, where the list loaded at once would be many times the body. Slow tier: the export is
read under tracemalloc, which slows Python several times."""

from __future__ import annotations

import tracemalloc

import pytest
from django.db import connection

from tests.console.conftest import REFUND, person, submit

pytestmark = pytest.mark.slow

ROWS = 100_000


@pytest.fixture(autouse=True)
def no_broker(monkeypatch):
    monkeypatch.setattr("gateway.ledger.enqueue_dispatch", lambda effect_id: None)


def test_memory_stays_flat_however_long_the_list(db, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    oscar = person("acme", "oscar", "operator")
    bot = person("acme", "refund-bot", "agent")
    from gateway.capabilities import capability_grant

    capability_grant(granted_by="test", principal=bot.principal, effect_types=["*"])
    effect = submit(bot.principal, REFUND)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO gateway_effectevent
                (tenant_id, effect_id, subject, kind, from_status, to_status, actor, reason,
                 data, created_at)
            SELECT %s, %s, '', 'note', '', '', 'operator:oscar',
                   'a note of about sixty characters, number ' || lpad(n::text, 8, '0'),
                   jsonb_build_object('n', n), now()
              FROM generate_series(1, %s) AS n
            """,
            [effect.tenant_id, effect.pk, ROWS],
        )
    response = oscar.client.get("/export/audit.csv", {"effect": effect.pk})
    tracemalloc.start()
    try:
        size = sum(len(chunk) for chunk in response.streaming_content)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"{ROWS} rows: body {size / 1e6:.1f} MB, peak allocations {peak / 1e6:.1f} MB")
    assert size > 12_000_000
    assert peak < size / 4
