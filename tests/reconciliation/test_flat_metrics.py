"""/metrics on a large ledger: the scrape reads the open queue and the tallies, never the
history, and the settled counts the tally pass keeps stay exact as effects settle between
passes (reconciliation.tally; tests/support/ledger.py says how rows read are counted)."""

from __future__ import annotations

from collections import Counter

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from gateway import audit
from gateway import services as ledger
from gateway.models import AuditChainHead, Effect
from reconciliation.metrics import LIVE_STATUSES
from reconciliation.models import EffectTally, TallyHead
from reconciliation.tally import tally_pending, tally_tenant
from tests.reconciliation.conftest import fresh
from tests.reconciliation.test_metrics import scrape
from tests.support.ledger import load_history, rows_read

pytestmark = pytest.mark.django_db


def effect_gauge() -> dict[tuple[str, str], float]:
    return {
        (dict(labels)["status"], dict(labels)["type"]): value
        for (name, labels), value in scrape().items()
        if name == "gateway_effects"
    }


def ledger_counts() -> dict[tuple[str, str], int]:
    """What the gauge used to compute at every scrape: the whole table, grouped."""
    counted = Counter(Effect.objects.values_list("status", "type"))
    return dict(counted)


def most_read(queries) -> tuple[int, str]:
    """The most rows one captured read read from one ledger table. Each read is replayed as
    a subquery, so that the UNION and the CTE are replayed too (tests/support/ledger.py's
    ``most_read`` replays plain SELECTs only); writes and locking reads are not replayed."""
    worst, which = 0, ""
    for query in queries.captured_queries:
        sql = query["sql"]
        head = sql.lstrip("( ").upper()
        if not head.startswith(("SELECT", "WITH")) or "UPDATE" in head or "INSERT" in head:
            continue
        for _table, rows in rows_read(f"SELECT * FROM ({sql}) AS replayed").items():
            if rows > worst:
                worst, which = rows, sql
    return worst, which


def test_the_scrape_reads_the_open_queue_not_the_ledger(
    recon_requester, recon_submit, recon_dispatch, recon_unknown
):
    tenant = recon_requester.principal.tenant_id
    load_history(tenant_id=tenant, principal_id=recon_requester.principal.pk, effects=3000)
    recon_unknown()
    recon_submit()  # PREPARED
    recon_dispatch(recon_submit())  # CONFIRMED, with its events
    audit.seal_pending()
    tally_pending()
    for table in ("gateway_effect", "reconciliation_effecttally"):
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {table}")

    with CaptureQueriesContext(connection) as queries:
        gauge = effect_gauge()

    assert gauge[("UNKNOWN", "ticket.create")] == 1
    assert gauge[("PREPARED", "ticket.create")] == 1
    assert gauge[("CONFIRMED", "ticket.create")] == 1  # the history has no events: not tallied
    assert len(queries.captured_queries) >= 6
    rows, statement = most_read(queries)
    assert rows <= 100, statement


def test_the_tally_pass_reads_what_was_sealed_since_its_last_pass(
    recon_requester, recon_submit, recon_dispatch
):
    tenant = recon_requester.principal.tenant_id
    load_history(tenant_id=tenant, principal_id=recon_requester.principal.pk, effects=3000)
    recon_dispatch(recon_submit())
    audit.seal_pending()
    tally_pending()
    recon_dispatch(recon_submit())
    audit.seal_pending()

    with CaptureQueriesContext(connection) as queries:
        assert tally_tenant(tenant) == 3  # submitted, claimed, dispatched

    rows, statement = most_read(queries)
    assert rows <= 100, statement


def test_the_settled_counts_stay_exact_as_effects_settle_between_passes(
    recon_requester, recon_submit, recon_dispatch, recon_unknown
):
    operator = recon_requester.principal
    first = [recon_dispatch(recon_submit()) for _ in range(3)]
    audit.seal_pending()
    tally_pending()
    assert effect_gauge() == ledger_counts()
    assert ledger_counts()[("CONFIRMED", "ticket.create")] == 3

    # Between passes: more confirmations, a cancellation, an UNKNOWN, and a CONFIRMED effect
    # that leaves CONFIRMED (a compensation: COMPENSATING, then COMPENSATED).
    recon_dispatch(recon_submit())
    ledger.effect_cancel(effect=recon_submit(), principal=operator, reason="not needed")
    recon_unknown()
    compensation = ledger.effect_compensate(
        effect=fresh(first[0]), principal=operator, reason="opened by mistake"
    ).effect
    audit.seal_pending()

    stale = effect_gauge()
    # Live statuses are current; the settled ones are as of the last pass.
    assert stale[("CONFIRMED", "ticket.create")] == 3
    assert stale[("UNKNOWN", "ticket.create")] == 1
    assert scrape()[("gateway_effects_tally_behind", ())] > 0

    tally_pending()
    assert effect_gauge() == ledger_counts()
    assert ledger_counts()[("COMPENSATING", "ticket.create")] == 1
    assert scrape()[("gateway_effects_tally_behind", ())] == 0

    recon_dispatch(compensation)
    assert fresh(first[0]).status == "COMPENSATED"
    audit.seal_pending()
    tally_pending()
    counts = ledger_counts()
    assert effect_gauge() == counts
    assert counts[("COMPENSATED", "ticket.create")] == 1
    assert counts[("CONFIRMED", "ticket.create")] == 3
    assert counts[("CONFIRMED", "ticket.close")] == 1
    assert counts[("CANCELLED", "ticket.create")] == 1
    # The tallies of the live statuses are kept too (they net out), but not read.
    tallied = {(row.status, row.type): row.count for row in EffectTally.objects.filter(count__gt=0)}
    assert tallied == counts


def test_a_tally_backfills_an_existing_ledger_in_bounded_steps(
    recon_requester, recon_submit, recon_dispatch
):
    for _ in range(4):
        recon_dispatch(recon_submit())
    audit.seal_pending(batch=3)  # several batches, as a ledger sealed over time
    tenant = recon_requester.principal.tenant_id

    steps = 0
    while tally_tenant(tenant, step=2):  # each batch is longer than a step: one per step
        steps += 1

    assert steps >= 4
    sealed = AuditChainHead.objects.get(tenant_id=tenant).length
    assert TallyHead.objects.get(tenant_id=tenant).position == sealed
    assert effect_gauge() == ledger_counts()


def test_live_statuses_are_the_ones_that_move_by_themselves():
    from gateway.choices import ALLOWED_TRANSITIONS, SETTLED

    # Read from the tallies: CONFIRMED (which a compensation can leave: the tally counts that
    # move), COMPENSATING and the terminal statuses; everything else is counted at scrape time.
    assert set(ALLOWED_TRANSITIONS) - LIVE_STATUSES == SETTLED | {"COMPENSATING"}
