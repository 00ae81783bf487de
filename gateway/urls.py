from typing import Any

from django.conf import settings
from django.contrib import admin
from django.urls import include, path
from django.utils.csp import CSP
from django.views.decorators.csp import csp_override
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from oauth2_provider import views as oauth_views

from gateway import health
from gateway.api_root import api_root
from gateway.console import oauth as console_oauth
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

# The OAuth 2.1 authorization server of remote MCP clients (gateway.oauth): django-oauth-toolkit's
# endpoints under its own namespace (its metadata view reverses them), the authorize page the
# console's. Its application-management and introspection views are not served.
oauth_endpoints = [
    path(
        ".well-known/oauth-authorization-server",
        oauth_views.OAuthServerMetadataView.as_view(),
        name="oauth-server-metadata",
    ),
    path("oauth/authorize/", console_oauth.authorize, name="authorize"),
    path("oauth/token/", oauth_views.TokenView.as_view(), name="token"),
    path("oauth/revoke/", oauth_views.RevokeTokenView.as_view(), name="revoke-token"),
    path(
        "oauth/register/",
        oauth_views.DynamicClientRegistrationView.as_view(),
        name="dcr-register",
    ),
    # RFC 7592: a client reads, updates or deletes its own registration with the
    # registration access token it was given.
    path(
        "oauth/register/<str:client_id>/",
        oauth_views.DynamicClientRegistrationManagementView.as_view(),
        name="dcr-register-management",
    ),
]

urlpatterns = [
    path("", include((oauth_endpoints, "oauth2_provider"))),
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
