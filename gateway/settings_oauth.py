"""Settings of the OAuth 2.1 authorization server remote MCP clients connect through
(django-oauth-toolkit, ``gateway.oauth``), star-imported by ``gateway.settings`` where its
section stands."""

from gateway.lib.env import env_int, env_list, env_section

__all__ = [
    "GATEWAY_OAUTH_ACCESS_TOKEN_TTL",
    "GATEWAY_OAUTH_REFRESH_TOKEN_TTL",
    "GATEWAY_OAUTH_RESOURCES",
    "OAUTH2_PROVIDER",
    "OAUTH2_PROVIDER_APPLICATION_MODEL",
]

env_section("Remote MCP clients (OAuth 2.1)")
GATEWAY_OAUTH_RESOURCES = env_list(
    "GATEWAY_OAUTH_RESOURCES",
    ["http://127.0.0.1:8808/mcp", "http://localhost:8808/mcp"],
    doc="The MCP endpoints (their public URLs, as `effect-gateway-mcp --resource-url` names "
    "them) this gateway issues OAuth access tokens for, comma-separated. A token is bound to "
    "one of them (RFC 8707 `resource`) and refused by every other.",
)
GATEWAY_OAUTH_ACCESS_TOKEN_TTL = env_int(
    "GATEWAY_OAUTH_ACCESS_TOKEN_TTL",
    3600,
    doc="Seconds an OAuth access token of a remote MCP client lives; the client refreshes it.",
)
GATEWAY_OAUTH_REFRESH_TOKEN_TTL = env_int(
    "GATEWAY_OAUTH_REFRESH_TOKEN_TTL",
    30 * 24 * 3600,
    doc="Seconds an OAuth refresh token lives (2592000: 30 days); each use replaces it.",
)
# django-oauth-toolkit (gateway.oauth): authorization code with PKCE S256 only, public clients
# registered dynamically, tokens stored as their SHA-256, refresh tokens rotated and a reused
# one refused (with its family).
# The toolkit's own application model (named here: gateway.models.OAuthConnection points at it).
OAUTH2_PROVIDER_APPLICATION_MODEL = "oauth2_provider.Application"
OAUTH2_PROVIDER = {
    "PKCE_REQUIRED": True,
    "COMPLIANT_BCP_RFC9700_PKCE_METHOD": True,
    "COMPLIANT_BCP_RFC9700_IMPLICIT_GRANT": True,
    "COMPLIANT_BCP_RFC9700_PASSWORD_GRANT": True,
    "COMPLIANT_BCP_RFC9700_TOKEN_STORAGE": True,
    "COMPLIANT_BCP_RFC9700_ACCESS_TOKEN_TRANSPORT": True,
    "SCOPES": {"mcp": "Use the Effect Gateway's MCP tools as the principal an admin approved"},
    "DEFAULT_SCOPES": ["mcp"],
    "ACCESS_TOKEN_EXPIRE_SECONDS": GATEWAY_OAUTH_ACCESS_TOKEN_TTL,
    "REFRESH_TOKEN_EXPIRE_SECONDS": GATEWAY_OAUTH_REFRESH_TOKEN_TTL,
    "ROTATE_REFRESH_TOKEN": True,
    "REFRESH_TOKEN_REUSE_PROTECTION": True,
    "REQUEST_APPROVAL_PROMPT": "force",
    "DCR_ENABLED": True,
    # Anyone may register a client: registering grants nothing until an admin approves it.
    "DCR_REGISTRATION_PERMISSION_CLASSES": ("oauth2_provider.dcr.AllowAllDCRPermission",),
    "OAUTH2_RESPONSE_TYPES_SUPPORTED": ["code"],
    "OAUTH2_GRANT_TYPES_SUPPORTED": ["authorization_code", "refresh_token"],
    "OAUTH2_TOKEN_ENDPOINT_AUTH_METHODS_SUPPORTED": [
        "none",
        "client_secret_post",
        "client_secret_basic",
    ],
}
