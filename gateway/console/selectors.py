"""What the ledger's console pages read: the triage queue's query (filters, keyset, risk
order) and the controls' freezes and grants. Everything is scoped to the caller's tenant."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.db.models import (
    Case,
    CharField,
    Count,
    F,
    Func,
    IntegerField,
    Max,
    Min,
    Q,
    QuerySet,
    Value,
    When,
)

from gateway.choices import EffectClass, EffectStatus
from gateway.console import extensions
from gateway.contracts import CONTRACTS
from gateway.models import Capability, Effect, EffectTypeFreeze, Principal

S = EffectStatus


# An IN_PROGRESS effect that has not moved for this long needs a look even if its next
# lookup is not due yet.
OVERDUE_AFTER = timedelta(minutes=10)


AGE_FILTERS = {"10m": timedelta(minutes=10), "1h": timedelta(hours=1), "24h": timedelta(days=1)}


SORTS = {"oldest": "oldest first", "newest": "newest first", "risk": "risk, then oldest"}


# Why an effect is in the triage queue, most urgent first (the first that applies): the
# groups of the queue are (provider, type, cause).
CAUSES = {
    "mismatch": "receipt disagrees with the command",
    "compensation_failed": "compensation failed",
    "escalated": "escalated to a human",
    # UNKNOWN with its next lookup scheduled and not late: the reconciler is on it
    # (gateway.console.settling says whether the provider's lookups answer).
    "settling": "being looked up by the reconciler",
    "unknown": "outcome unknown",
    "overdue": "in progress, overdue",
    "case": "open case on a settled effect",
}


# A scheduled lookup this far past its time means the reconciler is not keeping up: the
# effect is no longer counted as settling by itself (the sweep runs every
# GATEWAY_RECONCILE_INTERVAL; the wakers act at the due time).
def lookup_late_after() -> timedelta:
    return max(timedelta(minutes=1), 2 * timedelta(seconds=settings.GATEWAY_RECONCILE_INTERVAL))


# Approvals waiting longer than this are listed in the triage queue too.
APPROVAL_WAIT = timedelta(minutes=15)


def _cause(now: datetime) -> Case:
    return Case(
        When(mismatch=True, then=Value("mismatch")),
        When(status=S.COMPENSATION_FAILED, then=Value("compensation_failed")),
        When(escalated=True, then=Value("escalated")),
        When(
            status=S.UNKNOWN,
            next_check_at__gte=now - lookup_late_after(),
            then=Value("settling"),
        ),
        When(status=S.UNKNOWN, then=Value("unknown")),
        When(status=S.IN_PROGRESS, then=Value("overdue")),
        default=Value("case"),
        output_field=CharField(),
    )


# Lower is riskier: money first, then writes outside our walls, then harmless repeats.
RISK_RANK = {
    EffectClass.FINANCIAL_WRITE: 0,
    EffectClass.EXTERNAL_WRITE: 1,
    EffectClass.IDEMPOTENT_WRITE: 2,
}


# The correlation ids of a command's context, in the order the effect page lists them; the
# triage queue filters on each with ``?context.<key>=<value>``, as the API does.
CORRELATION_KEYS = ("runtime", "agent", "session_id", "run_id", "thread_id", "call_id")


@dataclass(frozen=True)
class TriageFilters:
    """The triage queue's query string, parsed; unknown values fall back to "any"."""

    status: str = ""
    type: str = ""
    owner: str = ""
    age: str = ""
    sort: str = "oldest"
    provider: str = ""
    cause: str = ""
    after: str = ""
    # ((key, value), …): ``context.<key>=<value>`` for the keys of CONTEXT_FILTERS.
    context: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, params) -> TriageFilters:
        status = params.get("status", "")
        type_ = params.get("type", "")
        owner = params.get("owner", "")
        age = params.get("age", "")
        sort = params.get("sort", "oldest")
        provider = params.get("provider", "")
        cause = params.get("cause", "")
        return cls(
            status=status if status in S.values else "",
            type=type_ if type_ in CONTRACTS else "",
            owner=owner if owner in owners() else "",
            age=age if age in AGE_FILTERS else "",
            sort=sort if sort in SORTS else "oldest",
            provider=provider if provider in providers() else "",
            cause=cause if cause in CAUSES else "",
            after=params.get("after", "")[:80],
            context=_context_filters(params),
        )

    def querystring(self, **changes: Any) -> str:
        values = {**self.__dict__, **changes}
        context = values.pop("context")
        after = values.pop("after")
        pairs = [(k, v) for k, v in values.items() if v and (k, v) != ("sort", "oldest")]
        pairs += [(f"context.{key}", value) for key, value in context]
        if after:
            pairs.append(("after", after))
        return urlencode(pairs)

    def without_context(self, key: str) -> str:
        """The first page of the same filters, less one correlation filter."""
        return self.querystring(after="", context=tuple(p for p in self.context if p[0] != key))

    @property
    def active(self) -> bool:
        return bool(
            self.status
            or self.type
            or self.owner
            or self.age
            or self.context
            or self.provider
            or self.cause
        )


