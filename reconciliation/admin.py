"""Admin: evidence is read-only (records and deliveries are never edited); cases are acted on
through the API and the console, so that every change goes through a service."""

from django.contrib import admin

from reconciliation.models import Case, OrphanReceipt, ReconciliationRecord, WebhookDelivery


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(ReconciliationRecord)
class ReconciliationRecordAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "effect", "kind", "lookup_status", "outcome", "actor")
    list_filter = ("kind", "outcome", "lookup_status")
    search_fields = ("effect__command__effect_id", "provider_operation_id")


@admin.register(Case)
class CaseAdmin(ReadOnlyAdmin):
    list_display = ("id", "opened_at", "tenant", "owner", "reason", "state", "effect")
    list_filter = ("state", "reason", "owner")
    search_fields = ("id", "effect__command__effect_id")


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    list_display = ("received_at", "provider", "event_id", "outcome", "effect")
    list_filter = ("provider", "outcome")
    search_fields = ("event_id", "provider_operation_id", "idempotency_key")


@admin.register(OrphanReceipt)
class OrphanReceiptAdmin(ReadOnlyAdmin):
    list_display = ("received_at", "provider", "provider_operation_id", "tenant", "state")
    list_filter = ("provider", "state")
    search_fields = ("provider_operation_id", "idempotency_key")
