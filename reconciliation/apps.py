from django.apps import AppConfig


class ReconciliationConfig(AppConfig):
    """Query-first recovery of uncertain effects, and the human queue."""

    name = "reconciliation"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from gateway import hooks
        from gateway.console import extensions
        from gateway.providers import health
        from reconciliation import claims, job_views, selectors, views, waker  # noqa: F401  (waker: its Celery receivers)
        from reconciliation.metrics import register_collector

        register_collector()
        # The waker hears of a command that starts waiting for an approver, so that it expires
        # at its deadline (reconciliation.services.expiry).
        from reconciliation.services import expiry

        hooks.effect_created.register(expiry.announce_on_creation)
        hooks.after_transition.register(expiry.announce_on_transition)
        # What the human queue adds to the ledger's effect page: the open case and the
        # reconciliation records, and the reconcile / resolve / take-the-case buttons.
        extensions.add_effect_panel(views.effect_panel)
        for name, action in views.EFFECT_ACTIONS.items():
            extensions.add_effect_action(name, action)
        # Who is on it (take / release), closing a case of a settled effect, recording the
        # manual fix of a failed compensation.
        extensions.add_effect_panel(views.effect_holder_panel)
        for name, action in views.CLAIM_ACTIONS.items():
            extensions.add_effect_action(name, action)
        # The triage queue: effects with an open case need a human too, a failed compensation
        # fixed by hand no longer does; who holds each row; the group actions.
        extensions.add_triage_predicates(include=views.has_open_case, exclude=views.failure_fixed)
        extensions.add_triage_holders(claims.holders)
        for name, bulk_action in views.BULK_ACTIONS.items():
            extensions.add_bulk_action(name, bulk_action)
        # The bulk jobs those actions started, above the queue.
        extensions.add_triage_panel(job_views.jobs_panel)
        # The human queue as a download (CSV, JSON Lines).
        from reconciliation.exports import CASES_EXPORT

        extensions.add_export("cases", CASES_EXPORT)
        # Provider health counts the reconciler's lookups beside the attempts.
        health.add_lookup_source(selectors.lookup_tallies)
