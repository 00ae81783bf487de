from django.apps import AppConfig


class GatewayConfig(AppConfig):
    """The effect ledger: tenants, principals, commands, attempts, receipts, events."""

    name = "gateway"
    default_auto_field = "django.db.models.BigAutoField"
