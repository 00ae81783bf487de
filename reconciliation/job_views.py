"""The bulk jobs in the console: "Look up all N now" starts a job and answers with its card;
the triage page lists the tenant's recent jobs (who started them, progress, the summary in
words), polled every 2 seconds while one is running; a running job can be cancelled."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django import forms
from django.http import HttpResponse
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from gateway.choices import OPERATOR_ROLES
from gateway.console.base import (
    ConsoleRequest,
    console_view,
    perform,
    poll_token,
    render_polled,
    role_may,
)
from gateway.console.extensions import Panel
from gateway.models import Principal
from reconciliation import jobs
from reconciliation.choices import BULK_JOB_ACTIVE
from reconciliation.models import BulkJob

FRAGMENT = "reconciliation/partials/bulk_jobs.html"


@dataclass(frozen=True)
class JobCard:
    """One job as the console shows it."""

    job: BulkJob
    progress: str
    percent: int
    summary: str
    active: bool
    cancellable: bool


def _card(job: BulkJob, principal: Principal) -> JobCard:
    active = job.state in BULK_JOB_ACTIVE
    return JobCard(
        job=job,
        progress=f"{job.done} / {job.total}",
        percent=round(100 * job.done / job.total) if job.total else 100,
        summary=jobs.bulk_job_summary(job),
        active=active,
        cancellable=active and role_may(principal, OPERATOR_ROLES),
    )


def jobs_context(principal: Principal) -> dict[str, Any]:
    cards = [_card(job, principal) for job in jobs.bulk_jobs_recent(principal=principal)]
    token = poll_token([(c.job.pk, c.job.state, c.job.done) for c in cards])
    return {
        "bulk_jobs": cards,
        "bulk_jobs_active": any(c.active for c in cards),
        "bulk_jobs_token": token,
        "token": token,
    }


def jobs_panel(principal: Principal) -> Panel:
    """For the triage page: the jobs section (it polls itself; not part of the queue's token)."""
    context = jobs_context(principal)
    return Panel(context={k: v for k, v in context.items() if k != "token"})


def jobs_oob(request: ConsoleRequest) -> str:
    """The jobs section, swapped out of band after a job was started or cancelled."""
    context = jobs_context(request.principal) | {"oob": True}
    return render_to_string(FRAGMENT, context, request=request)


def start_lookup(request: ConsoleRequest, ids: list[str], group: Any) -> str:
    """ "Look up all N now": a job, answered at once; the worker asks the provider."""
    job = jobs.bulk_job_start(
        principal=request.principal,
        action="lookup",
        effect_ids=ids,
        group=f"{group.type} at {group.provider}, {group.cause_label}",
    )
    return (
        f"Looking up {job.total} effect{'s' if job.total != 1 else ''} at {group.provider} "
        "in the background: the job's progress is shown under Bulk jobs."
    )


@require_GET
@console_view
def bulk_jobs(request: ConsoleRequest) -> HttpResponse:
    """GET ``/triage/jobs``: the recent jobs (the section's poll: 204 while unchanged)."""
    context = jobs_context(request.principal)
    return render_polled(request, "reconciliation/bulk_jobs.html", "jobs", context)


class CancelForm(forms.Form):
    pass


@require_POST
@console_view
def bulk_job_cancel(request: ConsoleRequest, job_id: int) -> HttpResponse:
    """POST ``/triage/jobs/<id>/cancel``: the job stops between two chunks."""

    def run(data: dict[str, Any]) -> str:
        job = jobs.bulk_job_cancel(job_id=job_id, principal=request.principal)
        return f"Cancelled: {job.done} of {job.total} were handled and stay so."

    def answer() -> str:
        context = jobs_context(request.principal)
        return render_to_string(FRAGMENT, context, request=request)

    return perform(
        request,
        form=CancelForm(request.POST),
        run=run,
        back=reverse("console:triage"),
        answer=answer,
    )
