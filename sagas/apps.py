from django.apps import AppConfig


class SagasConfig(AppConfig):
    """Orchestrated multi-step flows whose compensations are new commands."""

    name = "sagas"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from gateway import hooks
        from gateway.console import extensions
        from sagas import listeners, views

        # What the ledger tells sagas (see sagas.listeners).
        hooks.after_transition.register(listeners.advance_after_transition)
        hooks.dispatch_holds.register(listeners.FROZEN_SAGA)
        hooks.mismatch_found.register(listeners.freeze_on_mismatch)

        # What sagas add to the ledger's console pages: the runs stopped for a human above
        # the triage queue, and the run an effect is a step of on its page.
        extensions.add_triage_panel(views.triage_panel)
        extensions.add_effect_panel(views.effect_panel)
        # The console's search box finds runs by id.
        extensions.add_search(views.search_hits)
        # The approvals inbox says when approving a step would not dispatch it (frozen run).
        extensions.add_dispatch_blocker(views.dispatch_blockers)
