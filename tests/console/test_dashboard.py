"""The dashboard's roll-up (gateway.rollup) against the ledger's own rows, and the dashboard
page's tables against SQL over those rows: counts per minute and per hour, latency and
time-to-CONFIRMED buckets, a second count that changes nothing, a late commit picked up by the
next count, two passes at once, and the page's numbers."""

from __future__ import annotations

import re
import threading
from collections import Counter
from datetime import datetime, timedelta

import pytest
from django.db import connection, connections
from django.utils import timezone

from gateway.models import Attempt, EffectEvent, LedgerRollup
from gateway.rollup import CONFIRM_SECONDS, LATENCY_MS, rollup_recent, rollup_span
from tests.console.conftest import EMAIL, REFUND, TICKET, add_attempt, set_state, submit


def _bucket(bounds: tuple[int, ...], value: float) -> int:
    """width_bucket in Python: how many bounds are <= value."""
    return sum(1 for bound in bounds if bound <= value)


def _minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def _event(effect, to_status: str, at: datetime, from_status: str = "DISPATCHING"):
    return EffectEvent.objects.create(
        tenant_id=effect.tenant_id,
        effect=effect,
        kind="dispatched",
        from_status=from_status,
        to_status=to_status,
        actor="worker:test",
        created_at=at,
    )


@pytest.fixture
def ledger(bot):
    """Effects of three providers over the last 90 minutes: submissions (through the service,
    so their events are the gateway's own), attempts of known latency and outcome, and
    CONFIRMED / UNKNOWN events at known times."""
    now = timezone.now()
    effects = []
    for i, body in enumerate([REFUND, TICKET, EMAIL] * 4):
        at = now - timedelta(minutes=7 * i + 1)
        effect = set_state(submit(bot.principal, body), created_at=at)
        effects.append(effect)
        latency = timedelta(milliseconds=(3, 40, 300, 12_000)[i % 4])
        outcome = "unknown" if i % 5 == 0 else "confirmed"
        add_attempt(
            effect,
            outcome=outcome,
            started_at=at + timedelta(seconds=1),
            finished_at=at + timedelta(seconds=1) + latency,
        )
        if outcome == "confirmed":
            _event(effect, "CONFIRMED", at + timedelta(seconds=(2, 20, 400, 5000)[i % 4]))
        else:
            _event(effect, "UNKNOWN", at + timedelta(seconds=11))
    return effects


def expected_minutes(tenant_id: int, since: datetime, until: datetime | None = None) -> Counter:
    """The three series per minute of [since, the end of until's minute), counted in Python
    from the rows themselves (the fixture's rows stamped later are left out)."""
    found: Counter = Counter()
    end = _minute(until or timezone.now()) + timedelta(minutes=1)
    events = EffectEvent.objects.filter(
        tenant_id=tenant_id, created_at__gte=since, created_at__lt=end
    )
    for event in (
        events.exclude(to_status="").exclude(effect=None).select_related("effect__command")
    ):
        found[("status", _minute(event.created_at), event.to_status, 0, "count")] += 1
        if event.to_status == "CONFIRMED":
            command = event.effect.command
            seconds = (event.created_at - event.effect.created_at).total_seconds()
            key = ("confirm", _minute(event.created_at), command.provider)
            found[(*key, _bucket(CONFIRM_SECONDS, seconds), "count")] += 1
    attempts = Attempt.objects.filter(
        effect__tenant_id=tenant_id, finished_at__gte=since, finished_at__lt=end
    )
    for attempt in attempts.select_related("effect__command"):
        ms = (attempt.finished_at - attempt.started_at).total_seconds() * 1000
        key = ("attempt", _minute(attempt.finished_at), attempt.effect.command.provider)
        found[(*key, _bucket(LATENCY_MS, ms), "count")] += 1
        if attempt.outcome in ("unknown", "not_started"):
            found[(*key, _bucket(LATENCY_MS, ms), "errors")] += 1
    return found


def counted(tenant_id: int, width: int = 1) -> Counter:
    found: Counter = Counter()
    for row in LedgerRollup.objects.filter(tenant_id=tenant_id, width=width):
        found[(row.series, row.start, row.key, row.bucket, "count")] += row.count
        if row.errors:
            found[(row.series, row.start, row.key, row.bucket, "errors")] += row.errors
    return found


def test_the_minutes_are_the_ledgers_rows_counted(ledger):
    tenant_id = ledger[0].tenant_id
    now = timezone.now()
    since = now - timedelta(hours=3)
    rollup_span(since=since, until=now)
    expected = expected_minutes(tenant_id, _minute(since), now)
    assert counted(tenant_id) == expected
    # Every kind of row is there: status changes, attempts (with errors) and confirmations.
    series = {key[0] for key in expected}
    assert series == {"status", "attempt", "confirm"}
    assert any(key[-1] == "errors" for key in expected)
    assert len({key[3] for key in expected if key[0] == "attempt"}) == 4  # four latency buckets


