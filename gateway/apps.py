from functools import partial

from django.apps import AppConfig
from django.core.signals import setting_changed


class GatewayConfig(AppConfig):
    """The effect ledger: tenants, principals, commands, attempts, receipts, events."""

    name = "gateway"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Make our Celery app the current one in every process that loads Django (web nodes
        # send tasks with shared_task.delay, which uses the current app's broker).
        from gateway import capabilities, checks, hooks, moves  # noqa: F401  (checks: receivers)
        from gateway.contracts import loading

        # Every contract module once per process, before any request or task reads them; a
        # module with a bad contract is left out, and its problems are check errors.
        loading.load_configured()
        setting_changed.connect(_reload_contracts)
        from gateway.celery import app  # noqa: F401
        from gateway.dispatcher import announce_due, drainers_at_work, wake_due
        from gateway.tasks import dispatch_due, dispatch_effect

        # The ledger hands effects to workers through these tasks; it cannot import them (the
        # tasks call the services, which sit above the ledger). One by one (sagas, approvals,
        # the sweeper's second look), as a coalesced "due" signal that a drainer answers
        # (submissions), or as a wake-up for one more drainer (the sweeper's first look).
        hooks.dispatch_sender.bind(dispatch_effect.delay)
        hooks.due_sender.bind(partial(announce_due, dispatch_due))
        hooks.wake_sender.bind(partial(wake_due, dispatch_due))
        hooks.drainers_at_work.bind(partial(drainers_at_work, dispatch_due))
        # A never-sent command gives its capability budget back, with the transition.
        hooks.after_transition.register(capabilities.capability_release_unsent)
        # The long polls waiting on an effect hear of its change after commit.
        hooks.after_transition.register(moves.after_transition)
        # /metrics: the providers' circuits, calls in flight and rate use.
        from gateway.metrics import register_collector

        register_collector()


def _reload_contracts(*, setting: str, **kwargs) -> None:
    """A test that overrides the contract modules (or the provider URLs the adapters are
    built with) gets them loaded and built again, as a process started with them would."""
    from gateway.contracts import loading
    from gateway.providers import registry

    if setting == "GATEWAY_CONTRACT_MODULES":
        loading.load_configured()
    elif setting in ("GATEWAY_PROVIDER_URLS", "GATEWAY_PROVIDER_TIMEOUT"):
        registry.forget_adapters()
