from django.contrib import admin

from gateway.agent_hooks.models import GovernedPattern


@admin.register(GovernedPattern)
class GovernedPatternAdmin(admin.ModelAdmin):
    list_display = ("name", "tenant", "tools", "regex", "gateway_tool", "enabled")
    list_filter = ("enabled", "tenant")
    search_fields = ("name", "regex", "gateway_tool")
