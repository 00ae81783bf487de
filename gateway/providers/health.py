"""How each provider is doing for one tenant, from the ledger's own rows: whether its sends and
its lookups are answering (and since when), their error rate and the sends' latency over the
last hour, and how many of the tenant's effects at it are UNKNOWN, with their trend.

Sends are the ``Attempt`` rows (``started_at`` in the window, through the BRIN index
``attempt_started``); lookups are the reconciler's records, which live in the reconciliation
app: it registers their query here (``add_lookup_source``), so this module never imports it.
Every query is bounded by the window and grouped by provider in the database (the provider of
a row is its type's contract's: no join with the commands), so the cost follows the last
hour's traffic, not the size of the ledger. The triage queue's strip and the providers page
read the same ``provider_health``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import (
    Aggregate,
    Case,
    CharField,
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    FloatField,
    Max,
    Min,
    Q,
    QuerySet,
    Value,
    When,
)
from django.utils import timezone

from gateway.choices import AttemptState, EffectStatus, Outcome
from gateway.contracts import CONTRACTS
from gateway.models import Attempt, Effect

# What "over the last hour" means on the strip and the providers page.
WINDOW = timedelta(hours=1)


class Percentile(Aggregate):
    """PostgreSQL's ``percentile_cont(fraction) WITHIN GROUP (ORDER BY …)``, in seconds for a
    duration."""

    function = "percentile_cont"
    template = (
        "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM %(expressions)s))"
        "%(filter)s"
    )
    output_field = FloatField()

    def __init__(self, expression: Any, *, fraction: float, **extra: Any) -> None:
        if not 0 <= fraction <= 1:
            raise ValueError(f"a percentile's fraction is within [0, 1], not {fraction}")
        super().__init__(expression, fraction=float(fraction), **extra)


def provider_of_type(type_field: str = "type") -> Case:
    """The provider of a row from its effect type (``type_field``), by the contracts."""
    by_provider: dict[str, list[str]] = {}
    for contract in CONTRACTS.values():
        by_provider.setdefault(contract.provider, []).append(contract.type)
    whens = [
        When(**{f"{type_field}__in": sorted(types)}, then=Value(provider))
        for provider, types in sorted(by_provider.items())
    ]
    return Case(*whens, default=Value(""), output_field=CharField())


def provider_names() -> list[str]:
    return sorted({contract.provider for contract in CONTRACTS.values()})


@dataclass(frozen=True)
class Tally:
    """Calls of one kind (sends or lookups) to one provider within the window: how many, how
    many failed (no answer, or a 5xx), the first and last of each, and ``marked``: how many
    moved the UNKNOWN count (sends that ended UNKNOWN; lookups that settled one)."""

    calls: int = 0
    errors: int = 0
    first_ok: datetime | None = None
    last_ok: datetime | None = None
    first_fail: datetime | None = None
    last_fail: datetime | None = None
    marked: int = 0
    p50: float | None = None  # seconds
    p99: float | None = None


def tallies(
    rows: QuerySet[Any],
    *,
    at: str,
    failed: Q,
    marked: Q,
    type_field: str,
    extra: dict[str, Aggregate] | None = None,
) -> dict[str, Tally]:
    """``rows`` (already bounded by the window) grouped by provider in one query."""
    ok = ~failed
    grouped = (
        rows.order_by()
        .annotate(health_provider=provider_of_type(type_field))
        .values("health_provider")
        .annotate(
            calls=Count("pk"),
            errors=Count("pk", filter=failed),
            first_ok=Min(at, filter=ok),
            last_ok=Max(at, filter=ok),
            first_fail=Min(at, filter=failed),
            last_fail=Max(at, filter=failed),
            marked=Count("pk", filter=marked),
            **(extra or {}),
        )
    )
    return {row.pop("health_provider"): Tally(**row) for row in grouped}


# Who adds the lookups: ``source(tenant_id, since) -> {provider: Tally}`` (reconciliation).
lookup_sources: list[Callable[[int, datetime], dict[str, Tally]]] = []


def add_lookup_source(source: Callable[[int, datetime], dict[str, Tally]]) -> None:
    if source not in lookup_sources:
        lookup_sources.append(source)


# A send failed when the provider gave no answer (refused, reset, timed out: no HTTP status)
# or a 5xx; a refusal, a 409 or a 429 is an answer.
_SEND_FAILED = Q(outcome__in=[Outcome.UNKNOWN, Outcome.NOT_STARTED]) & (
    Q(http_status__isnull=True) | Q(http_status__gte=500)
)


def send_tallies(tenant_id: int, since: datetime) -> dict[str, Tally]:
    """The tenant's finished attempts started since ``since``, with the latency percentiles of
    those the provider answered."""
    latency = ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField())
    answered = ~_SEND_FAILED
    return tallies(
        Attempt.objects.filter(
            started_at__gte=since,
            effect__tenant_id=tenant_id,
            state__in=[AttemptState.FINISHED, AttemptState.STALE],
            finished_at__isnull=False,
        ),
        at="finished_at",
        failed=_SEND_FAILED,
        marked=Q(outcome=Outcome.UNKNOWN),
        type_field="effect__type",
        extra={
            "p50": Percentile(latency, fraction=0.5, filter=answered),
            "p99": Percentile(latency, fraction=0.99, filter=answered),
        },
    )


@dataclass(frozen=True)
class Channel:
    """Sends or lookups of one provider: ``answering`` is None when there was no call in the
    window; ``since`` is when the current state began as far as the window shows (None: it
    held the whole window)."""

    answering: bool | None
    since: datetime | None
    calls: int
    errors: int

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.calls if self.calls else None


def channel(tally: Tally) -> Channel:
    if not tally.calls:
        return Channel(None, None, 0, 0)
    if tally.last_fail is None:
        return Channel(True, None, tally.calls, tally.errors)
    if tally.last_ok is None:
        return Channel(False, tally.first_fail, tally.calls, tally.errors)
    if tally.last_ok > tally.last_fail:
        # Answering again since the last failure.
        return Channel(True, tally.last_fail, tally.calls, tally.errors)
    # Failing since the last answer.
    return Channel(False, tally.last_ok, tally.calls, tally.errors)


@dataclass(frozen=True)
class ProviderHealth:
    """One provider as the tenant's rows of the last hour show it."""

    provider: str
    sends: Channel
    lookups: Channel
    # Seconds from sending to the answer, of the sends the provider answered.
    latency_p50: float | None
    latency_p99: float | None
    # The tenant's UNKNOWN effects at this provider now, and over the window: how many sends
    # ended UNKNOWN, how many lookups settled an uncertain effect (UNKNOWN or IN_PROGRESS).
    unknown: int
    unknown_new: int
    unknown_settled: int
    window_start: datetime = field(compare=False, default_factory=timezone.now)

    @property
    def trend(self) -> str:
        """``rising``, ``falling`` or ``steady``: more new UNKNOWNs than settled, or fewer."""
        if self.unknown_new > self.unknown_settled:
            return "rising"
        if self.unknown_new < self.unknown_settled:
            return "falling"
        return "steady"

    @property
    def lookups_failing(self) -> bool:
        return self.lookups.answering is False


