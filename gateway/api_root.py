"""``/api/`` and ``/api/v1/``: where the API is described, instead of a 404 to someone who
types the obvious address. Public: it holds nothing but links."""

from django.http import HttpRequest, JsonResponse
from django.urls import reverse
from django.views.decorators.http import require_safe


@require_safe
def api_root(request: HttpRequest) -> JsonResponse:
    def link(path: str) -> str:
        return request.build_absolute_uri(path)

    return JsonResponse(
        {
            "name": "Effect Gateway API",
            "versions": {"v1": link("/api/v1/")},
            "docs": link(reverse("api-docs")),
            "schema": link(reverse("schema")),
            "links": {
                "commands": link("/api/v1/commands"),
                "effect_types": link("/api/v1/effect-types"),
                "saga_definitions": link("/api/v1/saga-definitions"),
            },
            "authentication": "Authorization: Bearer <token> (manage.py issue_token)",
        }
    )