def _context_filters(params) -> tuple[tuple[str, str], ...]:
    """``context.<key>=<value>`` pairs, plus the filter form's own control (``ctx_key`` and
    ``ctx_value``: a key chosen from a list and a value typed), which becomes one of them."""
    found = {
        key: params[f"context.{key}"][:200]
        for key in CORRELATION_KEYS
        if params.get(f"context.{key}")
    }
    key, value = params.get("ctx_key", ""), (params.get("ctx_value", "") or "").strip()
    if key in CORRELATION_KEYS and value:
        found[key] = value[:200]
    return tuple((key, found[key]) for key in CORRELATION_KEYS if key in found)


def owners() -> list[str]:
    return sorted({contract.owner for contract in CONTRACTS.values()})


def providers() -> list[str]:
    return sorted({contract.provider for contract in CONTRACTS.values()})


def _risk_rank() -> Case:
    whens = [
        When(type__in=[c.type for c in CONTRACTS.values() if c.effect_class == cls], then=rank)
        for cls, rank in RISK_RANK.items()
    ]
    return Case(*whens, default=Value(len(RISK_RANK)), output_field=IntegerField())


def effects_for_triage(*, principal: Principal, now: datetime) -> QuerySet[Effect]:
    """What needs a human in the caller's tenant: UNKNOWN, overdue IN_PROGRESS, mismatches,
    escalations and failed compensations. Served by the ``effect_triage`` partial index."""
    overdue = Q(status=S.IN_PROGRESS) & (
        Q(next_check_at__lt=now) | Q(status_changed_at__lt=now - OVERDUE_AFTER)
    )
    needs_human = (
        Q(status__in=[S.UNKNOWN, S.COMPENSATION_FAILED])
        | overdue
        | Q(mismatch=True)
        | Q(escalated=True)
    )
    # What the other apps add (an open case on a confirmed effect) and take away (a failed
    # compensation someone fixed by hand).
    for include in extensions.triage_includes:
        needs_human |= include(principal.tenant_id)
    query = Effect.objects.filter(needs_human, tenant_id=principal.tenant_id)
    for exclude in extensions.triage_excludes:
        query = query.exclude(exclude())
    # No join: the provider of a group is its type's contract's (see triage_groups).
    return query.annotate(cause=_cause(now))


# A group of the triage queue in the database: the type and the cause annotated by
# effects_for_triage (the provider follows from the type's contract).
GROUP_FIELDS = ("type", "cause")


@dataclass(frozen=True)
class TriageGroup:
    """Effects of the queue with the same provider, type and cause, and how many."""

    provider: str
    type: str
    cause: str
    count: int
    oldest: datetime
    # The group's next scheduled lookup and its most lookups (for its cause signature).
    next_check: datetime | None = None
    checks: int = 0

    @property
    def cause_label(self) -> str:
        return CAUSES.get(self.cause, self.cause)

    def querystring(self) -> str:
        return urlencode({"provider": self.provider, "type": self.type, "cause": self.cause})


