"""Login and logout of the console: Django's, with the console's page."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.views.decorators.http import require_http_methods


class LoginView(auth_views.LoginView):
    """Django's login, with the console's page; usernames are ``NAME@TENANT``."""

    template_name = "gateway/login.html"
    redirect_authenticated_user = True


login_view = LoginView.as_view()


logout_view = require_http_methods(["POST"])(auth_views.LogoutView.as_view())
