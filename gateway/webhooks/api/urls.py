"""Included under ``api/v1/`` by gateway.urls."""

from rest_framework.routers import SimpleRouter

from gateway.webhooks.api import views

router = SimpleRouter(trailing_slash=False)
router.register("webhook-endpoints", views.WebhookEndpointViewSet, basename="webhook-endpoint")

urlpatterns = router.urls
