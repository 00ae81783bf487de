"""The frame of every console page: the login and principal gate, the one error mapping, the
one partial predicate, the poll's "unchanged" answer and the one shape of an action.

Every view is wrapped by ``console_view``: login required, the caller's principal resolved
once (``ConsoleRequest.principal``) and everything scoped to its tenant, ``Vary: HX-Request``
on every answer, and domain errors mapped once (``error_response``) to a readable message,
never a stack trace. A request is answered with a fragment only when ``is_partial(request)``;
the same URL answers with the full page otherwise, so every link and form works without
JavaScript. The pages of reconciliation and sagas use this frame too.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import wraps
from typing import Any, cast

from django import forms
from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.utils.cache import add_never_cache_headers, patch_vary_headers
from django_htmx.http import HttpResponseClientRedirect, reswap, retarget
from django_htmx.middleware import HtmxDetails

from gateway.errors import GatewayError, ValidationProblem
from gateway.models import Principal


class ConsoleRequest(HttpRequest):
    """A request ``console_view`` let through: signed in, with the caller's principal (whose
    tenant scopes everything the page reads), and django-htmx's details."""

    principal: Principal
    htmx: HtmxDetails


def is_partial(request: HttpRequest) -> bool:
    """Answer with a fragment: an htmx request that is neither boosted (it wants a whole page)
    nor a history restore (the browser lost its snapshot and needs the whole page)."""
    htmx: HtmxDetails | None = getattr(request, "htmx", None)
    return htmx is not None and bool(htmx) and not htmx.boosted and not htmx.history_restore_request


def _principal_of(user) -> Principal | None:
    return Principal.objects.select_related("tenant").filter(user_id=user.pk).first()


def _finish(response: HttpResponse) -> HttpResponse:
    # The same URL answers with a page or a fragment: caches (and the browser's back button)
    # must keep them apart. Console pages are one user's view of live state: never stored.
    patch_vary_headers(response, ["HX-Request"])
    add_never_cache_headers(response)
    return response


def console_view(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Login required, ``request.principal`` set, domain errors mapped, ``Vary`` added."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        # django-htmx's middleware set ``htmx``; ``principal`` is set below.
        console_request = cast(ConsoleRequest, request)
        if not request.user.is_authenticated:
            if console_request.htmx:
                # An expired session under a poll or a button: take the whole tab to the login
                # page (and back to the page it showed), instead of swapping it into a fragment.
                back = console_request.htmx.current_url_abs_path or request.get_full_path()
                return _finish(HttpResponseClientRedirect(redirect_to_login(back).url))
            return _finish(redirect_to_login(request.get_full_path()))
        principal = _principal_of(request.user)
        if principal is None:
            return _finish(render(request, "gateway/no_principal.html", status=403))
        console_request.principal = principal
        try:
            response = view(console_request, *args, **kwargs)
        except GatewayError as exc:
            response = error_response(request, exc)
        return _finish(response)

    return wrapper


def error_response(
    request: HttpRequest, exc: GatewayError, *, target: str = "#flash", back: str | None = None
) -> HttpResponse:
    """The console's one mapping of a domain error (STYLE 13).

    - htmx: the error partial, with the error's HTTP status, swapped into ``target`` (the
      flash region unless the caller names the form's own error slot);
    - a plain form post (no JavaScript): a flash message and a redirect back (``back``);
    - a plain page load (e.g. another tenant's effect): a readable error page.
    """
    context = {"error": exc, "title": exc.title, "detail": exc.detail}
    if is_partial(request):
        response = render(request, "partials/error.html", context, status=exc.status)
        return reswap(retarget(response, target), "innerHTML")
    if request.method == "POST" and back:
        messages.error(request, f"{exc.title}: {exc.detail}")
        return redirect(back)
    return render(request, "gateway/error.html", context, status=exc.status)


def flash_oob(request: HttpRequest) -> str:
    """The flash region, swapped out of band next to a fragment (htmx answers)."""
    return render_to_string("partials/flash.html", {"oob": True}, request=request)


def poll_token(*parts: Any) -> str:
    """A short digest of what a polled fragment shows: the poll sends it back as ``since``."""
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:20]


def role_may(principal: Principal, roles: Iterable[str]) -> bool:
    return principal.role in roles and not principal.frozen


@dataclass(frozen=True)
class Action:
    """A console action: the form it validates, and the call of the one service the API
    calls (``run(request, object, cleaned_data)``), which returns what to tell the operator."""

    form: type[forms.Form]
    run: Callable[[ConsoleRequest, Any, dict[str, Any]], str]


def form_problem(form: forms.Form) -> GatewayError:
    errors = {name: [str(e) for e in errs] for name, errs in form.errors.items()}
    detail = "; ".join(f"{name}: {' '.join(msgs)}" for name, msgs in errors.items())
    return ValidationProblem(f"The form is not complete — {detail}", errors=errors)


def perform(
    request: HttpRequest,
    *,
    form: forms.Form,
    run: Callable[[dict[str, Any]], str],
    back: str,
    answer: Callable[[], str],
    target: str = "#flash",
) -> HttpResponse:
    """The one shape of every console action: validate the form, call the service (``run``
    returns what to tell the operator), then answer with the changed fragment and the flash
    (htmx) or with a redirect back (no JavaScript). A domain error changes nothing and goes
    through ``error_response``, into ``target`` (the flash region or the form's error slot).
    """
    try:
        if not form.is_valid():
            raise form_problem(form)
        message = run(form.cleaned_data)
    except GatewayError as exc:
        return error_response(request, exc, target=target, back=back)
    messages.success(request, message)
    if not is_partial(request):
        return redirect(back)
    return HttpResponse(answer() + flash_oob(request))


def badges_oob(request: HttpRequest) -> str:
    """The nav's counts, swapped out of band after an action that may have changed them."""
    return render_to_string("partials/nav_badges.html", {"oob": True}, request=request)


def render_polled(
    request: HttpRequest, template: str, fragment: str, context: dict[str, Any]
) -> HttpResponse:
    """The one ending of a polled page: the whole page, or (htmx) its ``fragment`` — or a
    204 that keeps the DOM (and the reader's place) when nothing the fragment shows has
    changed since the ``token`` the poll sent back as ``since``."""
    if is_partial(request):
        if request.GET.get("since") == context["token"]:
            return reswap(HttpResponse(status=204), "none")
        return render(request, f"{template}#{fragment}", context)
    return render(request, template, context)
