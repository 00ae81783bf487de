"""Requests the gateway refuses before any view runs, so that no input is a 500.

Each of these once reached a view or the database and came back as a server error:

* NUL in the path or the query (``%00`` in an id or a filter): PostgreSQL text cannot hold it;
* a ``charset`` that is not UTF-8 (or not a charset at all) on a body: nothing else is read;
* ``Transfer-Encoding: chunked``: the WSGI body then has no length, and a request carrying both
  a length and chunking is the classic request-smuggling shape: 411, send Content-Length;
* NUL or a lone surrogate in a submitted form field (the console, the admin).

The API answers in problem+json, the rest in plain text.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from gateway.api.parsers import UTF8_NAMES, charset_of
from gateway.api.problems import json_problem_view
from gateway.lib.jsonin import JsonInputError, check_value

BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def _problem(request: HttpRequest) -> tuple[int, str, str, str] | None:
    if "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower():
        return (
            411,
            "length-required",
            "Length required",
            "Chunked request bodies are not accepted: send the body with a Content-Length.",
        )
    if "\x00" in request.path:
        return 400, "malformed-request", "The path is not valid", "The path contains NUL (%00)."
    for name, values in request.GET.lists():
        if "\x00" in name or any("\x00" in value for value in values):
            return (
                400,
                "malformed-request",
                "The query is not valid",
                f"The query parameter {name!r} contains NUL (%00).",
            )
    if request.method in BODY_METHODS:
        content_type = request.META.get("CONTENT_TYPE", "")
        charset = charset_of(content_type)
        if charset and charset not in UTF8_NAMES:
            try:
                codecs.lookup(charset)
                known = not content_type.startswith("application/json")
            except LookupError:
                known = False
            if not known:
                return (
                    415,
                    "unsupported-media-type",
                    "Unsupported charset",
                    f"charset={charset} is not supported: send UTF-8.",
                )
        # Forms are the console's and the admin's: the API reads JSON only, and reading a
        # form here would hand DRF the parsed form instead of refusing it with 415.
        if content_type.startswith(FORM_TYPES) and not request.path.startswith("/api/"):
            try:
                for name, values in request.POST.lists():
                    check_value({name: values}, where="form")
            except JsonInputError as exc:
                return 400, "malformed-request", "The form is not valid", str(exc)
    return None


class InputGuardMiddleware:
    """Refuse unreadable input with a 4xx (module doc)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        problem = _problem(request)
        if problem is None:
            return self.get_response(request)
        status, slug, title, detail = problem
        if request.path.startswith("/api/"):
            return json_problem_view(status, slug, title, detail)
        return HttpResponse(f"{title}: {detail}\n", status=status, content_type="text/plain")
