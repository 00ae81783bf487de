"""/metrics: ledger gauges read from the database at scrape time, and lookup counters."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import RequestFactory
from django.utils import timezone
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from gateway import audit, health
from gateway.models import Effect
from reconciliation import services
from reconciliation.tally import tally_pending

pytestmark = pytest.mark.django_db


def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = health.metrics(RequestFactory().get("/metrics"))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def tally() -> None:
    """What the beat does between scrapes: seal the committed events, count them."""
    audit.seal_pending()
    tally_pending()


def test_gauges_follow_the_ledger(recon_unknown, recon_sandbox):
    effect = recon_unknown()
    Effect.objects.filter(pk=effect.pk).update(
        status_changed_at=timezone.now() - timedelta(minutes=10),
        next_check_at=timezone.now() - timedelta(minutes=2),
    )

    samples = scrape()

    assert samples[("gateway_effects", (("status", "UNKNOWN"), ("type", "ticket.create")))] == 1
    assert samples[("gateway_unknown_oldest_age_seconds", ())] >= 600
    assert 120 <= samples[("gateway_reconcile_lag_seconds", ())] < 600

    services.reconcile_next_batch()
    tally()  # CONFIRMED is settled: counted by the tally pass, exact once it has run
    samples = scrape()

    assert ("gateway_effects", (("status", "UNKNOWN"), ("type", "ticket.create"))) not in samples
    assert samples[("gateway_effects", (("status", "CONFIRMED"), ("type", "ticket.create")))] == 1
    assert samples[("gateway_unknown_oldest_age_seconds", ())] == 0
    assert samples[("gateway_reconcile_lag_seconds", ())] == 0


def test_escalations_and_lookups_are_counted(recon_unknown, recon_sandbox):
    def lookups(outcome: str) -> float:
        value = REGISTRY.get_sample_value("gateway_reconcile_lookups_total", {"outcome": outcome})
        return value or 0.0

    effect = recon_unknown()
    recon_sandbox.add_fault("lookup_unreachable", times=None)
    before = lookups("inconclusive"), lookups("escalated")

    for _ in range(8):
        services.effect_reconcile(effect_id=effect.pk)

    assert lookups("inconclusive") - before[0] == 7
    assert lookups("escalated") - before[1] == 1
    samples = scrape()
    assert samples[("gateway_effects_escalated", (("owner", "support-tools"),))] == 1
    assert samples[("gateway_cases_unresolved", (("reason", "lookup_budget_exhausted"),))] == 1
