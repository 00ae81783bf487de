from django.apps import AppConfig


class AgentHooksConfig(AppConfig):
    """Claude Code hooks: raw calls to governed systems are sent to the gateway's tools."""

    name = "gateway.agent_hooks"
    label = "agent_hooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from gateway.agent_hooks import console
        from gateway.console import extensions

        extensions.add_effect_panel(console.effect_panel)
