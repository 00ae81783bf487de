"""Included at ``hooks/claude-code/`` by gateway.urls."""

from django.urls import path

from gateway.agent_hooks import views

app_name = "agent_hooks"

urlpatterns = [
    path("pre-tool-use", views.pre_tool_use, name="pre-tool-use"),
    path("permission-request", views.permission_request, name="permission-request"),
    path("post-tool-use", views.post_tool_use, name="post-tool-use"),
]
