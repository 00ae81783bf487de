"""Routes of reconciliation: providers' webhooks (``urlpatterns``, at the site root) and the
human queue (``console_urlpatterns``, composed under the ``console:`` namespace by
gateway.urls)."""

from django.urls import URLPattern, path

from reconciliation import job_views, views

urlpatterns: list[URLPattern] = [
    path("hooks/providers/<str:name>", views.provider_webhook, name="provider-webhook"),
]

console_urlpatterns: list[URLPattern] = [
    path("cases", views.cases, name="cases"),
    path("cases/<str:case_id>/<slug:action>", views.case_action, name="case-action"),
    path("triage/jobs", job_views.bulk_jobs, name="bulk-jobs"),
    path("triage/jobs/<int:job_id>/cancel", job_views.bulk_job_cancel, name="bulk-job-cancel"),
]
