"""Routes outside the agents' API: providers' webhooks and the Prometheus scrape."""

from django.urls import path

from reconciliation import views

urlpatterns = [
    path("hooks/providers/<str:name>", views.provider_webhook, name="provider-webhook"),
]
