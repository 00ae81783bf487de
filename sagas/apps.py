from django.apps import AppConfig


class SagasConfig(AppConfig):
    """Orchestrated multi-step flows whose compensations are new commands."""

    name = "sagas"
    default_auto_field = "django.db.models.BigAutoField"
