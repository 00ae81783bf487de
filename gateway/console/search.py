"""GET ``/search?q=``: one box for every id an engineer may hold during an incident — an
effect id, a saga id (from sagas, through ``extensions.search_hits``), the agent's key, the
provider's key (``<tenant>:<key>``), a provider operation id, a resource id, a customer id.
One hit opens it; several are listed. Everything is scoped to the caller's tenant."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import QuerySet
from django.db.models.fields.json import KeyTextTransform
from django.http import HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from gateway.console import extensions
from gateway.console.base import ConsoleRequest, console_view
from gateway.contracts import CONTRACTS
from gateway.models import Command, Effect, Principal, Receipt

SEARCH_LIMIT = 50


@dataclass(frozen=True)
class Hit:
    """One thing the search found: where it is, what it is, and which field matched."""

    url: str
    kind: str
    label: str
    matched: str
    status: str = ""


def _matching_ids(*, tenant_id: int, q: str) -> QuerySet:
    """The ids of the tenant's effects that ``q`` names, newest first: one indexed lookup per
    kind of identifier, united. As one OR across the effect, its command and its receipts the
    query could use no index and read the whole ledger (seconds at a million effects;
    docs/performance.md, "Scale at 1 M and 5 M effects")."""
    commands = Command.objects.filter(tenant_id=tenant_id)
    contracts = CONTRACTS.values()
    by_id = Effect.objects.filter(tenant_id=tenant_id, pk=q).values_list("pk")
    return by_id.union(
        commands.filter(idempotency_key=q).values_list("effect_id"),
        # (provider, provider_key): the index a provider's webhook uses too.
        commands.filter(
            provider__in=sorted({c.provider for c in contracts}), provider_key=q
        ).values_list("effect_id"),
        Effect.objects.filter(tenant_id=tenant_id, provider_operation_id=q).values_list("pk"),
        Receipt.objects.filter(effect__tenant_id=tenant_id, provider_operation_id=q).values_list(
            "effect_id"
        ),
        # The resource id as a column (the command index on tenant, type, id), not in its JSON.
        commands.filter(
            resource_type__in=sorted({c.resource_type for c in contracts}), resource_id=q
        ).values_list("effect_id"),
        # The redacted payload: a customer id is not a personal field; what is redacted for
        # the viewer is not searchable either. The expression and the condition are those of
        # the partial index command_customer.
        commands.alias(customer=KeyTextTransform("customer_id", "payload_redacted"))
        .filter(payload_redacted__has_key="customer_id", customer=q)
        .values_list("effect_id"),
    ).order_by("-pk")[:SEARCH_LIMIT]


def effects_matching(*, principal: Principal, q: str) -> list[Hit]:
    ids = [pk for (pk,) in _matching_ids(tenant_id=principal.tenant_id, q=q)]
    query = Effect.objects.filter(pk__in=ids).select_related("command").order_by("-command")
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
