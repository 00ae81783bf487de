"""Reads of reconciliation (STYLE 4): the human queue and the evidence, scoped by tenant."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import NamedTuple

from django.db import connection
from django.db.models import Q, QuerySet

from gateway.choices import TO_RECONCILE, EffectStatus
from gateway.errors import NotFound
from gateway.models import Command, Effect, Principal
from gateway.providers import health
from reconciliation.choices import UNRESOLVED, LookupStatus, RecordKind, RecordOutcome
from reconciliation.models import Case, ReconciliationRecord


def cases_for_principal(principal: Principal) -> QuerySet[Case]:
    """Cases the principal may see: its tenant's, and no other's."""
    return Case.objects.filter(tenant_id=principal.tenant_id).select_related(
        "effect", "acknowledged_by", "resolved_by"
    )


def cases_queue(
    *,
    principal: Principal,
    states: Iterable[str] | None = None,
    owner: str | None = None,
    reason: str | None = None,
) -> QuerySet[Case]:
    """The human queue: unresolved cases (or the given states), oldest first.

    Unresolved cases of a tenant by age are served by the partial index case_queue.
    """
    query = cases_for_principal(principal).filter(state__in=sorted(states or UNRESOLVED))
    if owner:
        query = query.filter(owner=owner)
    if reason:
        query = query.filter(reason=reason)
    return query.order_by("opened_at", "id")


def case_get(*, principal: Principal, case_id: str) -> Case:
    case = cases_for_principal(principal).filter(pk=case_id).first()
    if case is None:
        # Another tenant's case does not exist for this caller.
        raise NotFound(f"No case {case_id}.")
    return case


def effect_records(effect: Effect) -> QuerySet[ReconciliationRecord]:
    """Every lookup and manual resolution of one effect, oldest first."""
    return effect.reconciliation_records.select_related("principal").order_by("id")


def effect_open_case(effect: Effect) -> Case | None:
    return effect.cases.filter(state__in=sorted(UNRESOLVED)).first()


class DueTimes(NamedTuple):
    """The earliest due time of each queue the waker serves (None: the queue is empty)."""

    check: datetime | None  # the next lookup of an UNKNOWN / IN_PROGRESS effect
    lease: datetime | None  # the first DISPATCHING claim's lease to run out
    # The first command waiting for an approver to expire (an approval's or a saga step's
    # deadline: reconciliation.services.expiry).
    expiry: datetime | None = None


# The first two minimums are the first entries of their queue's partial index
# (effect_reconcile_due, effect_lease_due: the predicates spelled as the indexes spell them);
# the third reads the effects waiting for an approver through effect_before_dispatch (a set
# people work down, not a backlog) joined to their commands. One round trip for the three.
_DUE_TIMES = f"""
SELECT (SELECT min(next_check_at) FROM {Effect._meta.db_table}
         WHERE status IN ({", ".join(f"'{status}'" for status in sorted(TO_RECONCILE))})),
       (SELECT min(lease_expires_at) FROM {Effect._meta.db_table}
         WHERE status = '{EffectStatus.DISPATCHING}'),
       (SELECT min(c.expires_at) FROM {Effect._meta.db_table} e
          JOIN {Command._meta.db_table} c ON c.effect_id = e.effect_id
         WHERE e.status = '{EffectStatus.AWAITING_APPROVAL}')
"""


def effects_next_due() -> DueTimes:
    """When the reconciler and lease recovery next have work (reconciliation.waker)."""
    with connection.cursor() as cursor:
        cursor.execute(_DUE_TIMES)
        check, lease, expiry = cursor.fetchone()
    return DueTimes(check, lease, expiry)


# A lookup that settled an uncertain effect (UNKNOWN or IN_PROGRESS: the record keeps the
# status after the verdict, not before), the provider's answer proving it.
_SETTLING = [RecordOutcome.CONFIRMED, RecordOutcome.REJECTED, RecordOutcome.NOT_STARTED]


def lookup_tallies(tenant_id: int, since: datetime) -> dict[str, health.Tally]:
    """The tenant's lookups since ``since``, per provider, for provider health: a lookup
    failed when the provider did not answer. Served by the partial index record_recent_lookup
    (lookups by time), bounded by ``since``."""
    return health.tallies(
        ReconciliationRecord.objects.filter(
            kind=RecordKind.LOOKUP, created_at__gte=since, tenant_id=tenant_id
        ),
        at="created_at",
        failed=Q(lookup_status=LookupStatus.UNREACHABLE),
        marked=Q(outcome__in=_SETTLING),
        type_field="effect__type",
    )
