"""Who needs a human, and why: the triage queue's groups with their cause signature, split
into what the reconciler is settling by itself and what needs a person, in risk order.

An effect is *settling* when it is UNKNOWN, neither a mismatch nor escalated,
with its next lookup scheduled and not late (the ``settling`` cause of
``gateway.console.selectors``) **and** its provider's lookups are answering (or were not
tried yet in the last hour). When the lookups of that provider fail, the same effects need a
human: nothing settles them while the provider cannot be asked. Everything else in the queue
needs a human. The page title and the nav badge count only those.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone

from gateway.choices import EffectClass
from gateway.console.selectors import TriageGroup, effects_for_triage
from gateway.contracts import CONTRACTS
from gateway.models import Effect, Principal
from gateway.providers.health import ProviderHealth, provider_health
from gateway.templatetags.console import duration_label

SETTLING = "settling"


@dataclass(frozen=True)
class GroupView:
    """A group of the queue as the page shows it: what it is, its cause signature in words,
    whether it needs a person, and the chip tone of its cause."""

    group: TriageGroup
    signature: str
    needs_human: bool
    tone: str


def _clock(moment: datetime) -> str:
    return timezone.localtime(moment).strftime("%H:%M")


def _next_lookup(group: TriageGroup, now: datetime) -> str:
    if group.next_check is None:
        return ""
    if group.next_check <= now:
        return "next lookup due now"
    seconds = int((group.next_check - now).total_seconds())
    if seconds < 60:
        return f"next lookup in {max(seconds, 1)} s"
    return f"next lookup in {duration_label(group.next_check - now)}"


def _settling_signature(
    group: TriageGroup, health: ProviderHealth | None, now: datetime
) -> GroupView:
    what = "outcome unknown"
    lookups = health.lookups if health is not None else None
    if lookups is not None and lookups.answering is False:
        since = f" since {_clock(lookups.since)}" if lookups.since else " for over an hour"
        return GroupView(
            group, f"lookups unreachable{since} — it cannot settle by itself", True, "danger"
        )
    answering = "lookups answering" if lookups and lookups.answering else "first lookup pending"
    next_lookup = _next_lookup(group, now)
    tail = f", {next_lookup}" if next_lookup else ""
    return GroupView(group, f"{what}, {answering} — settling by itself{tail}", False, "ok")


def group_view(group: TriageGroup, health: ProviderHealth | None, now: datetime) -> GroupView:
    """The cause signature of one group (``health``: its provider's, if known)."""
    cause = group.cause
    if cause == SETTLING:
        return _settling_signature(group, health, now)
    if cause == "mismatch":
        return GroupView(
            group, "receipt disagrees — never re-executed, the owner decides", True, "danger"
        )
    if cause == "compensation_failed":
        return GroupView(group, "compensation failed — undo it by hand", True, "danger")
    if cause == "escalated":
        after = f"after {group.checks} inconclusive lookups" if group.checks else "to a human"
        return GroupView(group, f"escalated {after}", True, "attention")
    if cause == "unknown":
        lookups = health.lookups if health is not None else None
        if lookups is not None and lookups.answering is False and lookups.since:
            return GroupView(
                group,
                f"outcome unknown, lookups unreachable since {_clock(lookups.since)}",
                True,
                "attention",
            )
        return GroupView(group, "outcome unknown, no lookup scheduled", True, "attention")
    if cause == "overdue":
        late = f" (due {duration_label(now - group.next_check)} ago)" if group.next_check else ""
        return GroupView(group, f"in progress, lookup overdue{late}", True, "attention")
    return GroupView(group, group.cause_label, True, "danger" if cause == "case" else "attention")


def risk_key(view: GroupView) -> tuple[Any, ...]:
    """Riskiest first: mismatches, then money at stake, then irreversible classes, then age."""
    group = view.group
    contract = CONTRACTS.get(group.type)
    money = contract is not None and contract.effect_class == EffectClass.FINANCIAL_WRITE
    # Irreversible contracts first, then writes outside our walls, then harmless repeats.
    if contract is None or contract.irreversible:
        irreversible = 0
    else:
        irreversible = 2 if contract.effect_class == EffectClass.IDEMPOTENT_WRITE else 1
    return (
        group.cause != "mismatch",
        not money,
        irreversible,
        group.oldest,
        group.provider,
        group.type,
        group.cause,
    )


def split_groups(
    groups: list[TriageGroup], health: dict[str, ProviderHealth], now: datetime
) -> tuple[list[GroupView], list[GroupView]]:
    """(needing a human, settling by itself), each in risk order."""
    views = sorted(
        (group_view(group, health.get(group.provider), now) for group in groups), key=risk_key
    )
    return [v for v in views if v.needs_human], [v for v in views if not v.needs_human]


def settling_types(health: dict[str, ProviderHealth]) -> list[str]:
    """The effect types whose provider's lookups are not failing: their ``settling`` effects
    need nobody."""
    return sorted(
        contract.type
        for contract in CONTRACTS.values()
        if not (contract.provider in health and health[contract.provider].lookups_failing)
    )


def settling_q(health: dict[str, ProviderHealth]) -> Q:
    """On a queue annotated by ``effects_for_triage``: its effects that settle by themselves."""
    return Q(cause=SETTLING, type__in=settling_types(health))


def needs_a_human(query: QuerySet[Effect], health: dict[str, ProviderHealth]) -> QuerySet[Effect]:
    return query.exclude(settling_q(health))


def needs_human_count(
    principal: Principal,
    *,
    now: datetime | None = None,
    health: dict[str, ProviderHealth] | None = None,
) -> int:
    """The nav badge's and the page title's count: the tenant's effects that need a person."""
    now = now or timezone.now()
    if health is None:
        health = provider_health(principal.tenant_id, now=now)
    return needs_a_human(effects_for_triage(principal=principal, now=now), health).count()
