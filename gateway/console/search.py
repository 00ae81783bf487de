"""GET ``/search?q=``: one box for every id an engineer may hold during an incident — an
effect id, a saga id (from sagas, through ``extensions.search_hits``), the agent's key, the
provider's key (``<tenant>:<key>``), a provider operation id, a resource id, a customer id.
One hit opens it; several are listed. Everything is scoped to the caller's tenant."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Exists, OuterRef, Q
from django.http import HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from gateway.console import extensions
from gateway.console.base import ConsoleRequest, console_view
from gateway.models import Effect, Principal, Receipt

SEARCH_LIMIT = 50


@dataclass(frozen=True)
class Hit:
    """One thing the search found: where it is, what it is, and which field matched."""

    url: str
    kind: str
    label: str
    matched: str
    status: str = ""


def effects_matching(*, principal: Principal, q: str) -> list[Hit]:
    receipts = Receipt.objects.filter(effect=OuterRef("pk"), provider_operation_id=q)
    query = (
        Effect.objects.filter(tenant_id=principal.tenant_id)
        .filter(
            Q(pk=q)
            | Q(command__idempotency_key=q)
            | Q(command__provider_key=q)
            | Q(provider_operation_id=q)
            | Q(Exists(receipts))
            | Q(command__resource__id=q)
            # The redacted payload: a customer id is not a personal field; what is redacted
            # for the viewer is not searchable either.
            | Q(command__payload_redacted__customer_id=q)
        )
        .select_related("command")
        .order_by("-command")[:SEARCH_LIMIT]
    )
    hits = []
    for effect in query:
        command = effect.command
        matched = next(
            (
                name
                for name, value in (
                    ("effect id", effect.pk),
                    ("idempotency key", command.idempotency_key),
                    ("provider key", command.provider_key),
                    ("provider operation", effect.provider_operation_id),
                    ("resource id", str((command.resource or {}).get("id", ""))),
                    ("customer id", str((command.payload_redacted or {}).get("customer_id", ""))),
                )
                if value == q
            ),
            "provider operation",
        )
        hits.append(
            Hit(
                reverse("console:effect", args=[effect.pk]),
                "effect",
                f"{effect.pk} · {effect.type}",
                matched,
                effect.status,
            )
        )
    return hits


@require_GET
@console_view
def search(request: ConsoleRequest) -> HttpResponse:
    q = request.GET.get("q", "").strip()[:330]
    hits: list[Hit] = []
    if q:
        hits = effects_matching(principal=request.principal, q=q)
        for more in extensions.search_hits:
            hits += more(request.principal, q)
    if len(hits) == 1:
        return HttpResponseRedirect(hits[0].url)
    return render(
        request,
        "gateway/console_search.html",
        {"q": q, "hits": hits, "view_name": "search"},
        status=200,
    )
