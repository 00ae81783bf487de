from django.apps import AppConfig


class GatewayConfig(AppConfig):
    """The effect ledger: tenants, principals, commands, attempts, receipts, events."""

    name = "gateway"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Make our Celery app the current one in every process that loads Django (web nodes
        # send tasks with shared_task.delay, which uses the current app's broker).
        from gateway import capabilities, checks, hooks, lockout  # noqa: F401  (checks, lockout: receivers)
        from gateway.celery import app  # noqa: F401
        from gateway.tasks import dispatch_effect

        # The ledger hands effects to workers through this task; it cannot import it (the
        # tasks call the services, which sit above the ledger).
        hooks.dispatch_sender.bind(dispatch_effect.delay)
        # A never-sent command gives its capability budget back, with the transition.
        hooks.after_transition.register(capabilities.capability_release_unsent)
