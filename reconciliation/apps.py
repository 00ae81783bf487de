from django.apps import AppConfig


class ReconciliationConfig(AppConfig):
    """Query-first recovery of uncertain effects, and the human queue."""

    name = "reconciliation"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from reconciliation.metrics import register_collector

        register_collector()
