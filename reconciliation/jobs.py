"""Bulk actions as background jobs: the console's click writes a ``BulkJob`` row and answers;
a worker works it chunk by chunk with the service a single effect gets.

- ``bulk_job_start``: the row (the group's ids, frozen at the click) and, after commit, the
  task ``reconciliation.tasks.run_bulk_job``.
- ``bulk_job_run``: takes the job's lease (a queued job, or a running one whose worker stopped
  beating), then per chunk: the per-effect service on each effect not handled yet, the
  results saved (compare-and-set on the lease), a look at whether it was cancelled.
  A redelivered message resumes from the saved results; an effect in them is never handled
  again. An effect of a chunk cut short by a dying worker is handled again, and the per-effect
  service makes that harmless (a settled effect is not looked up: it is "already settled").
- ``bulk_job_cancel``: stops it between two chunks.
- ``bulk_jobs_resume``: the beat's sweep, re-sending the jobs no worker is on.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import timedelta
from functools import partial

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from gateway import ledger
from gateway.choices import OPERATOR_ROLES
from gateway.errors import GatewayError, InvalidTransition, NotFound, ValidationProblem
from gateway.models import Principal
from reconciliation import bulk, services
from reconciliation.choices import BULK_JOB_ACTIVE, BulkJobState, RecordOutcome
from reconciliation.models import BulkJob

logger = logging.getLogger(__name__)

# Effects handled between two saves of the progress (and two looks at a cancel).
CHUNK = 25
# A running job whose worker has not saved progress for this long is taken over (and never
# sooner than a chunk of lookups that each take the provider's whole timeout: _stale_after).
STALE_AFTER = timedelta(minutes=2)
# A queued job no worker has taken for this long is sent again by the sweep.
QUEUED_RESEND_AFTER = timedelta(seconds=30)

# Outcomes of one effect, as an on-call engineer reads them.
ALREADY_SETTLED = "already_settled"
STILL_UNKNOWN = "still_unknown"
OUTCOME_WORDS = {
    RecordOutcome.CONFIRMED: "confirmed by lookup",
    RecordOutcome.REJECTED: "failed at the provider (found by lookup)",
    ALREADY_SETTLED: "already settled by the reconciler",
    RecordOutcome.NOT_STARTED: "never reached the provider: sent again with the same key",
    RecordOutcome.IN_PROGRESS: "still in progress at the provider",
    RecordOutcome.MISMATCH: "receipt disagrees with the command: needs a human",
    STILL_UNKNOWN: "still unknown",
    "gone": "no longer in this tenant",
    "error": "could not be looked up (error in the log)",
}
SETTLED = (RecordOutcome.CONFIRMED, RecordOutcome.REJECTED, ALREADY_SETTLED)
# Said even when zero: what an engineer looks for first.
ALWAYS_SAID = (RecordOutcome.CONFIRMED, ALREADY_SETTLED, STILL_UNKNOWN)


def _lookup_outcome(effect_id: str, principal: Principal) -> str:
    """One effect of a "look up all" job: the console's "Look up now" on it."""
    try:
        record = services.effect_reconcile(
            effect_id=effect_id, actor=principal.label, principal=principal
        )
    except NotFound:
        return "gone"
    except InvalidTransition:
        # Settled since the click (the reconciler, a webhook, a person): nothing to look up.
        return ALREADY_SETTLED
    if record is None or record.outcome == RecordOutcome.SUPERSEDED:
        return ALREADY_SETTLED
    if record.outcome in (RecordOutcome.INCONCLUSIVE, RecordOutcome.ESCALATED):
        return STILL_UNKNOWN
    return str(record.outcome)


def _lookup_chunk(job: BulkJob, ids: list[str], principal: Principal) -> dict[str, str]:
    # Escalated effects get a fresh budget first, as the single "Look up now" gives them.
    bulk.effects_rearm(
        effect_ids=ids,
        actor=principal.label,
        principal=principal,
        reason=f"re-armed by the bulk job {job.pk}, to be looked up now",
    )
    results: dict[str, str] = {}
    for effect_id in ids:
        try:
            results[effect_id] = _lookup_outcome(effect_id, principal)
        except GatewayError:
            logger.exception("bulk lookup refused", extra={"effect_id": effect_id})
            results[effect_id] = "error"
    return results


# action -> (what the console calls it, how one chunk is worked)
JOB_ACTIONS: dict[str, tuple[str, Callable[[BulkJob, list[str], Principal], dict[str, str]]]] = {
    "lookup": ("Look up", _lookup_chunk),
}


def enqueue_job(job_id: int) -> None:
    from reconciliation.tasks import run_bulk_job

    run_bulk_job.delay(job_id)


@transaction.atomic
def bulk_job_start(
    *, principal: Principal, action: str, effect_ids: list[str], group: str
) -> BulkJob:
    """Write the job (the ids as the engineer saw them) and have a worker work it."""
    ledger.require_role(principal, OPERATOR_ROLES, "act on groups")
    if action not in JOB_ACTIONS:
        raise ValidationProblem("No such bulk job.", errors={"action": [f"unknown: {action}"]})
    ids = list(dict.fromkeys(effect_ids))[: bulk.BULK_LIMIT]
    if not ids:
        raise ValidationProblem("Nothing to act on.", errors={"effect_ids": ["empty"]})
    job = BulkJob.objects.create(
        tenant_id=principal.tenant_id,
        started_by=principal,
        action=action,
        group=group[:300],
        effect_ids=ids,
        total=len(ids),
        created_at=timezone.now(),
    )
    transaction.on_commit(partial(enqueue_job, job.pk))
    return job


