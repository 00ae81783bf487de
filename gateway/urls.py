from django.conf import settings
from django.contrib import admin
from django.urls import include, path
from django.utils.csp import CSP
from django.views.decorators.csp import csp_override
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from gateway import health
from gateway.metrics_access import metrics_guard
from reconciliation import views as reconciliation_views

urlpatterns = [
    path("api/v1/", include("gateway.api.urls")),
    path("api/v1/", include("gateway.webhooks.api.urls")),
    path("hooks/claude-code/", include("gateway.agent_hooks.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path(
        "api/docs/",
        # Swagger UI's script is served as a file (split view); it styles elements inline.
        csp_override({**settings.SECURE_CSP, "style-src": [CSP.SELF, CSP.UNSAFE_INLINE]})(
            SpectacularSwaggerSplitView.as_view(url_name="schema")
        ),
        name="api-docs",
    ),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics_guard(reconciliation_views.metrics), name="metrics"),
    path("admin/", admin.site.urls),
    path("", include("reconciliation.urls")),
    path("", include("gateway.console_urls")),
]

handler404 = "gateway.health.handler404"
handler500 = "gateway.health.handler500"
