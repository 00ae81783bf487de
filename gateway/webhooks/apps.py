from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    """Outgoing webhooks: signed notices of effect changes, from an outbox, at least once."""

    name = "gateway.webhooks"
    label = "webhooks"
    default_auto_field = "django.db.models.BigAutoField"