def bulk_job_cancel(*, job_id: int, principal: Principal) -> BulkJob:
    """Stop a job between two chunks: what it handled stays handled."""
    ledger.require_role(principal, OPERATOR_ROLES, "cancel bulk jobs")
    changed = BulkJob.objects.filter(
        pk=job_id, tenant_id=principal.tenant_id, state__in=sorted(BULK_JOB_ACTIVE)
    ).update(state=BulkJobState.CANCELLED, cancelled_by=principal, finished_at=timezone.now())
    job = BulkJob.objects.filter(pk=job_id, tenant_id=principal.tenant_id).first()
    if job is None:
        raise NotFound(f"No bulk job {job_id}.")
    if not changed:
        raise InvalidTransition(f"The job is {job.state} already: there is nothing to cancel.")
    return job


def _stale_after() -> timedelta:
    slowest_chunk = timedelta(seconds=CHUNK * float(settings.GATEWAY_PROVIDER_TIMEOUT))
    return max(STALE_AFTER, 2 * slowest_chunk)


def _take_lease(job_id: int, now) -> str | None:
    lease = uuid.uuid4().hex
    free = Q(state=BulkJobState.QUEUED) | Q(
        state=BulkJobState.RUNNING, heartbeat_at__lt=now - _stale_after()
    )
    taken = BulkJob.objects.filter(free, pk=job_id).update(
        state=BulkJobState.RUNNING, lease=lease, heartbeat_at=now
    )
    return lease if taken else None


def _finish(job: BulkJob, lease: str, state: str, error: str = "") -> None:
    BulkJob.objects.filter(pk=job.pk, lease=lease, state=BulkJobState.RUNNING).update(
        state=state, finished_at=timezone.now(), error=error
    )


def bulk_job_run(*, job_id: int, chunk: int = CHUNK, max_chunks: int | None = None) -> int:
    """Work a job until it is done, cancelled, or ``max_chunks`` chunks were worked (a
    worker that stops there leaves it running, as a dead one would). Returns how many
    effects this call handled; 0 when another worker holds the job or it is over."""
    lease = _take_lease(job_id, timezone.now())
    if lease is None:
        return 0
    job = BulkJob.objects.select_related("started_by__tenant").get(pk=job_id)
    label, work = JOB_ACTIONS[job.action]
    handled = chunks = 0
    try:
        while max_chunks is None or chunks < max_chunks:
            todo = [i for i in job.effect_ids if i not in job.results][:chunk]
            if not todo:
                _finish(job, lease, BulkJobState.DONE)
                break
            results = work(job, todo, job.started_by)
            job.results = {**job.results, **results}
            saved = BulkJob.objects.filter(
                pk=job.pk, lease=lease, state=BulkJobState.RUNNING
            ).update(results=job.results, heartbeat_at=timezone.now())
            handled += len(results)
            chunks += 1
            if not saved:
                # Cancelled (or taken over after a long stall): stop between chunks. What
                # this chunk did is kept on a cancelled job (its count says how far it got).
                BulkJob.objects.filter(pk=job.pk, lease=lease, state=BulkJobState.CANCELLED).update(
                    results=job.results
                )
                break
    except Exception as exc:
        logger.exception("bulk job failed", extra={"job_id": job_id})
        _finish(job, lease, BulkJobState.FAILED, error=f"{label}: {exc}"[:2000])
        raise
    return handled


def bulk_jobs_resume(*, now=None) -> int:
    """The beat: send again the jobs no worker is on (queued for a while, or running with a
    stale heartbeat). Returns how many were sent."""
    now = now or timezone.now()
    stale = Q(state=BulkJobState.QUEUED, created_at__lt=now - QUEUED_RESEND_AFTER) | Q(
        state=BulkJobState.RUNNING, heartbeat_at__lt=now - _stale_after()
    )
    ids = list(BulkJob.objects.filter(stale).values_list("pk", flat=True)[:100])
    for job_id in ids:
        enqueue_job(job_id)
    return len(ids)


def bulk_job_summary(job: BulkJob) -> str:
    """The job in words: "150 settled: 143 confirmed by lookup, 7 already settled by the
    reconciler, 0 still unknown"."""
    counts = job.outcomes()
    settled = sum(counts.get(o, 0) for o in SETTLED)
    said = [o for o in OUTCOME_WORDS if o in ALWAYS_SAID or counts.get(o)]
    parts = ", ".join(f"{counts.get(o, 0)} {OUTCOME_WORDS[o]}" for o in said)
    head = f"{settled} of {job.total} settled" if settled != job.total else f"{settled} settled"
    if job.state == BulkJobState.CANCELLED:
        head = f"Cancelled after {job.done} of {job.total}; {head}"
    elif job.state == BulkJobState.FAILED:
        head = f"Stopped by an error after {job.done} of {job.total}; {head}"
    elif job.state != BulkJobState.DONE:
        head = f"{job.done} of {job.total} looked up so far"
    return f"{head}: {parts}."


def bulk_jobs_recent(*, principal: Principal, limit: int = 5) -> list[BulkJob]:
    """The tenant's latest jobs, newest first (the console's list)."""
    return list(
        BulkJob.objects.filter(tenant_id=principal.tenant_id)
        .select_related("started_by", "cancelled_by")
        .order_by("-created_at", "-pk")[:limit]
    )
