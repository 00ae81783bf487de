"""The console's side of remote MCP clients (gateway.oauth): the authorize page, where a tenant
admin approves or denies a connecting client and chooses the principal it acts as (and, if
wanted, a new grant for it), and the list of connected clients, where each is revoked."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.db import transaction
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST
from oauth2_provider.exceptions import OAuthToolkitError
from oauth2_provider.forms import AllowForm
from oauth2_provider.models import Application
from oauth2_provider.views import AuthorizationView
from oauthlib.oauth2.rfc6749.errors import InvalidRequestError

from gateway import capabilities, oauth
from gateway.choices import Role
from gateway.console.base import ConsoleRequest, console_view
from gateway.contracts import CONTRACTS
from gateway.errors import NotPermitted, ValidationProblem
from gateway.models import OAuthConnection


class ApproveForm(AllowForm):
    """DOT's hidden authorization-request fields, plus the admin's choices."""

    principal = forms.ChoiceField(required=False)
    grant_effect_types = forms.MultipleChoiceField(
        required=False,
        choices=[(name, name) for name in sorted(CONTRACTS)],
        widget=forms.CheckboxSelectMultiple,
    )
    grant_budget_count = forms.IntegerField(required=False, min_value=1)


def _require_admin(request: ConsoleRequest) -> None:
    if request.principal.role != Role.ADMIN or request.principal.frozen:
        raise NotPermitted("Only a tenant admin connects MCP clients.")


class ApproveClientView(AuthorizationView):
    """DOT's authorization endpoint with the console's consent page (``console_view`` has
    made sure the caller is signed in and set ``request.principal``)."""

    template_name = "gateway/oauth_authorize.html"
    form_class = ApproveForm
    request: Any

    def get(self, request, *args, **kwargs):
        _require_admin(request)
        refused = self._unknown_resource(request.GET.getlist("resource"))
        return refused or super().get(request, *args, **kwargs)

    def post(self, request, *args, **kwargs):
        _require_admin(request)
        return super().post(request, *args, **kwargs)

    def validate_authorization_request(self, request):
        """DOT's checks (client, redirect URI, PKCE present), then PKCE's method: S256 only,
        refused before the page is shown (a challenge without a method means ``plain``)."""
        scopes, credentials = super().validate_authorization_request(request)
        if credentials.get("code_challenge_method") != "S256":
            raise OAuthToolkitError(
                error=InvalidRequestError(
                    description="PKCE with code_challenge_method=S256 is required.",
                    state=credentials.get("state"),
                ),
                redirect_uri=credentials["redirect_uri"],
            )
        return scopes, credentials

    def _unknown_resource(self, resources: list[str]) -> HttpResponse | None:
        if resources and all(oauth.resource_allowed(uri) for uri in resources):
            return None
        return render(
            self.request,
            "gateway/error.html",
            {
                "title": "Unknown MCP endpoint",
                "detail": "The client must name the MCP endpoint it connects to (the "
                "`resource` parameter), one of: " + ", ".join(oauth.allowed_resources()),
            },
            status=400,
        )

    def get_form(self, form_class=None):
        form = super().get_form(form_class)
        agents = oauth.principals_to_act_as(self.request.principal)
        form.fields["principal"].choices = [(str(p.pk), p.name) for p in agents]
        return form

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        agents = list(oauth.principals_to_act_as(self.request.principal))
        context["agents"] = [(agent, oauth.live_grants(agent)) for agent in agents]
        context["view_name"] = "oauth-clients"
        return context

    def form_valid(self, form):
        if not form.cleaned_data.get("allow"):
            return super().form_valid(form)  # denied: DOT redirects with access_denied
        refused = self._unknown_resource(form.cleaned_data.get("resource", "").split())
        if refused:
            return refused
        admin = self.request.principal
        agent = oauth.principals_to_act_as(admin).filter(pk=form.cleaned_data["principal"] or 0)
        principal = agent.first()
        if principal is None:
            raise ValidationProblem(
                "Choose the agent this client acts as.", errors={"principal": ["required"]}
            )
        application = get_object_or_404(Application, client_id=form.cleaned_data["client_id"])
        with transaction.atomic():
            effect_types = form.cleaned_data.get("grant_effect_types") or []
            if effect_types:
                capabilities.capability_grant(
                    granted_by=admin.label,
                    principal=principal,
                    effect_types=list(effect_types),
                    budget_count=form.cleaned_data.get("grant_budget_count"),
                )
            oauth.connection_approve(application=application, principal=principal, actor=admin)
            return super().form_valid(form)


authorize = console_view(ApproveClientView.as_view())


@console_view
@require_GET
def clients(request: ConsoleRequest) -> HttpResponse:
    """The tenant's connected MCP clients, each with what it acts as and its live tokens."""
    _require_admin(request)
    connections = list(oauth.connections_of(request.principal.tenant_id))
    counts = oauth.live_token_counts([c.application_id for c in connections])
    rows = [(c, counts.get(c.application_id, 0)) for c in connections]
    return render(
        request, "gateway/oauth_clients.html", {"rows": rows, "view_name": "oauth-clients"}
    )


@console_view
@require_POST
def client_revoke(request: ConsoleRequest, connection_id: int) -> HttpResponse:
    _require_admin(request)
    connection = get_object_or_404(
        OAuthConnection, pk=connection_id, tenant_id=request.principal.tenant_id
    )
    oauth.connection_revoke(connection=connection, actor=request.principal)
    messages.success(
        request,
        f"{connection.application.name or connection.application.client_id} is disconnected: "
        "its tokens are refused from now on.",
    )
    return redirect("console:oauth-clients")
