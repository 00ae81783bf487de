"""Admin: endpoints are read here and changed through the API; messages are evidence."""

from django.contrib import admin

from gateway.webhooks.models import WebhookEndpoint, WebhookMessage


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    list_display = ("id", "tenant", "owner", "url", "enabled", "disabled_reason", "created_at")
    list_filter = ("enabled",)
    search_fields = ("id", "url")
    exclude = ("secret_sealed",)
    readonly_fields = (
        "id",
        "tenant",
        "owner",
        "created_by",
        "created_at",
        "updated_at",
        "deleted_at",
    )

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(WebhookMessage)
class WebhookMessageAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "event_type",
        "effect_id",
        "state",
        "attempts",
        "last_status",
        "next_attempt_at",
        "delivered_at",
    )
    list_filter = ("state", "event_type")
    search_fields = ("id", "effect_id")

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
