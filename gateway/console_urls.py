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
]
