"""Admin: runs, steps, tasks and events are read-only here; every change goes through a service
(the API and the console), so that it is locked, checked and recorded."""

from django.contrib import admin

from sagas.models import SagaEvent, SagaRun, SagaStep, SagaTask


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class SagaStepInline(admin.TabularInline):
    model = SagaStep
    fields = ("index", "name", "revision", "effect", "failure_trigger", "compensation")
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ("index", "revision")

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(SagaRun)
class SagaRunAdmin(ReadOnlyAdmin):
    list_display = ("id", "created_at", "tenant", "definition", "state", "frozen", "current_step")
    list_filter = ("state", "frozen", "definition")
    search_fields = ("id", "idempotency_key")
    exclude = ("inputs_sealed",)
    inlines = [SagaStepInline]


@admin.register(SagaTask)
class SagaTaskAdmin(ReadOnlyAdmin):
    list_display = ("id", "created_at", "tenant", "kind", "owner", "state", "run")
    list_filter = ("state", "kind", "owner")
    search_fields = ("id", "run__id")


@admin.register(SagaEvent)
class SagaEventAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "run", "kind", "from_state", "to_state", "step", "actor")
    list_filter = ("kind",)
    search_fields = ("run__id",)
