"""Evidence of how uncertain effects were settled, and the human queue.

A *reconciliation record* is one lookup of the provider (or one operator's decision) and is
never updated. A *case* is an effect handed to its owning team. *Webhook deliveries* are the
provider's asynchronous receipts, kept once per (provider, event id); a receipt that names no
command of ours is kept as an *orphan receipt*, never dropped. A *bulk job* is one action on a
group of effects (look them all up), worked in the background, its progress kept per effect.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from gateway.lib.ids import new_id
from gateway.models import Effect, Principal, Tenant
from reconciliation.choices import (
    UNRESOLVED,
    BulkJobState,
    CaseReason,
    CaseState,
    LookupBy,
    LookupStatus,
    OrphanState,
    RecordKind,
    RecordOutcome,
    WebhookOutcome,
)


def new_case_id() -> str:
    return new_id("case")


class ReconciliationRecord(models.Model):
    """One lookup of the provider, or one manual resolution: append-only evidence."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    effect = models.ForeignKey(
        Effect, on_delete=models.PROTECT, related_name="reconciliation_records"
    )
    kind = models.CharField(max_length=16, choices=RecordKind.choices)
    lookup_by = models.CharField(max_length=24, choices=LookupBy.choices, blank=True)
    lookup_status = models.CharField(max_length=16, choices=LookupStatus.choices, blank=True)
    http_status = models.PositiveSmallIntegerField(null=True, blank=True)
    provider_operation_id = models.CharField(max_length=200, blank=True)
    provider_status = models.CharField(max_length=32, blank=True)
    provider_digest = models.CharField(max_length=71, blank=True)
    # The effect's status when the lookup was decided, and what the gateway did.
    effect_status = models.CharField(max_length=24)
    outcome = models.CharField(max_length=16, choices=RecordOutcome.choices)
    # Which lookup of this effect it was (the effect's check_count after it).
    check_number = models.PositiveIntegerField(default=0)
    actor = models.CharField(max_length=200)
    principal = models.ForeignKey(
        Principal, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # Human-readable: why the outcome follows from the answer, or the operator's evidence.
    evidence = models.TextField()
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(kind__in=RecordKind.values), name="record_kind_valid"
            ),
            models.CheckConstraint(
                condition=Q(outcome__in=RecordOutcome.values), name="record_outcome_valid"
            ),
            # An operator's decision without evidence is not a record.
            models.CheckConstraint(
                condition=~Q(kind=RecordKind.MANUAL) | ~Q(evidence=""),
                name="record_manual_has_evidence",
            ),
        ]
        indexes = [
            models.Index(fields=["effect", "id"], name="record_effect"),
            # The reconciler's probe (reconciliation.bulk.effects_probe_escalated): which
            # providers were asked recently. Without it, a scan of every record, each sweep.
            models.Index(
                fields=["created_at"],
                name="record_recent_lookup",
                condition=Q(kind=RecordKind.LOOKUP),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.effect_id} {self.kind} {self.outcome}"


class Case(models.Model):
    """An effect handed to its owning team because the automatic paths gave up on it."""

    id = models.CharField(max_length=40, primary_key=True, default=new_case_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    effect = models.ForeignKey(Effect, on_delete=models.PROTECT, related_name="cases")
    # The contract's owning team, copied so that the queue filters without a join.
    owner = models.CharField(max_length=100)
    reason = models.CharField(max_length=32, choices=CaseReason.choices)
    reason_text = models.TextField()
    state = models.CharField(max_length=16, choices=CaseState.choices, default=CaseState.OPEN)
    # Ids, statuses and digests that led here; never the payload.
    evidence = models.JSONField(default=dict, blank=True)
    opened_by = models.CharField(max_length=200)
    opened_at = models.DateTimeField()
    acknowledged_by = models.ForeignKey(
        Principal, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.ForeignKey(
        Principal, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # Who or what resolved it: an operator's label, or the reconciler/webhook that settled it.
    resolved_actor = models.CharField(max_length=200, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolution = models.TextField(blank=True)

    class Meta:
        constraints = [
            # Two actors escalating the same effect at once (the reconciler and a webhook, two
            # reconcilers) collide here instead of opening two cases.
            models.UniqueConstraint(
                fields=["effect"],
                condition=Q(state__in=sorted(UNRESOLVED)),
                name="case_one_unresolved_per_effect",
            ),
            models.CheckConstraint(
                condition=Q(state__in=CaseState.values), name="case_state_valid"
            ),
            models.CheckConstraint(
                condition=~Q(state=CaseState.RESOLVED) | Q(resolved_at__isnull=False),
                name="case_resolved_has_time",
            ),
        ]
        indexes = [
            # The human queue: a tenant's unresolved cases, oldest first.
            models.Index(
                fields=["tenant", "opened_at"],
                name="case_queue",
                condition=Q(state__in=sorted(UNRESOLVED)),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.pk} {self.reason} {self.state}"


class WebhookDelivery(models.Model):
    """One asynchronous receipt from a provider, kept once per (provider, event id)."""

    provider = models.CharField(max_length=64)
    event_id = models.CharField(max_length=200)
    idempotency_key = models.CharField(max_length=330, blank=True)
    provider_operation_id = models.CharField(max_length=200, blank=True)
    provider_status = models.CharField(max_length=32, blank=True)
    payload_digest = models.CharField(max_length=71, blank=True)
    effect = models.ForeignKey(
        Effect, null=True, blank=True, on_delete=models.PROTECT, related_name="webhook_deliveries"
    )
    # The effect's status when the receipt arrived, and what it did.
    effect_status = models.CharField(max_length=24, blank=True)
    outcome = models.CharField(max_length=16, choices=WebhookOutcome.choices)
    detail = models.TextField(blank=True)
    signed_at = models.DateTimeField()
    received_at = models.DateTimeField()

    class Meta:
        constraints = [
            # A provider redelivering an event (at-least-once) hits this index: one row, one
            # effect on the ledger, however many copies arrive and however concurrently.
            models.UniqueConstraint(fields=["provider", "event_id"], name="webhook_unique_event"),
        ]

    def __str__(self) -> str:
        return f"{self.provider}:{self.event_id} {self.outcome}"


class OrphanReceipt(models.Model):
    """A provider receipt that names no command of ours: kept for a human, never dropped."""

    delivery = models.OneToOneField(
        WebhookDelivery, on_delete=models.PROTECT, related_name="orphan"
    )
    # The tenant named by the key's prefix, when it exists; None: nobody's (yet).
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    provider = models.CharField(max_length=64)
    idempotency_key = models.CharField(max_length=330, blank=True)
    provider_operation_id = models.CharField(max_length=200, blank=True)
    provider_status = models.CharField(max_length=32, blank=True)
    payload_digest = models.CharField(max_length=71, blank=True)
    result = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=16, choices=OrphanState.choices, default=OrphanState.OPEN)
    received_at = models.DateTimeField()
    resolved_by = models.ForeignKey(
        Principal, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolution = models.TextField(blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=OrphanState.values), name="orphan_state_valid"
            ),
        ]
        indexes = [
            models.Index(
                fields=["received_at"],
                name="orphan_open",
                condition=Q(state=OrphanState.OPEN),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.provider}:{self.provider_operation_id or self.idempotency_key}"


class Claim(models.Model):
    """Who is on an effect: taken by one principal of its tenant until released."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    effect = models.ForeignKey(Effect, on_delete=models.PROTECT, related_name="claims")
    principal = models.ForeignKey(Principal, on_delete=models.PROTECT, related_name="+")
    taken_at = models.DateTimeField()
    released_at = models.DateTimeField(null=True, blank=True)
    released_by = models.ForeignKey(
        Principal, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )

    class Meta:
        constraints = [
            # Two engineers taking the same effect at once: one of them gets it, the other is
            # told who did.
            models.UniqueConstraint(
                fields=["effect"],
                condition=Q(released_at__isnull=True),
                name="claim_one_holder_per_effect",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.effect_id} taken by {self.principal_id}"


class EffectTally(models.Model):
    """How many of a tenant's effects of one type are in one status, as of the tenant's audit
    chain position in its :class:`TallyHead`: the ``/metrics`` gauge ``gateway_effects`` reads
    its settled statuses from here instead of counting the effect table at every scrape.

    Kept by a periodic pass (``reconciliation.tally``) that adds up the status changes of the
    events sealed since its last pass; never by the writes of the hot path."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+", db_index=False)
    type = models.CharField(max_length=100)
    status = models.CharField(max_length=24)
    count = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "type", "status"], name="tally_key"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.type} {self.status}: {self.count}"


class TallyHead(models.Model):
    """Up to which position of the tenant's audit chain the tallies have counted; locked by
    the pass that advances it."""

    tenant = models.OneToOneField(
        Tenant, primary_key=True, on_delete=models.PROTECT, related_name="+"
    )
    position = models.BigIntegerField(default=0)
    # When a pass last advanced it.
    counted_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"tally of {self.tenant_id} at {self.position}"


class BulkJob(models.Model):
    """One action on a group of effects, started from the console and worked by a worker."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    started_by = models.ForeignKey(Principal, on_delete=models.PROTECT, related_name="+")
    action = models.CharField(max_length=32)
    # What the engineer saw: "billing.refund.create at billing, escalated".
    group = models.CharField(max_length=300)
    # The ids the group had when the job was started: the job never re-reads the filter.
    effect_ids = models.JSONField(default=list)
    # {effect id: outcome} for every effect handled: a redelivered job skips these.
    results = models.JSONField(default=dict)
    total = models.PositiveIntegerField()
    state = models.CharField(
        max_length=16, choices=BulkJobState.choices, default=BulkJobState.QUEUED
    )
    created_at = models.DateTimeField()
    # The worker working it writes this after every chunk; a stale one is taken over.
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    lease = models.CharField(max_length=32, blank=True, default="")
    finished_at = models.DateTimeField(null=True, blank=True)
    cancelled_by = models.ForeignKey(
        Principal, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    error = models.TextField(blank=True, default="")

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=BulkJobState.values), name="bulk_job_state_valid"
            ),
        ]
        indexes = [
            # The console's list of a tenant's recent jobs.
            models.Index(fields=["tenant", "-created_at"], name="bulk_job_recent"),
            # The sweep: jobs a worker should be on (bulk_jobs_resume).
            models.Index(
                fields=["heartbeat_at"],
                condition=Q(state__in=["queued", "running"]),
                name="bulk_job_active",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.action} of {self.total} ({self.state})"

    @property
    def done(self) -> int:
        return len(self.results)

    def outcomes(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for outcome in self.results.values():
            counts[outcome] = counts.get(outcome, 0) + 1
        return counts
