"""The operator console's URLs (SPEC §7), included at the site root by gateway.urls."""

from django.urls import path

from gateway import views

app_name = "console"

urlpatterns = [
    path("", views.triage, name="triage"),
    path("login", views.login_view, name="login"),
    path("logout", views.logout_view, name="logout"),
    path("approvals", views.approvals, name="approvals"),
    path("effects/<str:effect_id>", views.effect_detail, name="effect"),
    path("effects/<str:effect_id>/<slug:action>", views.effect_action, name="effect-action"),
    # The human queue (reconciliation cases) and orphan receipts.
    path("cases", views.cases, name="cases"),
    path("cases/<str:case_id>/<slug:action>", views.case_action, name="case-action"),
    # Freezes and capabilities (operators and admins).
    path("controls", views.controls, name="controls"),
    path(
        "controls/types/<str:effect_type>/<slug:verb>",
        views.effect_type_freeze,
        name="type-freeze",
    ),
    path(
        "controls/principals/<str:name>/<slug:verb>",
        views.principal_freeze,
        name="principal-freeze",
    ),
    path("controls/capabilities", views.capability_grant, name="capability-grant"),
    path(
        "controls/capabilities/<str:capability_id>/revoke",
        views.capability_revoke,
        name="capability-revoke",
    ),
    # Sagas.
    path("sagas", views.saga_list, name="sagas"),
    path("sagas/<str:saga_id>", views.saga_detail, name="saga"),
    path(
        "sagas/<str:saga_id>/tasks/<str:task_id>/done",
        views.saga_task_done,
        name="saga-task-done",
    ),
    path("sagas/<str:saga_id>/<slug:action>", views.saga_action, name="saga-action"),
]
