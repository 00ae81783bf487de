"""The on-call pages read what they show, not the ledger: with thousands of settled effects
behind them, no statement of the approvals inbox, the search box or the triage queue reads
more than a page's worth of rows from a ledger table (tests/support/ledger.py says how that is
counted; tests/benchmarks/ledger_scale.py times the same pages at 1 M and 5 M effects)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.console.conftest import BIG_REFUND, set_state, submit
from tests.support.ledger import load_history, most_read

HISTORY = 3000
PAGE_WORTH = 100

PROMOTE = {
    "type": "deployment.release.promote",
    "resource": {"type": "service", "id": "catalog", "version": 41},
    "payload": {
        "environment": "production",
        "sha": "a1b2c3d4e5f6",
        "release": "2026.11.29-1",
        "previous_sha": "0f9e8d7c6b5a",
    },
}


@pytest.fixture
def history(bot):
    load_history(tenant_id=bot.principal.tenant_id, principal_id=bot.principal.pk, effects=HISTORY)


def read_by(person, path: str, **params) -> tuple[int, str]:
    with CaptureQueriesContext(connection) as queries:
        response = person.client.get(path, params)
    assert response.status_code in (200, 302), response.status_code
    return most_read(queries)


def test_the_approvals_inbox_reads_its_cards_only(alice, bot, history):
    """Look-alikes by digest (the hash index command_digest) and what is live for a
    promotion (the command index on resource type and id) used to read every command."""
    submit(bot.principal, BIG_REFUND)
    waiting = submit(bot.principal, PROMOTE)
    assert waiting.status == "AWAITING_APPROVAL"
    rows, statement = read_by(alice, "/approvals")
    assert rows <= PAGE_WORTH, statement


# One of each kind of identifier the search box takes, all naming history effect 1500 (its
# customer: 1501, the loader names every third one's).
IDENTIFIERS = {
    "effect id": "eff_" + "1500".rjust(26, "0"),
    "key": "history-1500",
    "provider key": "acme:history-1500",
    "operation": "op_h" + "1500".rjust(26, "0"),
    "receipt's operation": "rop_h" + "1500".rjust(26, "0"),
    "resource": "ord_h1500",
    "customer": "cus_h1501",
}


def test_search_reads_the_rows_it_finds(oscar, history):
    """One indexed lookup per kind of identifier; as one OR across effect, command and
    receipts it walked the whole ledger."""
    for kind, q in IDENTIFIERS.items():
        with CaptureQueriesContext(connection) as queries:
            response = oscar.client.get("/search", {"q": q})
        assert response.status_code == 302, f"{kind}: one hit opens its effect"
        rows, statement = most_read(queries)
        assert rows <= PAGE_WORTH, f"{kind}: {statement}"


def test_the_triage_queue_reads_the_queue(oscar, bot, history):
    for _ in range(3):
        set_state(submit(bot.principal, BIG_REFUND), status="UNKNOWN")
    for path, params in (("/", {}), ("/", {"sort": "risk"}), ("/", {"sort": "newest"})):
        rows, statement = read_by(oscar, path, **params)
        assert rows <= PAGE_WORTH, statement
