"""Login and logout of the console: Django's, with the console's page."""

from __future__ import annotations

from axes.helpers import get_cool_off
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods


class LoginView(auth_views.LoginView):
    """Django's login, with the console's page; usernames are ``NAME@TENANT``."""

    template_name = "gateway/login.html"
    redirect_authenticated_user = True


login_view = LoginView.as_view()


logout_view = require_http_methods(["POST"])(auth_views.LogoutView.as_view())


def locked_out(
    request: HttpRequest,
    original_response: HttpResponse | None = None,
    credentials: dict | None = None,
) -> HttpResponse:
    """django-axes' answer to a locked (username, address) pair (``gateway.logins``): the login
    page again, 429, saying for how long, with ``Retry-After``."""
    wait = get_cool_off(request)
    seconds = int(wait.total_seconds()) if wait else 0
    username = request.POST.get("username", "")
    response = render(
        request,
        LoginView.template_name,
        {
            "form": AuthenticationForm(request, initial={"username": username}),
            "locked_for": _spoken(seconds),
            "next": request.POST.get("next", ""),
        },
        status=429,
    )
    response["Retry-After"] = str(seconds)
    return response


def _spoken(seconds: int) -> str:
    if seconds >= 3600:
        hours = round(seconds / 3600)
        return f"{hours} hour" + ("s" if hours != 1 else "")
    minutes = max(1, round(seconds / 60))
    return f"{minutes} minute" + ("s" if minutes != 1 else "")
