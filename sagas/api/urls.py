from django.urls import path
from rest_framework.routers import SimpleRouter

from sagas.api import views

router = SimpleRouter(trailing_slash=False)
router.register("sagas", views.SagaViewSet, basename="saga")
router.register("saga-tasks", views.SagaTaskViewSet, basename="saga-task")

urlpatterns = [
    path("saga-definitions", views.SagaDefinitionsView.as_view(), name="saga-definitions"),
    *router.urls,
]
