"""``/dashboard``: pictures of the ledger — status changes over time, UNKNOWN and approvals by
age, time from submission to CONFIRMED, each provider's error rate and latency, and a
sparkline per triage group.

What happened over time is read from the roll-up (``LedgerRollup``, gateway.rollup): a few
hundred rows whatever the size of the ledger. What is waiting now (UNKNOWN, approvals, the
triage groups) is read live through the indexes the triage queue uses. Every chart is drawn
by ``static/dashboard.js`` from the table printed beside it: the table is the chart's
accessible alternative and its only data source, so the two cannot disagree.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Case, Count, DateTimeField, F, Min, Q, Sum, When
from django.db.models.functions import TruncHour
from django.http import HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from gateway.choices import EffectStatus
from gateway.console.base import ConsoleRequest, console_view
from gateway.console.selectors import GROUP_FIELDS, TriageGroup, effects_for_triage
from gateway.contracts import CONTRACTS
from gateway.models import Effect, LedgerRollup
from gateway.rollup import CONFIRM_SECONDS, LATENCY_MS
from gateway.templatetags.console import duration_label

S = EffectStatus


@dataclass(frozen=True)
class Range:
    """A choice of the range selector: how far back, from which roll-up width, in which
    steps (the chart's points and the table's rows)."""

    label: str
    span: timedelta
    width: int
    step: timedelta

    def start(self, now: datetime) -> datetime:
        """The first step's start: the steps end with the one that holds ``now``."""
        epoch = datetime(2000, 1, 1, tzinfo=now.tzinfo)
        floored = epoch + ((now - epoch) // self.step) * self.step
        return floored - self.span + self.step

    def steps(self, now: datetime) -> list[datetime]:
        first = self.start(now)
        return [first + i * self.step for i in range(self.span // self.step)]


RANGES = {
    "hour": Range("last hour", timedelta(hours=1), 1, timedelta(minutes=5)),
    "day": Range("last day", timedelta(days=1), 60, timedelta(hours=1)),
    "week": Range("last week", timedelta(days=7), 60, timedelta(hours=6)),
}

# The age classes of what is waiting (UNKNOWN since it became so, approvals since submission):
# (label, upper bound); the last class has none.
AGES: tuple[tuple[str, timedelta | None], ...] = (
    ("under 5 min", timedelta(minutes=5)),
    ("5–30 min", timedelta(minutes=30)),
    ("30 min–2 h", timedelta(hours=2)),
    ("2–24 h", timedelta(hours=24)),
    ("over 1 day", None),
)
# The same classes on a chart axis a phone's width.
AGE_SHORTS = ["<5m", "5–30m", "½–2h", "2–24h", ">1d"]
SPARK_HOURS = 24


@dataclass
class Table:
    """A chart's numbers: one row per point (its label and x value), one column per series.
    ``None`` is "no value" (an empty step's percentile)."""

    columns: list[str]
    rows: list[tuple[str, int, list[float | None]]] = field(default_factory=list)
    # The columns the chart draws (all unless told), and short row labels for its x axis.
    drawn: list[int] | None = None
    shorts: list[str] = field(default_factory=list)

    @property
    def legend(self) -> list[tuple[int, str]]:
        """(colour index, name) of each drawn column: the chart's legend."""
        drawn = range(len(self.columns)) if self.drawn is None else self.drawn
        return [(i, self.columns[i]) for i in drawn]

    @property
    def cells(self) -> list[tuple[str, int, list[tuple[str, str]], str]]:
        """The rows as the template prints them: each value as the chart reads it
        (``data-value``, "" for none) and as a person reads it."""
        shorts = self.shorts or [""] * len(self.rows)
        return [
            (
                label,
                x,
                [("" if v is None else f"{v:g}", "–" if v is None else f"{v:g}") for v in values],
                short,
            )
            for (label, x, values), short in zip(self.rows, shorts, strict=True)
        ]

    def column(self, name: str) -> list[float | None]:
        index = self.columns.index(name)
        return [values[index] for _, _, values in self.rows]


def percentile_bucket(counts: Sequence[int], q: float) -> int | None:
    """The bucket that holds the ``q`` quantile of a histogram, None when it is empty."""
    total = sum(counts)
    if not total:
        return None
    running = 0
    for index, count in enumerate(counts):
        running += count
        if running >= q * total:
            return index
    return len(counts) - 1


def bucket_bound(bounds: Sequence[int], index: int | None) -> float | None:
    """The upper bound of bucket ``index``; for the last, open bucket, its lower bound (the
    table says "over")."""
    if index is None:
        return None
    return float(bounds[min(index, len(bounds) - 1)])


def _histogram(rows: dict[int, int], size: int) -> list[int]:
    return [rows.get(i, 0) for i in range(size)]


def _rollup(tenant_id: int, series: str, choice: Range, now: datetime):
    return LedgerRollup.objects.filter(
        tenant_id=tenant_id, series=series, width=choice.width, start__gte=choice.start(now)
    )


def _step_of(choice: Range, now: datetime, moment: datetime) -> int:
    return int((moment - choice.start(now)) // choice.step)


def _label(choice: Range, moment: datetime) -> str:
    local = timezone.localtime(moment)
    return f"{local:%H:%M}" if choice.width == 1 else f"{local:%a %H:%M}"


def _empty_table(columns: list[str], choice: Range, now: datetime) -> Table:
    return Table(
        columns=columns,
        rows=[
            (_label(choice, step), int(step.timestamp()), [0.0] * len(columns))
            for step in choice.steps(now)
        ],
    )


def status_table(tenant_id: int, choice: Range, now: datetime) -> Table:
    """Status changes into each status per step (only the statuses that occur)."""
    rows = (
        _rollup(tenant_id, "status", choice, now)
        .values("start", "key")
        .annotate(n=Sum("count"))
        .order_by()
    )
    found: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for row in rows:
        found[row["key"]][_step_of(choice, now, row["start"])] += row["n"]
    columns = [status for status in S.values if status in found]
    table = _empty_table(columns, choice, now)
    for i, (_, _, values) in enumerate(table.rows):
        for j, status in enumerate(columns):
            values[j] = float(found[status].get(i, 0))
    return table


def confirm_table(tenant_id: int, choice: Range, now: datetime) -> tuple[Table, dict[str, Any]]:
    """Per step: effects confirmed, and the p50 and p95 of their time since submission (the
    buckets' upper bounds, in seconds); plus the same over the whole range."""
    rows = (
        _rollup(tenant_id, "confirm", choice, now)
        .values("start", "bucket")
        .annotate(n=Sum("count"))
        .order_by()
    )
    size = len(CONFIRM_SECONDS) + 1
    per_step: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    whole: dict[int, int] = defaultdict(int)
    for row in rows:
        per_step[_step_of(choice, now, row["start"])][row["bucket"]] += row["n"]
        whole[row["bucket"]] += row["n"]
    table = _empty_table(["confirmed", "p50 s", "p95 s"], choice, now)
    table.drawn = [1, 2]  # the count is in the table; the chart draws the percentiles
    for i, (_, _, values) in enumerate(table.rows):
        histogram = _histogram(per_step.get(i, {}), size)
        values[0] = float(sum(histogram))
        values[1] = bucket_bound(CONFIRM_SECONDS, percentile_bucket(histogram, 0.5))
        values[2] = bucket_bound(CONFIRM_SECONDS, percentile_bucket(histogram, 0.95))
    histogram = _histogram(whole, size)
    summary = {
        "count": sum(histogram),
        "p50": _bound_label(CONFIRM_SECONDS, percentile_bucket(histogram, 0.5), "s"),
        "p95": _bound_label(CONFIRM_SECONDS, percentile_bucket(histogram, 0.95), "s"),
    }
    return table, summary


@dataclass(frozen=True)
class ProviderHealth:
    """One provider's attempts over the range: how many, how many failed, how fast."""

    provider: str
    attempts: int
    errors: int
    p50: str
    p95: str
    p50_ms: float | None
    p95_ms: float | None

    @property
    def error_rate(self) -> str:
        return f"{100 * self.errors / self.attempts:.1f} %" if self.attempts else "–"


def provider_health(tenant_id: int, choice: Range, now: datetime) -> tuple[list[Any], Table]:
    """Each provider's attempts, errors and latency percentiles over the range, and its error
    rate (per cent) per step."""
    rows = (
        _rollup(tenant_id, "attempt", choice, now)
        .values("start", "key", "bucket")
        .annotate(n=Sum("count"), e=Sum("errors"))
        .order_by()
    )
    size = len(LATENCY_MS) + 1
    latency: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    steps: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for row in rows:
        latency[row["key"]][row["bucket"]] += row["n"]
        step = steps[row["key"]][_step_of(choice, now, row["start"])]
        step[0] += row["n"]
        step[1] += row["e"]
    health = []
    for provider in sorted(latency):
        histogram = _histogram(latency[provider], size)
        p50, p95 = percentile_bucket(histogram, 0.5), percentile_bucket(histogram, 0.95)
        health.append(
            ProviderHealth(
                provider=provider,
                attempts=sum(histogram),
                errors=sum(errors for _, errors in steps[provider].values()),
                p50=_bound_label(LATENCY_MS, p50, "ms"),
                p95=_bound_label(LATENCY_MS, p95, "ms"),
                p50_ms=bucket_bound(LATENCY_MS, p50),
                p95_ms=bucket_bound(LATENCY_MS, p95),
            )
        )
    table = _empty_table(sorted(latency), choice, now)
    for i, (_, _, values) in enumerate(table.rows):
        for j, provider in enumerate(table.columns):
            attempts, errors = steps[provider].get(i, (0, 0))
            values[j] = round(100 * errors / attempts, 1) if attempts else None
    return health, table


def _bound_label(bounds: Sequence[int], index: int | None, unit: str) -> str:
    if index is None:
        return "–"
    if index >= len(bounds):
        return f"over {_amount(bounds[-1], unit)}"
    return f"≤ {_amount(bounds[index], unit)}"


def _amount(value: int, unit: str) -> str:
    if unit == "ms":
        return f"{value} ms" if value < 1000 else f"{value / 1000:g} s"
    if value < 60:
        return f"{value} s"
    if value < 3600:
        return f"{value // 60} min"
    return f"{value // 3600} h"


def waiting_by_age(tenant_id: int, now: datetime) -> dict[str, Any]:
    """UNKNOWN effects (by time since they became UNKNOWN) and approvals waiting (by time
    since submission), counted per age class: one query on the (tenant, status) index."""
    aggregates: dict[str, Any] = {}
    for status, since in ((S.UNKNOWN, "status_changed_at"), (S.AWAITING_APPROVAL, "created_at")):
        lower: timedelta | None = None
        for index, (_, upper) in enumerate(AGES):
            ages = Q(status=status)
            if lower is not None:
                ages &= Q(**{f"{since}__lte": now - lower})
            if upper is not None:
                ages &= Q(**{f"{since}__gt": now - upper})
            aggregates[f"{status}_{index}"] = Count("pk", filter=ages)
            lower = upper
        aggregates[f"{status}_oldest"] = Min(since, filter=Q(status=status))
    found = Effect.objects.filter(
        tenant_id=tenant_id, status__in=[S.UNKNOWN, S.AWAITING_APPROVAL]
    ).aggregate(**aggregates)
    table = Table(columns=["UNKNOWN", "approvals waiting"], shorts=AGE_SHORTS)
    for index, (label, _) in enumerate(AGES):
        table.rows.append(
            (
                label,
                index,
                [
                    float(found[f"{S.UNKNOWN}_{index}"]),
                    float(found[f"{S.AWAITING_APPROVAL}_{index}"]),
                ],
            )
        )
    return {
        "table": table,
        "unknown": int(sum(v or 0 for v in table.column("UNKNOWN"))),
        "approvals": int(sum(v or 0 for v in table.column("approvals waiting"))),
        "unknown_oldest": found[f"{S.UNKNOWN}_oldest"],
        "approvals_oldest": found[f"{S.AWAITING_APPROVAL}_oldest"],
    }


@dataclass
class GroupSpark:
    """A triage group and how many of its effects changed status in each of the last hours."""

    provider: str
    type: str
    cause: str
    cause_label: str
    count: int
    querystring: str
    hours: list[int]

    @property
    def points(self) -> str:
        return " ".join(str(n) for n in self.hours)


def group_sparklines(request: ConsoleRequest, now: datetime) -> list[GroupSpark]:
    """The triage queue's groups (as the triage page shows them: biggest first), each with
    the arrivals of its effects per hour over the last day (by the time each last changed
    status). One query: the queue grouped by type, cause and that hour (none when older)."""
    queue = effects_for_triage(principal=request.principal, now=now)
    first_hour = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=SPARK_HOURS - 1)
    hour = TruncHour(
        Case(
            When(status_changed_at__gte=first_hour, then=F("status_changed_at")),
            default=None,
            output_field=DateTimeField(),
        )
    )
    rows = (
        queue.order_by()
        .values(*GROUP_FIELDS, hour=hour)
        .annotate(n=Count("pk"), oldest=Min("created_at"))
    )
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        group = groups.setdefault(
            (row["type"], row["cause"]),
            {"count": 0, "oldest": row["oldest"], "hours": [0] * SPARK_HOURS},
        )
        group["count"] += row["n"]
        group["oldest"] = min(group["oldest"], row["oldest"])
        if row["hour"] is not None:
            index = int((row["hour"] - first_hour) // timedelta(hours=1))
            if 0 <= index < SPARK_HOURS:
                group["hours"][index] += row["n"]
    sparks = []
    for (type_, cause), group in sorted(
        groups.items(), key=lambda item: (-item[1]["count"], item[1]["oldest"])
    ):
        contract = CONTRACTS.get(type_)
        triage_group = TriageGroup(
            provider=contract.provider if contract else "?",
            type=type_,
            cause=cause,
            count=group["count"],
            oldest=group["oldest"],
        )
        sparks.append(
            GroupSpark(
                provider=triage_group.provider,
                type=type_,
                cause=cause,
                cause_label=triage_group.cause_label,
                count=group["count"],
                querystring=triage_group.querystring(),
                hours=group["hours"],
            )
        )
    return sparks


def dashboard_context(request: ConsoleRequest, now: datetime) -> dict[str, Any]:
    range_name = request.GET.get("range", "hour")
    if range_name not in RANGES:
        range_name = "hour"
    choice = RANGES[range_name]
    tenant_id = request.principal.tenant_id
    confirm, confirm_summary = confirm_table(tenant_id, choice, now)
    providers, error_rates = provider_health(tenant_id, choice, now)
    newest = (
        LedgerRollup.objects.filter(tenant_id=tenant_id, series="status", width=1)
        .order_by("-start")
        .values_list("start", flat=True)
        .first()
    )
    return {
        "view_name": "dashboard",
        "now": now,
        "ranges": [(name, r.label) for name, r in RANGES.items()],
        "range_name": range_name,
        "range": choice,
        "statuses": status_table(tenant_id, choice, now),
        "confirm": confirm,
        "confirm_summary": confirm_summary,
        "providers": providers,
        "known_providers": sorted({c.provider for c in CONTRACTS.values()}),
        "error_rates": error_rates,
        "waiting": waiting_by_age(tenant_id, now),
        "groups": group_sparklines(request, now),
        "counted_until": newest,
        "rollup_every": duration_label(timedelta(seconds=settings.GATEWAY_ROLLUP_INTERVAL)),
    }


@require_GET
@console_view
def dashboard(request: ConsoleRequest) -> HttpResponse:
    """``/dashboard``: the ledger over the last hour, day or week (``?range=``)."""
    return render(
        request, "gateway/ledger_dashboard.html", dashboard_context(request, timezone.now())
    )
