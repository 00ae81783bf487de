from django.apps import AppConfig

from gateway.hooks import fast_path_idle


@fast_path_idle(
    "the record writes on its own only when no enabled endpoint of the tenant subscribes to "
    "the outcome's event (fastpath.ANNOUNCED); a claim's DISPATCHING announces nothing"
)
def announce_transition(effect, *, from_status: str, to: str) -> None:
    """``hooks.after_transition`` listener: the outbox rows of a status change commit (or roll
    back) with it."""
    from gateway.webhooks.services import outbox_record

    outbox_record(effect, to_status=to)


def announce_creation(effect) -> None:
    """``hooks.effect_created`` listener: a new effect that waits for approval is announced
    like a transition (the agent waits on that state)."""
    from gateway.choices import EffectStatus
    from gateway.webhooks.services import outbox_record

    if effect.status == EffectStatus.AWAITING_APPROVAL:
        outbox_record(effect, to_status=effect.status)


def record_waiter(effect, *, principal, context) -> None:
    """``hooks.command_replayed`` listener: a LangGraph thread that replayed another thread's
    command waits on its effect too, and is named in the effect's announcements."""
    from gateway.webhooks.services import waiter_record

    waiter_record(effect, principal=principal, context=context)


class WebhooksConfig(AppConfig):
    """Outgoing webhooks: signed notices of effect changes, from an outbox, at least once."""

    name = "gateway.webhooks"
    label = "webhooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from gateway import hooks

        hooks.after_transition.register(announce_transition)
        hooks.effect_created.register(announce_creation)
        hooks.command_replayed.register(record_waiter)
