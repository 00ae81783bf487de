from django.urls import path
from rest_framework.routers import SimpleRouter

from gateway.api import views

router = SimpleRouter(trailing_slash=False)
router.register("effects", views.EffectViewSet, basename="effect")

urlpatterns = [
    path("commands", views.CommandSubmitView.as_view(), name="command-submit"),
    path("effect-types", views.EffectTypesView.as_view(), name="effect-types"),
    *router.urls,
]
