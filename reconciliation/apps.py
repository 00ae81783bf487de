from django.apps import AppConfig


class ReconciliationConfig(AppConfig):
    """Query-first recovery of uncertain effects, and the human queue."""

    name = "reconciliation"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from gateway.console import extensions
        from reconciliation import views
        from reconciliation.metrics import register_collector

        register_collector()
        # What the human queue adds to the ledger's effect page: the open case and the
        # reconciliation records, and the reconcile / resolve / take-the-case buttons.
        extensions.add_effect_panel(views.effect_panel)
        for name, action in views.EFFECT_ACTIONS.items():
            extensions.add_effect_action(name, action)