def triage_groups(query: QuerySet[Effect]) -> list[TriageGroup]:
    """The queue grouped by (provider, type, cause), biggest group first: one query."""
    rows = (
        query.order_by()
        .values(*GROUP_FIELDS)
        .annotate(
            count=Count("pk"),
            oldest=Min("created_at"),
            next_check=Min("next_check_at"),
            checks=Max("check_count"),
        )
        .order_by("-count", "oldest")
    )
    groups = []
    for row in rows:
        contract = CONTRACTS.get(row["type"])
        groups.append(TriageGroup(provider=contract.provider if contract else "?", **row))
    return groups


def approvals_waiting(*, principal: Principal, now: datetime) -> int:
    """Commands of the tenant waiting for an approver for longer than APPROVAL_WAIT."""
    return Effect.objects.filter(
        tenant_id=principal.tenant_id,
        status=S.AWAITING_APPROVAL,
        created_at__lt=now - APPROVAL_WAIT,
    ).count()


def apply_triage_filters(query: QuerySet[Effect], filters: TriageFilters, now: datetime):
    if filters.status:
        query = query.filter(status=filters.status)
    if filters.type:
        query = query.filter(type=filters.type)
    if filters.owner:
        query = query.filter(owner=filters.owner)
    if filters.age:
        query = query.filter(created_at__lte=now - AGE_FILTERS[filters.age])
    # The filter of gateway.selectors.effects_filtered(context=…), which the API's list uses.
    if filters.provider:
        # By the types of that provider's contracts: no join with the commands.
        query = query.filter(
            type__in=[c.type for c in CONTRACTS.values() if c.provider == filters.provider]
        )
    if filters.cause:
        # ``cause`` is annotated by effects_for_triage (not a column).
        query = query.filter(**{"cause": filters.cause})
    for key, value in filters.context:
        query = query.filter(**{f"command__context__{key}": value})
    return query


# The primary key as an expression (the same text, the same order), not the column: ordered by
# the column with a LIMIT, the planner walks the whole primary key index hoping to meet the
# queue's few thousand rows early, and they are among the newest ids (3 s at 1 M effects,
# docs/performance.md, "The console at 1 M effects"). By the expression it collects the queue
# through its indexes and sorts that.
_KEY = Func(F("command"), template="(%(expressions)s || '')", output_field=CharField())


def triage_keyset(query: QuerySet[Effect], filters: TriageFilters) -> QuerySet[Effect]:
    """Order and seek by the time-ordered primary key (plus the risk rank when sorting by
    risk): the cost of a page does not grow with its depth, unlike OFFSET."""
    after = filters.after
    if filters.sort == "newest":
        query = query.order_by(_KEY.desc())
        return query.filter(command__lt=after) if after else query
    if filters.sort == "risk":
        query = query.annotate(risk=_risk_rank()).order_by("risk", "command")
        rank, _, pk = after.partition(".")
        if rank.isdigit() and pk:
            query = query.filter(Q(risk__gt=int(rank)) | Q(risk=int(rank), command__gt=pk))
        return query
    query = query.order_by(_KEY.asc())
    return query.filter(command__gt=after) if after else query


def type_freezes(principal: Principal) -> dict[str, EffectTypeFreeze]:
    return {
        freeze.type: freeze
        for freeze in EffectTypeFreeze.objects.filter(tenant_id=principal.tenant_id).select_related(
            "frozen_by"
        )
    }


def capabilities_for_principal(principal: Principal) -> QuerySet[Capability]:
    """Grants of the caller's tenant, newest first (what the API's list shows)."""
    return (
        Capability.objects.filter(tenant_id=principal.tenant_id)
        .select_related("principal")
        .order_by("-created_at", "-id")
    )
