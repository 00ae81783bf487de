"""The ledger's console pages; ``gateway.urls`` composes them with the pages of reconciliation
and sagas under the ``console:`` namespace."""

from django.urls import URLPattern, path

from gateway.console import (
    approvals,
    audit_list,
    auth,
    bulk,
    controls,
    dashboard,
    effects,
    exports,
    oauth,
    passkeys,
    provider_credentials,
    providers,
    saved,
    search,
    triage,
)

urlpatterns: list[URLPattern] = [
    path("", triage.triage, name="triage"),
    path("triage/bulk/<slug:action>", bulk.triage_bulk, name="triage-bulk"),
    path("triage/badge", triage.triage_badge, name="triage-badge"),
    path("search", search.search, name="search"),
    path("dashboard", dashboard.dashboard, name="dashboard"),
    path("login", auth.login_view, name="login"),
    path("logout", auth.logout_view, name="logout"),
    path("approvals", approvals.approvals, name="approvals"),
    # Provider health, circuits, consoles and credentials (operators and admins).
    path("providers", providers.provider_list, name="providers"),
    # Passkeys: registered by approvers, confirmed by another approver or an admin.
    path("passkeys", passkeys.passkeys, name="passkeys"),
    path("passkeys/options", passkeys.passkey_options, name="passkey-options"),
    path("passkeys/register", passkeys.passkey_register, name="passkey-register"),
    path("passkeys/<int:key_id>/confirm", passkeys.passkey_confirm, name="passkey-confirm"),
    path("passkeys/<int:key_id>/revoke", passkeys.passkey_revoke, name="passkey-revoke"),
    path(
        "effects/<str:effect_id>/approval-challenge",
        passkeys.approval_challenge,
        name="approval-challenge",
    ),
    path("effects/<str:effect_id>", effects.effect_detail, name="effect"),
    path("effects/<str:effect_id>/<slug:action>", effects.effect_action, name="effect-action"),
    # Freezes and capabilities (operators and admins).
    path("controls", controls.controls, name="controls"),
    path(
        "controls/types/<str:effect_type>/<slug:verb>",
        controls.effect_type_freeze,
        name="type-freeze",
    ),
    path(
        "controls/principals/<str:name>/<slug:verb>",
        controls.principal_freeze,
        name="principal-freeze",
    ),
    path("controls/capabilities", controls.capability_grant, name="capability-grant"),
    path(
        "controls/capabilities/<str:capability_id>/revoke",
        controls.capability_revoke,
        name="capability-revoke",
    ),
    path("controls/tokens/<int:token_id>/revoke", controls.token_revoke, name="token-revoke"),
    path("controls/tokens/<int:token_id>/rotate", controls.token_rotate, name="token-rotate"),
    # A tenant's own provider credentials (operators see them, admins change them).
    path(
        "providers/<str:name>/credentials",
        provider_credentials.provider_credentials,
        name="provider-credentials",
    ),
    path(
        "providers/<str:name>/credentials/set",
        provider_credentials.provider_credential_set,
        name="provider-credential-set",
    ),
    path(
        "providers/<str:name>/credentials/rotate",
        provider_credentials.provider_credential_rotate,
        name="provider-credential-rotate",
    ),
    path(
        "providers/<str:name>/credentials/<int:credential_id>/retire",
        provider_credentials.provider_credential_retire,
        name="provider-credential-retire",
    ),
    # Remote MCP clients connected through OAuth (admins).
    path("mcp-clients", oauth.clients, name="oauth-clients"),
    path("mcp-clients/<int:connection_id>/revoke", oauth.client_revoke, name="oauth-client-revoke"),
    # The tenant's audit list, exports of the lists, saved views of the filters.
    path("audit", audit_list.audit, name="audit"),
    path("export/<slug:name>.<slug:fmt>", exports.export, name="export"),
    path("saved-views", saved.saved_view_save, name="saved-view-save"),
    path(
        "saved-views/<int:view_id>/<slug:verb>", saved.saved_view_change, name="saved-view-change"
    ),
]
