"""Actions on a group of effects at once (an incident: 150 charges escalated while the
provider was down), and the automatic re-arm once the provider answers again (STYLE 4–7).

Every function acts on each effect with the one service or compare-and-set a single effect
gets, and writes one event per effect it changed, in the transaction that changes it. A
group is never acted on by a filter evaluated later: the caller passes the effect ids the
engineer saw, and each one is re-checked here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta

from django.db.models import Exists, OuterRef
from django.utils import timezone

from gateway import ledger
from gateway.choices import OPERATOR_ROLES, TO_RECONCILE
from gateway.errors import GatewayError
from gateway.models import Effect, Principal
from reconciliation import claims, services
from reconciliation.choices import UNRESOLVED, CaseReason, RecordKind
from reconciliation.models import Case, ReconciliationRecord
from reconciliation.services.core import _writing

logger = logging.getLogger(__name__)

# At most this many effects per action: a bigger group is acted on in several clicks.
BULK_LIMIT = 500
# The beat looks one escalated effect of a provider up again at most this often, to notice
# that the provider answers again.
PROBE_INTERVAL = timedelta(minutes=2)
REARMER = "reconciler"


@dataclass
class BulkResult:
    """What one bulk action did: how many effects it changed, and to what."""

    asked: int = 0
    changed: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


def _lookups_failed_case() -> Exists:
    """The effect was escalated because its lookups got no answer (not because the provider
    said something a human must judge)."""
    return Exists(
        Case.objects.filter(
            effect=OuterRef("pk"),
            state__in=sorted(UNRESOLVED),
            reason=CaseReason.LOOKUP_BUDGET_EXHAUSTED,
        )
    )


def _rearmable():
    # Escalated and still uncertain, and never one the provider contradicted: a mismatch
    # is for its owner to judge, however many lookups are made.
    return Effect.objects.filter(escalated=True, mismatch=False, status__in=sorted(TO_RECONCILE))


def effects_rearm(
    *, effect_ids: Iterable[str], actor: str, principal: Principal | None = None, reason: str
) -> list[str]:
    """Give escalated effects a fresh lookup budget and make them due now: the reconciler
    asks the provider again. Returns the ids re-armed (the others were not escalated, or
    were settled meanwhile). Their open cases stay open until a lookup settles them."""
    if principal is not None:
        ledger.require_role(principal, OPERATOR_ROLES, "re-arm lookups")
    ids = list(dict.fromkeys(effect_ids))[:BULK_LIMIT]
    query = _rearmable().filter(pk__in=ids)
    if principal is not None:
        query = query.filter(tenant_id=principal.tenant_id)
    done: list[str] = []
    by_tenant: dict[int, list[Effect]] = {}
    for effect in query.only("pk", "tenant_id", "status"):
        by_tenant.setdefault(effect.tenant_id, []).append(effect)
    for tenant_id, effects in by_tenant.items():
        now = timezone.now()
        with _writing(tenant_id):
            for effect in effects:
                # Compare-and-set on "still escalated and uncertain": the reconciler, a webhook
                # or an operator's resolution may have settled it since it was read.
                changed = ledger.annotate(
                    effect,
                    fields={"escalated": False, "check_count": 0, "next_check_at": now},
                    kind="rearmed",
                    actor=actor,
                    principal=principal,
                    reason=reason,
                    expect_status=effect.status,
                    where={"escalated": True, "mismatch": False},
                    now=now,
                )
                if not changed:
                    continue
                done.append(effect.pk)
    return done


def effects_take(*, effect_ids: Iterable[str], principal: Principal, note: str = "") -> BulkResult:
    """Take every effect of a group (and their open cases): "I am on this incident"."""
    ids = list(dict.fromkeys(effect_ids))[:BULK_LIMIT]
    result = BulkResult(asked=len(ids))
    for effect in Effect.objects.filter(pk__in=ids, tenant_id=principal.tenant_id):
        try:
            claims.effect_take(effect=effect, principal=principal, note=note)
        except GatewayError as exc:
            result.refused.append(f"{effect.pk}: {exc.detail}")
            continue
        result.changed += 1
    return result


def effects_rearm_for_provider(*, provider: str) -> int:
    """The provider answered a lookup again: every effect escalated because its lookups got
    no answer from that provider is given a fresh budget and looked up again (in every
    tenant: the provider is the same). Returns how many were re-armed."""
    ids = list(
        _rearmable()
        .filter(_lookups_failed_case(), command__provider=provider)
        .values_list("pk", flat=True)[:BULK_LIMIT]
    )
    if not ids:
        return 0
    done = effects_rearm(
        effect_ids=ids,
        actor=REARMER,
        reason=f"{provider} answers lookups again: re-armed automatically",
    )
    if done:
        logger.info("re-armed escalated effects", extra={"provider": provider, "count": len(done)})
    return len(done)


def effects_probe_escalated(*, now=None) -> int:
    """For each provider whose effects are all escalated (nothing else looks it up), ask it
    about its oldest one again, at most every PROBE_INTERVAL: when it answers,
    ``effect_reconcile`` re-arms the rest. Returns how many lookups were made."""
    now = now or timezone.now()
    oldest: dict[str, str] = {}
    for effect_id, provider in (
        _rearmable()
        .filter(_lookups_failed_case())
        .order_by("command__provider", "command")
        .values_list("pk", "command__provider")
    ):
        oldest.setdefault(provider, effect_id)
    if not oldest:
        return 0
    # The providers asked in the last PROBE_INTERVAL, in one query that reads only those
    # records (the partial index record_recent_lookup), not every record the ledger holds.
    recent = set(
        ReconciliationRecord.objects.filter(
            kind=RecordKind.LOOKUP, created_at__gte=now - PROBE_INTERVAL
        )
        .values_list("effect__command__provider", flat=True)
        .distinct()
    )
    probed = 0
    for provider, effect_id in oldest.items():
        if provider in recent:
            continue
        try:
            services.effect_reconcile(effect_id=effect_id)
        except Exception:
            # As in reconcile_next_batch: one poison row must not stop the sweep.
            logger.exception("probe failed", extra={"effect_id": effect_id})
            continue
        probed += 1
    return probed
