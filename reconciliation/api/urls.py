from django.urls import path
from rest_framework.routers import SimpleRouter

from reconciliation.api import views

router = SimpleRouter(trailing_slash=False)
router.register("cases", views.CaseViewSet, basename="case")

urlpatterns = [
    path(
        "effects/<str:effect_id>/reconcile",
        views.EffectReconcileView.as_view(),
        name="effect-reconcile",
    ),
    path(
        "effects/<str:effect_id>/resolve", views.EffectResolveView.as_view(), name="effect-resolve"
    ),
    path(
        "effects/<str:effect_id>/reconciliations",
        views.EffectReconciliationsView.as_view(),
        name="effect-reconciliations",
    ),
    *router.urls,
]
