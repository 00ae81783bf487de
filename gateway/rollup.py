"""The ledger per minute and per hour (``LedgerRollup``): what the console's dashboard draws,
counted from the ledger's append-only rows by a periodic pass (``rollup_recent``, beat every
GATEWAY_ROLLUP_INTERVAL) rather than on each transition, so the hot path pays nothing.

Three series, each a count per (tenant, start, key, bucket):

- ``status``: status changes into ``key`` (the events with a ``to_status``);
- ``attempt``: attempts finished at provider ``key``, by latency bucket (``LATENCY_MS``), with
  the errors among them (an outcome of ``unknown`` or ``not_started``: the provider timed out,
  failed or could not be reached; a refusal is an answer, not an error);
- ``confirm``: effects of provider ``key`` that became CONFIRMED, by bucket of the time since
  their submission (``CONFIRM_SECONDS``).

A pass recounts whole minutes (and the hours that hold them) and replaces what was there: the
rows it reads are never updated once written (events, finished attempts), so a recount of a
span already counted changes nothing, and a recount of the last few minutes on every pass
(``REAGGREGATE``) picks up what transactions still open at the previous pass committed later.
Percentiles are read from the buckets: "p95 ≤ 2.5 s" is exact to the bucket's bounds.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone

from gateway.choices import Outcome
from gateway.models import LedgerRollup

# Upper bounds of the latency buckets, in milliseconds: bucket i holds [LATENCY_MS[i-1],
# LATENCY_MS[i]); the last bucket everything from the last bound on (width_bucket's numbering).
LATENCY_MS = (10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000)
# Upper bounds of the time-to-CONFIRMED buckets, in seconds.
CONFIRM_SECONDS = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)
# Outcomes that count as a provider error.
ERROR_OUTCOMES = (Outcome.UNKNOWN.value, Outcome.NOT_STARTED.value)

# Recounted on every pass: a transaction that wrote an event stamped in these minutes may have
# committed after the previous pass read them.
REAGGREGATE = timedelta(minutes=10)
# Roll-up rows older than this are deleted (the week's view needs seven days).
RETENTION = timedelta(days=8)
# The advisory lock that puts concurrent passes in a row (two beat deliveries, or a pass and
# the benchmark's): the second pass reads after the first has committed, so a pass holding an
# older snapshot can never overwrite a newer count.
LOCK_KEY = 0x6C656467  # "ledg"


def _floor_minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def _floor_hour(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


# The minutes of [since, until), counted from the ledger and written over what was there.
_MINUTES = """
INSERT INTO gateway_ledgerrollup (tenant_id, series, width, start, key, bucket, count, errors)
SELECT tenant_id, 'status', 1, date_trunc('minute', created_at), to_status, 0, count(*), 0
  FROM gateway_effectevent
 WHERE created_at >= %(since)s AND created_at < %(until)s
   AND effect_id IS NOT NULL AND to_status <> ''
 GROUP BY 1, 4, 5
UNION ALL
SELECT c.tenant_id, 'attempt', 1, date_trunc('minute', a.finished_at), c.provider,
       width_bucket(extract(epoch FROM a.finished_at - a.started_at) * 1000, %(latency)s),
       count(*), count(*) FILTER (WHERE a.outcome = ANY(%(errors)s))
  FROM gateway_attempt a JOIN gateway_command c ON c.effect_id = a.effect_id
 WHERE a.finished_at >= %(since)s AND a.finished_at < %(until)s
 GROUP BY 1, 4, 5, 6
UNION ALL
SELECT c.tenant_id, 'confirm', 1, date_trunc('minute', e.created_at), c.provider,
       width_bucket(extract(epoch FROM e.created_at - f.created_at), %(confirm)s),
       count(*), 0
  FROM gateway_effectevent e
  JOIN gateway_effect f ON f.effect_id = e.effect_id
  JOIN gateway_command c ON c.effect_id = e.effect_id
 WHERE e.created_at >= %(since)s AND e.created_at < %(until)s AND e.to_status = 'CONFIRMED'
 GROUP BY 1, 4, 5, 6
ON CONFLICT (tenant_id, series, width, start, key, bucket)
DO UPDATE SET count = EXCLUDED.count, errors = EXCLUDED.errors
"""

# The hours that hold [since, until), summed from their minutes (which the statement above has
# just brought up to date) and written over what was there.
_HOURS = """
INSERT INTO gateway_ledgerrollup (tenant_id, series, width, start, key, bucket, count, errors)
SELECT tenant_id, series, 60, date_trunc('hour', start), key, bucket, sum(count), sum(errors)
  FROM gateway_ledgerrollup
 WHERE width = 1 AND start >= %(since)s AND start < %(until)s
 GROUP BY tenant_id, series, date_trunc('hour', start), key, bucket
ON CONFLICT (tenant_id, series, width, start, key, bucket)
DO UPDATE SET count = EXCLUDED.count, errors = EXCLUDED.errors
"""


@transaction.atomic
def rollup_span(*, since: datetime, until: datetime) -> int:
    """Recount the minutes of [since, until) (widened to whole minutes) and the hours that
    hold them. Returns the minute rows written. Safe to run twice, and concurrently."""
    since, until = _floor_minute(since), _floor_minute(until) + timedelta(minutes=1)
    with connection.cursor() as cursor:
        # Concurrent passes (a redelivered beat message, a slow pass overtaken by the next)
        # wait here for each other: see LOCK_KEY.
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [LOCK_KEY])
        cursor.execute(
            _MINUTES,
            {
                "since": since,
                "until": until,
                "latency": list(map(float, LATENCY_MS)),
                "confirm": list(map(float, CONFIRM_SECONDS)),
                "errors": list(ERROR_OUTCOMES),
            },
        )
        written = cursor.rowcount
        hours = {"since": _floor_hour(since), "until": _floor_hour(until - timedelta(minutes=1))}
        hours["until"] += timedelta(hours=1)
        cursor.execute(_HOURS, hours)
    return written


def rollup_recent(*, now: datetime | None = None) -> int:
    """The periodic pass: from a few minutes before the newest minute counted (or the start of
    the retention window, on a ledger never counted) up to now; then old rows dropped."""
    now = now or timezone.now()
    newest = (
        LedgerRollup.objects.filter(width=1)
        .order_by("-start")
        .values_list("start", flat=True)
        .first()
    )
    since = max(newest - REAGGREGATE, now - RETENTION) if newest else now - RETENTION
    written = rollup_span(since=since, until=now)
    LedgerRollup.objects.filter(start__lt=now - RETENTION).delete()
    return written