def unknown_counts(tenant_id: int) -> dict[str, int]:
    """The tenant's UNKNOWN effects per provider (the index ``effect_tenant_status``)."""
    rows = (
        Effect.objects.filter(tenant_id=tenant_id, status=EffectStatus.UNKNOWN)
        .order_by()
        .annotate(health_provider=provider_of_type("type"))
        .values("health_provider")
        .annotate(count=Count("pk"))
    )
    return {row["health_provider"]: row["count"] for row in rows}


def provider_health(
    tenant_id: int, *, now: datetime | None = None, providers: Iterable[str] | None = None
) -> dict[str, ProviderHealth]:
    """Every provider of the contracts (or those named), as the tenant's rows show them."""
    now = now or timezone.now()
    since = now - WINDOW
    sends = send_tallies(tenant_id, since)
    lookups: dict[str, Tally] = {}
    for source in lookup_sources:
        lookups.update(source(tenant_id, since))
    unknown = unknown_counts(tenant_id)
    health = {}
    for name in providers if providers is not None else provider_names():
        sent, looked = sends.get(name, Tally()), lookups.get(name, Tally())
        health[name] = ProviderHealth(
            provider=name,
            sends=channel(sent),
            lookups=channel(looked),
            latency_p50=sent.p50,
            latency_p99=sent.p99,
            unknown=unknown.get(name, 0),
            unknown_new=sent.marked,
            unknown_settled=looked.marked,
            window_start=since,
        )
    return health
