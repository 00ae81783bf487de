""" "Look up all N now" as a background job: the click writes the job and answers with its
card, a worker (here the real task, run eagerly after commit) looks each effect up with the
single "Look up now" service, chunk by chunk; the summary says what happened in plain words;
a cancel stops it between chunks; a redelivered job resumes without looking anything up twice.

The sandbox provider's log is the oracle: one lookup per effect, none at the click.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import timedelta

from django.utils import timezone

from gateway.models import Effect
from reconciliation import jobs
from reconciliation.models import BulkJob
from tests.console.conftest import captured_at_provider, escalated_unknown

GROUP = {"provider": "billing", "type": "billing.refund.create", "cause": "escalated"}


def _outage(bot, sandbox, count: int, *, captured: int | None = None) -> list[Effect]:
    """``count`` effects escalated in an outage; the first ``captured`` of them (all by
    default) were made at the provider, whose answer was lost."""
    effects = [
        escalated_unknown(bot.principal, resource={"type": "order", "id": f"ord_{n}"})
        for n in range(count)
    ]
    for effect in effects[: count if captured is None else captured]:
        captured_at_provider(sandbox, effect)
    return effects


def _lookups(sandbox) -> Counter:
    """Lookups the provider answered, per idempotency key."""
    return Counter(
        op["idempotency_key"] for op in sandbox.log() if op["action"].startswith("lookup")
    )


def _start(oscar, count: int, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        started = time.monotonic()
        response = oscar.htmx("post", "/triage/bulk/reconcile", {**GROUP, "expected": count})
        elapsed = time.monotonic() - started
    assert response.status_code == 200, response.content
    return response, elapsed, callbacks


def test_the_click_answers_with_a_job_and_the_worker_looks_each_effect_up_once(
    oscar, bot, sandbox, eager_tasks, django_capture_on_commit_callbacks
):
    effects = _outage(bot, sandbox, 30)
    before = _lookups(sandbox)
    response, elapsed, callbacks = _start(oscar, 30, django_capture_on_commit_callbacks)
    body = response.content.decode()
    # The answer: the job's card (out of band), polled every 2 s; the provider not yet asked.
    assert _lookups(sandbox) == before
    assert elapsed < 1.0, elapsed
    job = BulkJob.objects.get()
    assert (job.state, job.total, job.done, job.started_by) == ("queued", 30, 0, oscar.principal)
    assert 'id="bulk-jobs"' in body and 'hx-swap-oob="outerHTML"' in body
    assert 'hx-trigger="every 2s"' in body
    assert "0 / 30" in body
    assert "Looking up 30 effects at billing in the background" in body
    # After commit the task runs (eagerly here: the real task and services, minus a broker).
    for callback in callbacks:
        callback()
    job.refresh_from_db()
    assert (job.state, job.done) == ("done", 30)
    keys = [e.command.provider_key for e in effects]
    assert _lookups(sandbox) - before == Counter(dict.fromkeys(keys, 1))
    assert Effect.objects.filter(pk__in=[e.pk for e in effects], status="CONFIRMED").count() == 30
    assert jobs.bulk_job_summary(job) == (
        "30 settled: 30 confirmed by lookup, 0 already settled by the reconciler, 0 still unknown."
    )
    # The jobs section's poll: the summary, who started it, and no more polling once done.
    html = oscar.htmx("get", "/triage/jobs").content.decode()
    assert "30 / 30" in html and "started by <strong>oscar</strong>" in html
    assert "30 settled: 30 confirmed by lookup" in html
    assert "every 2s" not in html
    token = html.split("since=")[1].split('"')[0] if "since=" in html else None
    assert token is None  # nothing polls a finished job
    page = oscar.client.get("/").content.decode()
    assert "Bulk jobs" in page and "30 settled" in page
    # Its own page too (the list without the queue).
    page = oscar.client.get("/triage/jobs").content.decode()
    assert "<h1>Bulk jobs</h1>" in page and "30 settled" in page


def test_the_summary_says_what_each_effect_came_to_in_plain_words(
    oscar, bot, sandbox, eager_tasks, django_capture_on_commit_callbacks
):
    # 4 made at the provider, 2 not: those are not found, and sent again with their key.
    effects = _outage(bot, sandbox, 6, captured=4)
    _, _, callbacks = _start(oscar, 6, django_capture_on_commit_callbacks)
    # One settled by the reconciler between the click and the worker.
    Effect.objects.filter(pk=effects[0].pk).update(status="CONFIRMED")
    for callback in callbacks:
        callback()
    job = BulkJob.objects.get()
    summary = jobs.bulk_job_summary(job)
    assert summary.startswith("4 of 6 settled: 3 confirmed by lookup, "), summary
    assert "1 already settled by the reconciler" in summary
    assert "2 never reached the provider: sent again with the same key" in summary
    assert "0 still unknown" in summary
    for jargon in ("superseded", "refused", "left for the reconciler", "not_started"):
        assert jargon not in summary


def test_a_cancel_stops_the_job_between_chunks(oscar, bot, sandbox, eager_tasks):
    _outage(bot, sandbox, 12)
    before = _lookups(sandbox)
    oscar.htmx("post", "/triage/bulk/reconcile", {**GROUP, "expected": 12})
    job = BulkJob.objects.get()
    # A worker that has done one chunk of 5 (and stops there, as a slow one would be).
    assert jobs.bulk_job_run(job_id=job.pk, chunk=5, max_chunks=1) == 5
    # The card's poll shows the progress, and keeps polling while the job runs.
    card = oscar.htmx("get", "/triage/jobs").content.decode()
    assert "5 / 12" in card and "Running" in card and 'hx-trigger="every 2s"' in card
    assert "5 of 12 looked up so far: 5 confirmed by lookup" in card
    response = oscar.htmx("post", f"/triage/jobs/{job.pk}/cancel")
    assert response.status_code == 200
    assert "Cancelled after 5 of 12" in response.content.decode()
    # The worker (or a redelivery) looks at the job before its next chunk: nothing more.
    assert jobs.bulk_job_run(job_id=job.pk, chunk=5) == 0
    job.refresh_from_db()
    assert (job.state, job.done, job.cancelled_by) == ("cancelled", 5, oscar.principal)
    assert sum((_lookups(sandbox) - before).values()) == 5
    # A second cancel says it is over already.
    again = oscar.htmx("post", f"/triage/jobs/{job.pk}/cancel")
    assert again.status_code == 409
    assert "cancelled already" in again.content.decode()


def test_a_redelivered_job_resumes_and_looks_no_effect_up_twice(oscar, bot, sandbox):
    effects = _outage(bot, sandbox, 12)
    before = _lookups(sandbox)
    oscar.htmx("post", "/triage/bulk/reconcile", {**GROUP, "expected": 12})
    job = BulkJob.objects.get()
    jobs.bulk_job_run(job_id=job.pk, chunk=5, max_chunks=1)
    # The worker died; its message is redelivered at once: the job is held (fresh heartbeat).
    assert jobs.bulk_job_run(job_id=job.pk, chunk=5) == 0
    # Later (the sweep, or a redelivery after the lease went stale) another worker resumes.
    BulkJob.objects.filter(pk=job.pk).update(
        heartbeat_at=timezone.now() - jobs._stale_after() - timedelta(seconds=1)
    )
    sent: list[int] = []
    import reconciliation.jobs as module

    original, module.enqueue_job = module.enqueue_job, sent.append
    try:
        assert jobs.bulk_jobs_resume() == 1
    finally:
        module.enqueue_job = original
    assert sent == [job.pk]
    assert jobs.bulk_job_run(job_id=job.pk, chunk=5) == 7
    job.refresh_from_db()
    assert (job.state, job.done) == ("done", 12)
    keys = [e.command.provider_key for e in effects]
    assert _lookups(sandbox) - before == Counter(dict.fromkeys(keys, 1))


def test_a_freeze_asks_for_a_reason_and_a_confirmation(oscar, bot, sandbox):
    _outage(bot, sandbox, 2, captured=0)
    html = oscar.client.get("/").content.decode()
    group = html[html.index('data-group="billing/billing.refund.create/escalated"') :]
    group = group[: group.index("</li>")]
    # The safe action first and primary; each freeze quiet, with a reason and one prompt.
    assert group.index("Look up all 2 now") < group.index("Freeze billing.refund.create")
    assert 'class="btn btn-primary">Look up all 2 now' in group
    assert group.count('hx-confirm="Freeze ') == 2
    assert group.count('name="reason" required') == 2
    assert "btn-attention" not in group
    refused = oscar.htmx("post", "/triage/bulk/freeze-type", {**GROUP, "expected": 2})
    assert refused.status_code == 400
    assert "Say why" in refused.content.decode()
    done = oscar.htmx(
        "post", "/triage/bulk/freeze-type", {**GROUP, "expected": 2, "reason": "billing outage"}
    )
    assert done.status_code == 200
    from gateway.models import EffectTypeFreeze

    freeze = EffectTypeFreeze.objects.get(type="billing.refund.create")
    assert "billing outage" in str(freeze.reason)


def test_only_operators_start_or_cancel_jobs(alice, oscar, bot, sandbox):
    _outage(bot, sandbox, 2)
    response = alice.htmx("post", "/triage/bulk/reconcile", {**GROUP, "expected": 2})
    assert response.status_code in (403, 409)
    assert not BulkJob.objects.exists()
    oscar.htmx("post", "/triage/bulk/reconcile", {**GROUP, "expected": 2})
    job = BulkJob.objects.get()
    assert alice.htmx("post", f"/triage/jobs/{job.pk}/cancel").status_code in (403, 409)
    assert BulkJob.objects.get().state == "queued"


def test_a_chunk_under_way_when_the_job_is_cancelled_is_counted(oscar, bot, sandbox):
    _outage(bot, sandbox, 8)
    oscar.htmx("post", "/triage/bulk/reconcile", {**GROUP, "expected": 8})
    job = BulkJob.objects.get()
    real = jobs.JOB_ACTIONS["lookup"]

    def cancelled_meanwhile(job, ids, principal):
        results = real[1](job, ids, principal)
        jobs.bulk_job_cancel(job_id=job.pk, principal=oscar.principal)
        return results

    jobs.JOB_ACTIONS["lookup"] = (real[0], cancelled_meanwhile)
    try:
        assert jobs.bulk_job_run(job_id=job.pk, chunk=3) == 3
    finally:
        jobs.JOB_ACTIONS["lookup"] = real
    job.refresh_from_db()
    assert (job.state, job.done) == ("cancelled", 3)
    assert jobs.bulk_job_summary(job).startswith("Cancelled after 3 of 8; 3 of 8 settled")