def test_the_hours_are_the_sums_of_their_minutes(ledger):
    tenant_id = ledger[0].tenant_id
    rollup_span(since=timezone.now() - timedelta(hours=3), until=timezone.now())
    hours: Counter = Counter()
    for (series, start, key, bucket, what), n in counted(tenant_id).items():
        hours[(series, start.replace(minute=0), key, bucket, what)] += n
    assert counted(tenant_id, width=60) == hours


def test_a_second_count_changes_nothing_and_a_late_commit_is_picked_up(ledger):
    tenant_id = ledger[0].tenant_id
    now = timezone.now()
    rollup_recent(now=now)
    first = counted(tenant_id)
    rows = LedgerRollup.objects.count()
    rollup_recent(now=now)
    assert counted(tenant_id) == first
    assert LedgerRollup.objects.count() == rows
    # A transaction that was open during the count commits an event stamped minutes ago.
    late = _event(ledger[1], "CONFIRMED", now - timedelta(minutes=3))
    rollup_recent(now=now + timedelta(seconds=30))
    key = ("status", _minute(late.created_at), "CONFIRMED", 0, "count")
    assert counted(tenant_id)[key] == first[key] + 1
    later = now + timedelta(seconds=30)
    assert counted(tenant_id) == expected_minutes(
        tenant_id, _minute(now - timedelta(days=8)), later
    )


def test_old_rows_leave_and_other_tenants_are_apart(ledger, olga):
    tenant_id = ledger[0].tenant_id
    rollup_recent()
    LedgerRollup.objects.create(
        tenant_id=tenant_id,
        width=1,
        start=_minute(timezone.now() - timedelta(days=9)),
        series="status",
        key="CONFIRMED",
        count=5,
    )
    rollup_recent()
    assert not LedgerRollup.objects.filter(start__lt=timezone.now() - timedelta(days=8)).exists()
    assert not LedgerRollup.objects.filter(tenant_id=olga.principal.tenant_id).exists()


@pytest.mark.django_db(transaction=True)
def test_two_passes_at_once_leave_the_same_counts(ledger):
    """Two workers run the pass together (a redelivered beat message): the advisory lock puts
    them in a row, and the counts are those of one pass."""
    tenant_id = ledger[0].tenant_id
    now = timezone.now()
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def run() -> None:
        try:
            barrier.wait()
            rollup_span(since=now - timedelta(hours=3), until=now)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    since = _minute(now - timedelta(hours=3))
    assert counted(tenant_id) == expected_minutes(tenant_id, since, now)


# --- the page ------------------------------------------------------------------------------


def table_rows(html: str, table_id: str) -> list[list[str]]:
    """The cells (header and data) of each body row of the table ``table_id``."""
    body = html.split(f'id="{table_id}"', 1)[1].split("</table>", 1)[0]
    body = body.split("<tbody>", 1)[1]
    return [
        [
            re.sub(r"<[^>]+>", "", cell).strip()
            for cell in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.S)
        ]
        for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)
    ]


def table_values(html: str, table_id: str) -> list[list[str]]:
    """The ``data-value`` of each cell (what the chart draws), per body row."""
    body = html.split(f'id="{table_id}"', 1)[1].split("</table>", 1)[0]
    body = body.split("<tbody>", 1)[1]
    return [
        re.findall(r'data-value="([^"]*)"', row)
        for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)
    ]


def sql_scalar(sql: str, params: list) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()[0]


