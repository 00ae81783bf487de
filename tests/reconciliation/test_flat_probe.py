"""The reconciler's probe of escalated providers reads the recent lookups, not every lookup
the ledger ever made (tests/support/ledger.py says how that is counted)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from gateway.models import Effect
from reconciliation.bulk import effects_probe_escalated
from reconciliation.models import Case, ReconciliationRecord
from tests.support.ledger import load_history, most_read

pytestmark = pytest.mark.django_db


def test_the_probe_reads_recent_lookups_only(agent, ticket_body):
    load_history(tenant_id=agent.principal.tenant_id, principal_id=agent.principal.pk,
                 effects=3000)  # fmt: skip
    effect_id = agent.submit(ticket_body, "escalated").json()["effect_id"]
    now = timezone.now()
    Effect.objects.filter(pk=effect_id).update(status="UNKNOWN", escalated=True, check_count=8)
    Case.objects.create(
        tenant_id=agent.principal.tenant_id, effect_id=effect_id, owner="support-tools",
        reason="lookup_budget_exhausted", reason_text="8 lookups", opened_by="reconciler",
        opened_at=now,
    )  # fmt: skip
    # Its provider was asked a minute ago: no lookup now, only the reads.
    ReconciliationRecord.objects.create(
        tenant_id=agent.principal.tenant_id, effect_id=effect_id, kind="lookup",
        lookup_status="unreachable", effect_status="UNKNOWN", outcome="inconclusive",
        actor="reconciler", evidence="unreachable", created_at=now - timedelta(minutes=1),
    )  # fmt: skip
    with CaptureQueriesContext(connection) as queries:
        assert effects_probe_escalated(now=now) == 0
    rows, statement = most_read(queries)
    assert rows <= 100, statement
