"""Reads of the ledger (STYLE 4): every query a view or a worker runs, scoped by tenant."""

from __future__ import annotations

from django.db.models import Prefetch, QuerySet

from gateway.choices import OPERATOR_ROLES
from gateway.errors import NotFound
from gateway.models import Attempt, Effect, EffectEvent, Principal, Receipt

# Correlation ids on a command's context that ?context.<key>= filters on.
CONTEXT_FILTERS = ("runtime", "session_id", "run_id", "call_id", "thread_id", "agent")


def effects_for_principal(principal: Principal) -> QuerySet[Effect]:
    """Effects the principal may see: its tenant's, and no other's."""
    return Effect.objects.filter(tenant_id=principal.tenant_id).select_related(
        "command", "command__requested_by", "approved_by", "tenant"
    )


def effect_get(*, principal: Principal, effect_id: str) -> Effect:
    effect = effects_for_principal(principal).filter(pk=effect_id).first()
    if effect is None:
        # Another tenant's effect does not exist for this caller.
        raise NotFound(f"No effect {effect_id}.")
    return effect


_NEWEST_RECEIPT_FIRST = Receipt.objects.order_by("-received_at", "-id")


def effects_filtered(
    *,
    principal: Principal,
    status: list[str] | None = None,
    type: str | None = None,
    owner: str | None = None,
    context: dict[str, str] | None = None,
) -> QuerySet[Effect]:
    """The API's list: a page of effects, then its commands, requesters and receipts read by
    key (prefetched), not joined. Joined, PostgreSQL merges the page with the command table
    walked from its newest row, so a cursor at depth d of the history read d commands (half
    way down 5 M effects: seconds; docs/performance.md, "Scale at 1 M and 5 M effects"); prefetched,
    every page costs the same few statements, the latest receipts included."""
    query = (
        Effect.objects.filter(tenant_id=principal.tenant_id)
        .select_related("tenant")
        .prefetch_related(
            "command__requested_by",
            "approved_by",
            Prefetch("receipts", queryset=_NEWEST_RECEIPT_FIRST, to_attr="receipts_newest_first"),
        )
    )
    if status:
        query = query.filter(status__in=status)
    if type:
        query = query.filter(type=type)
    if owner:
        query = query.filter(owner=owner)
    for name, value in (context or {}).items():
        query = query.filter(**{f"command__context__{name}": value})
    return query


def effect_events(effect: Effect) -> QuerySet[EffectEvent]:
    return effect.events.select_related("principal").order_by("id")


def effect_attempts(effect: Effect) -> QuerySet[Attempt]:
    return effect.attempts.order_by("number")


def effect_latest_receipt(effect: Effect):
    # Prefetched with a page of the list (effects_filtered): no query per effect.
    newest_first = getattr(effect, "receipts_newest_first", None)
    if newest_first is not None:
        return newest_first[0] if newest_first else None
    return _NEWEST_RECEIPT_FIRST.filter(effect=effect).first()


def may_see_payload(principal: Principal, effect: Effect) -> bool:
    return principal.role in OPERATOR_ROLES or effect.command.requested_by_id == principal.pk
