from typing import Any

from django.conf import settings
from django.contrib import admin
from django.urls import include, path
from django.utils.csp import CSP
from django.views.decorators.csp import csp_override
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from gateway import health
from gateway.api_root import api_root
from gateway.console import urls as console_urls
from gateway.metrics_access import metrics_guard
from reconciliation import urls as reconciliation_urls
from sagas import urls as sagas_urls

SECURE_CSP: dict[str, Any] = settings.SECURE_CSP

# The console: each app's pages, composed under one namespace so that every
# ``{% url 'console:…' %}`` names a page whichever app serves it.
console = [
    *console_urls.urlpatterns,
    *reconciliation_urls.console_urlpatterns,
    *sagas_urls.console_urlpatterns,
]

urlpatterns = [
    path("api/", api_root, name="api-root"),
    path("api/v1/", api_root, name="api-root-v1"),
    path("api/v1/", include("gateway.api.urls")),
    path("api/v1/", include("gateway.webhooks.api.urls")),
    path("hooks/claude-code/", include("gateway.agent_hooks.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path(
        "api/docs/",
        # Swagger UI's script is served as a file (split view); it styles elements inline.
        csp_override({**SECURE_CSP, "style-src": [CSP.SELF, CSP.UNSAFE_INLINE]})(
            SpectacularSwaggerSplitView.as_view(url_name="schema")
        ),
        name="api-docs",
    ),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics_guard(health.metrics), name="metrics"),
    path("admin/", admin.site.urls),
    path("", include(reconciliation_urls)),
    path("", include((console, "console"))),
]

handler404 = "gateway.health.handler404"
handler500 = "gateway.health.handler500"
