"""Prometheus metrics of reconciliation.

Counters count what this process did (lookups, webhook deliveries). The ledger's gauges —
effects by status and type, the oldest UNKNOWN, the reconciler's lag, open escalations — are
read from the database at scrape time by :class:`LedgerCollector`, so every node that serves
``/metrics`` reports the same truth and nothing goes stale when a worker dies.

Every statement of a scrape reads the open queue or a small table, never the history: the
effects still moving are counted through the partial indexes of the dispatcher and the
reconciler, the settled ones (and COMPENSATING) are read from the tallies that a periodic
pass keeps from the sealed audit chain (``reconciliation.tally``), exact as of that pass.
"""

from __future__ import annotations

from collections.abc import Iterator

from django.conf import settings
from django.db import connection
from django.db.models import Count, Min, Q, Sum
from django.utils import timezone
from prometheus_client import REGISTRY, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.choices import BEFORE_DISPATCH, TO_RECONCILE, EffectStatus
from gateway.models import Effect
from reconciliation.choices import UNRESOLVED, OrphanState
from reconciliation.models import Case, EffectTally, OrphanReceipt

# The statuses counted at scrape time, each group through the partial index whose predicate
# it repeats (effect_before_dispatch, effect_lease_due, effect_reconcile_due): the open queue.
# The others come from the tallies (reconciliation.tally).
_LIVE_GROUPS = (
    sorted(BEFORE_DISPATCH),
    [EffectStatus.DISPATCHING],
    sorted(TO_RECONCILE),
)
LIVE_STATUSES = frozenset(status for group in _LIVE_GROUPS for status in group)

_TALLY_BEHIND = """
SELECT COALESCE(sum(h.length - COALESCE(t.position, 0)), 0)
  FROM gateway_auditchainhead h
  LEFT JOIN reconciliation_tallyhead t ON t.tenant_id = h.tenant_id
"""

LOOKUPS = Counter(
    "gateway_reconcile_lookups",
    "Provider lookups made by the reconciler, by what the gateway did with the answer.",
    ["outcome"],
)
WEBHOOKS = Counter(
    "gateway_webhook_deliveries",
    "Asynchronous provider receipts accepted, by provider and outcome.",
    ["provider", "outcome"],
)
WEBHOOKS_REFUSED = Counter(
    "gateway_webhook_refused",
    "Webhook requests refused before reading them (bad or old signature, unknown provider).",
    ["provider", "reason"],
)


class LedgerCollector(Collector):
    """Gauges read from the ledger at scrape time (a handful of indexed aggregate queries)."""

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # Registration calls describe(), not collect(): no query runs at import time.
        yield from self._families()

    def _families(self) -> list[GaugeMetricFamily]:
        return [
            GaugeMetricFamily(
                "gateway_effects",
                "Effects in the ledger by status and type. "
                f"{', '.join(sorted(LIVE_STATUSES))}: counted at scrape time. "
                "The others (settled, and COMPENSATING): exact as of the last tally pass, "
                f"every {settings.GATEWAY_TALLY_INTERVAL:g} s, over the events the audit "
                "sequencer has sealed (see gateway_effects_tally_behind).",
                labels=["status", "type"],
            ),
            GaugeMetricFamily(
                "gateway_effects_tally_behind",
                "Sealed audit events the tally pass has not counted yet (0: the settled "
                "counts of gateway_effects are current up to the audit seal; large: a "
                "backfill in progress, or the tally task is not running).",
            ),
            GaugeMetricFamily(
                "gateway_unknown_oldest_age_seconds",
                "Seconds since the oldest UNKNOWN effect became UNKNOWN (0: none).",
            ),
            GaugeMetricFamily(
                "gateway_reconcile_lag_seconds",
                "Seconds the most overdue UNKNOWN/IN_PROGRESS lookup has waited (0: none due).",
            ),
            GaugeMetricFamily(
                "gateway_effects_escalated",
                "Effects handed to a human (escalated or mismatched), by owner.",
                labels=["owner"],
            ),
            GaugeMetricFamily(
                "gateway_cases_unresolved",
                "Open or acknowledged cases in the human queue, by reason.",
                labels=["reason"],
            ),
            GaugeMetricFamily(
                "gateway_orphan_receipts_open",
                "Provider receipts naming no command of ours, not yet handled.",
            ),
        ]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = timezone.now()
        effects, behind, oldest, lag, escalated, cases, orphans = self._families()
        live, *others = (
            Effect.objects.filter(status__in=group)
            .values("status", "type")
            .annotate(n=Count("pk"))
            .order_by()
            for group in _LIVE_GROUPS
        )
        for row in live.union(*others, all=True):
            effects.add_metric([row["status"], row["type"]], row["n"])
        for tallied in (
            EffectTally.objects.exclude(status__in=sorted(LIVE_STATUSES))
            .values("status", "type")
            .annotate(n=Sum("count"))
            .order_by()
        ):
            if tallied["n"]:
                effects.add_metric([tallied["status"], tallied["type"]], tallied["n"])
        with connection.cursor() as cursor:
            cursor.execute(_TALLY_BEHIND)
            behind.add_metric([], cursor.fetchone()[0])
        first_unknown = Effect.objects.filter(status=EffectStatus.UNKNOWN).aggregate(
            at=Min("status_changed_at")
        )["at"]
        oldest.add_metric([], (now - first_unknown).total_seconds() if first_unknown else 0.0)
        # The reconciler's own predicate (partial index effect_reconcile_due).
        first_due = Effect.objects.filter(
            status__in=sorted(TO_RECONCILE), next_check_at__lte=now
        ).aggregate(at=Min("next_check_at"))["at"]
        lag.add_metric([], (now - first_due).total_seconds() if first_due else 0.0)
        for flagged in (
            Effect.objects.filter(Q(escalated=True) | Q(mismatch=True))
            .values("owner")
            .annotate(n=Count("pk"))
            .order_by()
        ):
            escalated.add_metric([flagged["owner"]], flagged["n"])
        for unresolved in (
            Case.objects.filter(state__in=sorted(UNRESOLVED))
            .values("reason")
            .annotate(n=Count("pk"))
            .order_by()
        ):
            cases.add_metric([unresolved["reason"]], unresolved["n"])
        orphans.add_metric([], OrphanReceipt.objects.filter(state=OrphanState.OPEN).count())
        yield from (effects, behind, oldest, lag, escalated, cases, orphans)


_collector: LedgerCollector | None = None


def register_collector() -> LedgerCollector:
    """Add the ledger collector to the default registry once per process."""
    global _collector
    if _collector is None:
        _collector = LedgerCollector()
        REGISTRY.register(_collector)
    return _collector