def test_the_pages_tables_hold_the_numbers_of_sql_over_the_rows(oscar, ledger, bot):
    tenant_id = ledger[0].tenant_id
    now = timezone.now()
    set_state(submit(bot.principal, REFUND), status="UNKNOWN", status_changed_at=now)
    rollup_recent()
    html = oscar.client.get("/dashboard?range=day").content.decode()
    since = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=23)
    # What the ledger holds up to the end of this minute (the fixture stamps some rows later).
    end = _minute(now) + timedelta(minutes=1)
    header = html.split('id="statuses-table"', 1)[1].split("</thead>", 1)[0]
    columns = re.findall(r'<th scope="col" class="num">([^<]+)</th>', header)
    values = table_values(html, "statuses-table")
    for i, status in enumerate(columns):
        expected = sql_scalar(
            "SELECT count(*) FROM gateway_effectevent WHERE tenant_id = %s AND to_status = %s"
            " AND created_at >= %s AND created_at < %s",
            [tenant_id, status, since, end],
        )
        assert sum(float(row[i]) for row in values) == expected, status
    assert {"CONFIRMED", "UNKNOWN"} <= set(columns)
    # The providers' attempts and errors.
    for row in table_rows(html, "providers-table"):
        provider, attempts, errors = row[0], int(row[1]), int(row[2])
        assert (attempts, errors) == (
            sql_scalar(
                "SELECT count(*) FROM gateway_attempt a JOIN gateway_command c USING (effect_id)"
                " WHERE c.tenant_id = %s AND c.provider = %s AND a.finished_at >= %s"
                " AND a.finished_at < %s",
                [tenant_id, provider, since, end],
            ),
            sql_scalar(
                "SELECT count(*) FROM gateway_attempt a JOIN gateway_command c USING (effect_id)"
                " WHERE c.tenant_id = %s AND c.provider = %s AND a.finished_at >= %s"
                " AND a.finished_at < %s AND a.outcome IN ('unknown', 'not_started')",
                [tenant_id, provider, since, end],
            ),
        )
    # What is waiting now: UNKNOWN (live), in the table and the headline number.
    unknown = sql_scalar(
        "SELECT count(*) FROM gateway_effect WHERE tenant_id = %s AND status = 'UNKNOWN'",
        [tenant_id],
    )
    assert sum(float(row[0]) for row in table_values(html, "waiting-table")) == unknown
    assert re.search(rf'data-stat="unknown"><span class="dash-number">{unknown}</span>', html)
    # The confirmations: count per step adds up to the CONFIRMED events of the range.
    confirmed = sql_scalar(
        "SELECT count(*) FROM gateway_effectevent WHERE tenant_id = %s"
        " AND to_status = 'CONFIRMED' AND created_at >= %s AND created_at < %s",
        [tenant_id, since, end],
    )
    assert sum(float(row[0]) for row in table_values(html, "confirm-table")) == confirmed


def test_the_page_has_each_range_a_nav_link_and_sparklines(oscar, ledger):
    set_state(ledger[0], status="UNKNOWN", status_changed_at=timezone.now())
    rollup_recent()
    for name, steps in (("hour", 12), ("day", 24), ("week", 28)):
        html = oscar.client.get(f"/dashboard?range={name}").content.decode()
        assert len(table_values(html, "statuses-table")) == steps, name
        assert f'href="?range={name}" aria-current="page"' in html
    assert '<a href="/dashboard" aria-current="page">Dashboard</a>' in html
    assert "(the roll-up runs every 1 min)" in html
    assert 'data-spark="' in html
    spark = re.search(r'data-spark="([^"]+)"', html)
    assert spark and len(spark.group(1).split()) == 24 and spark.group(1).split()[-1] == "1"
    # An unknown range is the last hour.
    html = oscar.client.get("/dashboard?range=year").content.decode()
    assert len(table_values(html, "statuses-table")) == 12


def test_another_tenants_ledger_is_not_counted_on_the_page(olga, ledger):
    rollup_recent()
    html = olga.client.get("/dashboard?range=day").content.decode()
    assert 'id="providers-table"' not in html
    assert all(float(v or 0) == 0 for row in table_values(html, "statuses-table") for v in row)


def test_the_providers_percentiles_are_those_of_the_attempts(ledger):
    """p50 and p95 of each provider's latency read from the roll-up's buckets are the
    buckets of the attempts at those ranks, sorted by latency (nearest rank)."""
    from math import ceil

    from gateway.console.dashboard import RANGES, percentile_bucket, provider_health

    tenant_id = ledger[0].tenant_id
    now = timezone.now()
    rollup_recent(now=now)
    health, _ = provider_health(tenant_id, RANGES["day"], now)
    assert {p.provider for p in health} == {"billing", "tickets", "mail"}
    end = _minute(now) + timedelta(minutes=1)
    for provider in health:
        attempts = Attempt.objects.filter(
            effect__tenant_id=tenant_id,
            effect__command__provider=provider.provider,
            finished_at__lt=end,
        )
        latencies = sorted((a.finished_at - a.started_at).total_seconds() * 1000 for a in attempts)
        assert provider.attempts == len(latencies)
        assert provider.errors == attempts.filter(outcome__in=["unknown", "not_started"]).count()
        for q, found in ((0.5, provider.p50_ms), (0.95, provider.p95_ms)):
            bucket = _bucket(LATENCY_MS, latencies[ceil(q * len(latencies)) - 1])
            assert found == float(LATENCY_MS[min(bucket, len(LATENCY_MS) - 1)]), (provider, q)
    assert percentile_bucket([0, 0, 0], 0.5) is None


def test_the_beat_runs_the_roll_up_every_interval(settings, ledger):
    from gateway.tasks import rollup_ledger

    entry = settings.CELERY_BEAT_SCHEDULE["rollup-ledger"]
    assert entry["task"] == "gateway.tasks.rollup_ledger"
    assert entry["schedule"] == timedelta(seconds=settings.GATEWAY_ROLLUP_INTERVAL)
    assert rollup_ledger() > 0
    assert LedgerRollup.objects.filter(tenant_id=ledger[0].tenant_id, width=60).exists()
