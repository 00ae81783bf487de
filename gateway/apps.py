from django.apps import AppConfig


class GatewayConfig(AppConfig):
    """The effect ledger: tenants, principals, commands, attempts, receipts, events."""

    name = "gateway"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Make our Celery app the current one in every process that loads Django (web nodes
        # send tasks with shared_task.delay, which uses the current app's broker).
        from gateway import checks, lockout  # noqa: F401  (login counters, deploy checks)
        from gateway.celery import app  # noqa: F401
