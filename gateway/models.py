"""The effect ledger.

A *command* is what an agent asked for, frozen at submission and never updated. Its *effect*
carries the mutable bookkeeping (status, fence, schedule). *Attempts* and *receipts* are
append-only, and every change of an effect's status appends an *event* in the same
transaction.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import BrinIndex, HashIndex
from django.db import models
from django.db.models import F, Func, Q
from django.db.models.fields.json import KeyTextTransform

from gateway.choices import (
    BEFORE_DISPATCH,
    DISPATCHABLE,
    TO_RECONCILE,
    ApprovalState,
    AttemptState,
    CredentialState,
    EffectStatus,
    Outcome,
    Role,
    SavedViewPage,
)
from gateway.lib.ids import new_id


def new_effect_id() -> str:
    return new_id("eff")


class Tenant(models.Model):
    """An organisation whose agents, keys and effects are isolated from every other's."""

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.slug


class Principal(models.Model):
    """An agent or a person acting for a tenant, with one role."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="principals")
    name = models.CharField(max_length=150)
    role = models.CharField(max_length=16, choices=Role.choices)
    # Console login; agents have none.
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="principal",
    )
    frozen = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="principal_unique_name"),
            models.CheckConstraint(condition=Q(role__in=Role.values), name="principal_role_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.name}@{self.tenant.slug}"

    @property
    def label(self) -> str:
        return f"{self.role}:{self.name}"


class ApiToken(models.Model):
    """A bearer token, stored only as its SHA-256; the clear token is shown once."""

    principal = models.ForeignKey(Principal, on_delete=models.CASCADE, related_name="tokens")
    prefix = models.CharField(max_length=12)
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # None: never expires (issued so; by default agents' tokens get GATEWAY_AGENT_TOKEN_TTL
    # and people's GATEWAY_PERSON_TOKEN_TTL).
    expires_at = models.DateTimeField(null=True, blank=True)
    # The token this one replaced (rotation), for the audit trail.
    rotated_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.principal})"


class OAuthConnection(models.Model):
    """A remote MCP client (an OAuth application) an admin approved to act as one principal.

    Every access token of the application acts as ``principal`` under that principal's grants;
    revoking the connection ends its tokens at once.
    """

    application = models.OneToOneField(
        settings.OAUTH2_PROVIDER_APPLICATION_MODEL,
        on_delete=models.CASCADE,
        related_name="gateway_connection",
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="oauth_connections")
    principal = models.ForeignKey(
        Principal, on_delete=models.PROTECT, related_name="oauth_connections"
    )
    approved_by = models.CharField(max_length=200)
    approved_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=200, blank=True)

    def __str__(self) -> str:
        return f"{self.application_id} as {self.principal_id}"


class Capability(models.Model):
    """A grant under which an agent may submit: effect types, resources, budget, expiry.

    The budget is reserved at submission with one conditional UPDATE, so concurrent
    submissions can never overspend it; a revoked or expired grant also stops dispatch.
    """

    id = models.CharField(max_length=32, primary_key=True, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="capabilities")
    principal = models.ForeignKey(Principal, on_delete=models.PROTECT, related_name="capabilities")
    # fnmatch patterns: ["billing.refund.create"], ["ticket.*"], ["*"].
    effect_types = models.JSONField(default=list)
    # fnmatch pattern on "<resource type>:<resource id>", e.g. "order:ord_*"; "*" for any.
    resource_selector = models.CharField(max_length=200, default="*")
    budget_count = models.PositiveIntegerField(null=True, blank=True)
    budget_amount = models.BigIntegerField(null=True, blank=True)
    budget_currency = models.CharField(max_length=3, blank=True)
    spent_count = models.PositiveIntegerField(default=0)
    spent_amount = models.BigIntegerField(default=0)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_reason = models.TextField(blank=True)
    created_by = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "capabilities"
        constraints = [
            models.CheckConstraint(
                condition=Q(budget_count__isnull=True) | Q(spent_count__lte=F("budget_count")),
                name="capability_count_within_budget",
            ),
            models.CheckConstraint(
                condition=Q(budget_amount__isnull=True) | Q(spent_amount__lte=F("budget_amount")),
                name="capability_amount_within_budget",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} for {self.principal}"


class EffectTypeFreeze(models.Model):
    """An operator's stop on a whole effect type within a tenant: nothing of it dispatches."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    type = models.CharField(max_length=100)
    reason = models.TextField(blank=True)
    frozen_by = models.ForeignKey(Principal, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "type"], name="type_freeze_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.type} frozen in {self.tenant_id}"


class AuditChainHead(models.Model):
    """The last sealed link of a tenant's event hash chain; locked by the sequencer while it
    seals a batch (and by multi-row writers that need a tenant-wide order, see gateway.audit)."""

    tenant = models.OneToOneField(
        Tenant, primary_key=True, on_delete=models.PROTECT, related_name="+"
    )
    last_hash = models.CharField(max_length=64)
    last_event_id = models.BigIntegerField(null=True, blank=True)
    length = models.BigIntegerField(default=0)
    # When the last batch was sealed.
    sealed_at = models.DateTimeField(null=True, blank=True)
    # Every event of the tenant whose ``txid`` is below this is sealed (or was rolled back and
    # never existed): the sequencer looks for unsealed events from here on (gateway.audit).
    floor_txid = models.BigIntegerField(default=0)
    # The batches (ids) holding an event at or above the floor: the sealed events the
    # sequencer finds there are theirs. Usually the last one or two.
    reach = ArrayField(models.BigIntegerField(), default=list)

    def __str__(self) -> str:
        return f"chain of {self.tenant_id} at {self.length}"


class AuditBatch(models.Model):
    """One pass of the audit sequencer over a tenant: the events it found committed and not
    yet sealed, as the next links of the tenant's hash chain, in one row. Events are never
    rewritten to seal them (gateway.audit); like them, a batch is never updated or deleted."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+", db_index=False)
    # The chain positions (1, 2, …) of its first and last link.
    first = models.BigIntegerField()
    last = models.BigIntegerField()
    # Its events in chain order, and each one's link hash (32 bytes each, end to end), so that
    # verification names the first event that no longer matches its link.
    event_ids = ArrayField(models.BigIntegerField())
    links = models.BinaryField()
    # The chain's head before this batch, and after it (its last link, hex).
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)
    # The highest ``txid`` among its events: while it is at or above its tenant's floor, the
    # batch is in the head's ``reach``.
    max_txid = models.BigIntegerField()
    sealed_at = models.DateTimeField()

    class Meta:
        constraints = [
            # The chain in order, and the batch holding a given position (checkpoints).
            models.UniqueConstraint(fields=["tenant", "last"], name="audit_batch_chain"),
        ]

    def __str__(self) -> str:
        return f"links {self.first}-{self.last} of {self.tenant_id}"


class AuditLeaf(models.Model):
    """One leaf of a tenant's Merkle tree (gateway.audit_tree): a sealed event, at its place
    in sealing order (``index`` 0 is chain position 1), with SHA-256(0x00 || its link body).
    Written by the sequencer with the batch that seals the event; never updated or deleted."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+", db_index=False)
    index = models.BigIntegerField()
    event_id = models.BigIntegerField(db_index=True)
    leaf_hash = models.BinaryField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "index"], name="audit_leaf_order"),
        ]

    def __str__(self) -> str:
        return f"leaf {self.index} of {self.tenant_id}"


# The inserting transaction's id, as a bigint continuous across clusters (gateway migration
# 0013 defines the function; ``manage.py audit_rebase`` moves it on after a logical restore).
CURRENT_TXID = Func(function="gateway_txid", output_field=models.BigIntegerField())


class Command(models.Model):
    """What was asked, frozen at submission: never updated, never deleted."""

    effect_id = models.CharField(
        max_length=32, primary_key=True, default=new_effect_id, editable=False
    )
    # No index of its own: every query by tenant goes through an index that starts with it.
    tenant = models.ForeignKey(
        Tenant, on_delete=models.PROTECT, related_name="commands", db_index=False
    )
    type = models.CharField(max_length=100)
    # The version of the type's contract the command was submitted (validated, approved)
    # under (EffectContract.version); a later version of the contract does not change it.
    contract_version = models.PositiveIntegerField(default=1, db_default=1)
    provider = models.CharField(max_length=64)
    idempotency_key = models.CharField(max_length=255)
    # The key sent to the provider: scoped by tenant, because one provider account may serve
    # several tenants and a key belongs to one tenant (SPEC §5).
    provider_key = models.CharField(max_length=330)
    payload_digest = models.CharField(max_length=71)
    resource = models.JSONField()
    resource_type = models.CharField(max_length=64)
    resource_id = models.CharField(max_length=200)
    resource_version = models.BigIntegerField(null=True, blank=True)
    # The payload is sealed (encrypted) at rest; the clear JSON keeps personal fields redacted.
    payload_sealed = models.TextField()
    payload_redacted = models.JSONField()
    intent = models.JSONField(default=dict, blank=True)
    context = models.JSONField(default=dict, blank=True)
    # Neither is looked up from the other side (a principal's or a grant's commands), so
    # neither has an index to keep up at every submission.
    requested_by = models.ForeignKey(
        Principal, on_delete=models.PROTECT, related_name="commands", db_index=False
    )
    capability = models.ForeignKey(
        Capability,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="commands",
        db_index=False,
    )
    # What this command reserved from its capability's budget.
    budget_amount = models.BigIntegerField(default=0)
    approval_required = models.BooleanField()
    # Indexed by command_compensates below, for the few commands that compensate.
    compensates = models.ForeignKey(
        "Command",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="compensations",
        db_index=False,
    )
    # The API token it was submitted with (None: the console, the CLI, a saga, a
    # compensation). Dispatch refuses a command submitted after that token's revocation.
    submitted_with = models.ForeignKey(
        ApiToken, null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    # The saga run and step this command belongs to (sagas app); None for a lone command.
    saga_id = models.CharField(max_length=32, blank=True, default="")
    saga_step = models.CharField(max_length=100, blank=True)
    expires_at = models.DateTimeField()
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            # Concurrent submissions of one key race on this index, not on a prior SELECT.
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"], name="command_unique_key_per_tenant"
            ),
        ]
        indexes = [
            # The approvals inbox's "last confirmed change of this resource" (a deploy's
            # previous SHA); tests/console/test_flat_pages.py reads a page's worth through it.
            models.Index(fields=["tenant", "resource_type", "resource_id"]),
            # Provider webhooks find the command by the key they were sent.
            models.Index(fields=["provider", "provider_key"], name="command_provider_key"),
            # A saga's steps; most commands have no saga, so only those rows are indexed.
            models.Index(fields=["saga_id"], name="command_saga", condition=~Q(saga_id="")),
            # An effect's compensations (the console's effect page); likewise only those.
            models.Index(
                fields=["compensates"],
                name="command_compensates",
                condition=Q(compensates__isnull=False),
            ),
            # The approvals inbox's look-alikes: the tenant's commands with the same digest.
            # Hash indexes here and below: equality is all they serve, at a third of a b-tree.
            HashIndex(fields=["payload_digest"], name="command_digest"),
            # The console's search by customer id, for the payloads that name one.
            HashIndex(
                KeyTextTransform("customer_id", "payload_redacted"),
                name="command_customer",
                condition=Q(payload_redacted__has_key="customer_id"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.effect_id} {self.type}"


class Effect(models.Model):
    """The state of one command's execution; every change goes through gateway.services."""

    command = models.OneToOneField(
        Command,
        primary_key=True,
        on_delete=models.PROTECT,
        related_name="effect",
        db_column="effect_id",
    )
    # Copied from the command so that the list and triage queries need no join.
    # No index of its own: every query by tenant goes through an index that starts with it.
    tenant = models.ForeignKey(
        Tenant, on_delete=models.PROTECT, related_name="effects", db_index=False
    )
    type = models.CharField(max_length=100)
    owner = models.CharField(max_length=100)

    status = models.CharField(max_length=24, choices=EffectStatus.choices)
    status_changed_at = models.DateTimeField()
    # Incremented by every claim; a worker may write its outcome only with the current fence.
    fence = models.BigIntegerField(default=0)
    attempt_count = models.PositiveIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # When the dispatch sweeper may (re-)enqueue this effect; None: not waiting for dispatch.
    next_dispatch_at = models.DateTimeField(null=True, blank=True)
    # When the reconciler looks this effect up next; None: nothing to ask the provider.
    next_check_at = models.DateTimeField(null=True, blank=True)
    check_count = models.PositiveIntegerField(default=0)
    frozen = models.BooleanField(default=False)
    # The provider recorded something other than the command (digest, target).
    mismatch = models.BooleanField(default=False)
    # Handed to a human: the automatic paths have given up on it.
    escalated = models.BooleanField(default=False)
    provider_operation_id = models.CharField(max_length=200, blank=True)
    confirmed_at = models.DateTimeField(null=True, blank=True)

    approval_state = models.CharField(max_length=16, choices=ApprovalState.choices)
    # No index on this or compensated_by: nothing looks an effect up by either, and each
    # index takes an entry at every write of the effect (three per effect, none HOT).
    approved_by = models.ForeignKey(
        Principal, null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    approved_digest = models.CharField(max_length=71, blank=True)
    approved_at = models.DateTimeField(null=True, blank=True)

    compensated_by = models.ForeignKey(
        Command, null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=EffectStatus.values), name="effect_status_valid"
            ),
        ]
        indexes = [
            # GET /effects?status=…: newest first within a tenant (ids sort by time).
            models.Index(fields=["tenant", "status", "-command"], name="effect_tenant_status"),
            models.Index(fields=["tenant", "type", "-command"], name="effect_tenant_type"),
            models.Index(fields=["tenant", "owner", "-command"], name="effect_tenant_owner"),
            models.Index(fields=["tenant", "-command"], name="effect_tenant_newest"),
            # The dispatch sweeper: due PREPARED / NOT_STARTED effects.
            models.Index(
                fields=["next_dispatch_at"],
                name="effect_dispatch_due",
                condition=Q(status__in=sorted(DISPATCHABLE)),
            ),
            # The sweeper's expiry pass (every GATEWAY_SWEEP_INTERVAL): effects not yet sent,
            # joined to their command's expires_at. Without it, a full scan every few seconds.
            models.Index(
                fields=["status"],
                name="effect_before_dispatch",
                condition=Q(status__in=sorted(BEFORE_DISPATCH)),
            ),
            # Lease recovery: DISPATCHING claims whose lease ran out.
            models.Index(
                fields=["lease_expires_at"],
                name="effect_lease_due",
                condition=Q(status=EffectStatus.DISPATCHING),
            ),
            # The reconciler: due UNKNOWN / IN_PROGRESS lookups.
            models.Index(
                fields=["next_check_at"],
                name="effect_reconcile_due",
                condition=Q(status__in=sorted(TO_RECONCILE)),
            ),
            # A provider's webhook that names the operation but not the key, and the console's
            # search: the effect of a provider operation id (once the provider answered).
            HashIndex(
                fields=["provider_operation_id"],
                name="effect_operation",
                condition=~Q(provider_operation_id=""),
            ),
            # The triage queue: what needs a human, oldest first.
            models.Index(
                fields=["tenant", "status_changed_at"],
                name="effect_triage",
                condition=Q(status__in=["UNKNOWN", "COMPENSATION_FAILED", "IN_PROGRESS"])
                | Q(mismatch=True)
                | Q(escalated=True),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.pk} {self.status}"

    @property
    def effect_id(self) -> str:
        return self.pk


class Attempt(models.Model):
    """One dispatch try, written ("sending") before the provider is called."""

    # Indexed by the unique (effect, number) constraint, which starts with it.
    effect = models.ForeignKey(
        Effect, on_delete=models.PROTECT, related_name="attempts", db_index=False
    )
    number = models.PositiveIntegerField()
    fence = models.BigIntegerField()
    worker = models.CharField(max_length=200, blank=True)
    state = models.CharField(max_length=16, choices=AttemptState.choices)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, blank=True)
    http_status = models.PositiveSmallIntegerField(null=True, blank=True)
    provider_operation_id = models.CharField(max_length=200, blank=True)
    error = models.TextField(blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    # Who sent it (gateway.providers.registry.Sender): the adapter kind or factory, and the
    # credential's fingerprint (never the credential). NULL: the SPEC §6 adapter without a
    # credential (or an attempt from before these were recorded).
    adapter = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    credential_fingerprint = models.CharField(max_length=40, null=True, blank=True)  # noqa: DJ001

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["effect", "number"], name="attempt_unique_number"),
        ]
        indexes = [
            # Recovery's pass over attempts left "sending" (gateway.recovery): few rows.
            models.Index(
                fields=["started_at"], name="attempt_sending", condition=Q(state="sending")
            ),
            # The dashboard's roll-up (gateway.rollup): attempts finished in the last minutes.
            # Rows are written in time order, so a BRIN index of a few pages finds them.
            BrinIndex(fields=["finished_at"], name="attempt_finished_brin"),
            # Provider health (gateway.providers.health): the attempts of the last hour. BRIN:
            # attempts are written in time order, so a few pages of block ranges serve the
            # window, at almost no cost per insert (a b-tree would add an entry per attempt).
            BrinIndex(fields=["started_at"], name="attempt_started", autosummarize=True),
        ]

    def __str__(self) -> str:
        return f"{self.effect_id} #{self.number}"


class Receipt(models.Model):
    """What the provider says happened; written only from a provider answer or a lookup."""

    class Source(models.TextChoices):
        DISPATCH = "dispatch"
        RECONCILER = "reconciler"
        WEBHOOK = "webhook"
        # Recorded by a person who confirmed the effect by hand (``recorded_by``, ``evidence``).
        MANUAL = "manual"

    # Indexed by (effect, -received_at) below, which starts with it.
    effect = models.ForeignKey(
        Effect, on_delete=models.PROTECT, related_name="receipts", db_index=False
    )
    # Never looked up by attempt: no index to keep up at every receipt.
    attempt = models.ForeignKey(
        Attempt,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="receipts",
        db_index=False,
    )
    source = models.CharField(max_length=16, choices=Source.choices)
    provider = models.CharField(max_length=64)
    provider_operation_id = models.CharField(max_length=200)
    provider_status = models.CharField(max_length=32)
    payload_digest = models.CharField(max_length=71, blank=True)
    digest_matches = models.BooleanField()
    result = models.JSONField(default=dict, blank=True)
    result_digest = models.CharField(max_length=71)
    received_at = models.DateTimeField()
    # Who recorded a manual receipt and what proved it to them; blank for a provider's.
    recorded_by = models.CharField(max_length=200, blank=True, default="", db_default="")
    evidence = models.TextField(blank=True, default="", db_default="")
    # HMAC of the fields above under a key the database does not hold (gateway.checkpoints):
    # an edited receipt no longer matches it. Blank for receipts written before sealing.
    seal = models.CharField(max_length=64, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["effect", "-received_at"]),
            # The console's search by a provider operation id named in any receipt.
            HashIndex(fields=["provider_operation_id"], name="receipt_operation"),
            # The reconciler's check of receipts recorded by a person (a few rows).
            models.Index(
                fields=["received_at"],
                name="receipt_manual",
                condition=models.Q(source="manual"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.provider}:{self.provider_operation_id} {self.provider_status}"


class EffectEvent(models.Model):
    """An append-only line of an effect's history (or of a tenant's control actions): who or
    what, when, from, to, why."""

    # Neither has an index of its own: (tenant, id) and (effect, id) below start with them.
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+", db_index=False)
    # None for a tenant-level control action (a grant, a freeze of a type or principal).
    effect = models.ForeignKey(
        Effect,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="events",
        db_index=False,
    )
    # What a control action acted on: "capability:cap_…", "principal:name", "type:…".
    subject = models.CharField(max_length=200, blank=True)
    kind = models.CharField(max_length=40)
    from_status = models.CharField(max_length=24, blank=True)
    to_status = models.CharField(max_length=24, blank=True)
    actor = models.CharField(max_length=200)
    # Never looked up by principal: no index to keep up at every event.
    principal = models.ForeignKey(
        Principal, null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    reason = models.TextField(blank=True)
    # Evidence only (ids, status codes, digests); never the payload.
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()
    # The id of the transaction that inserted it (set by the database). An event is sealed into
    # its tenant's hash chain by an AuditBatch that names it, never by writing to it; the
    # sequencer finds the unsealed ones among those at or above its floor (gateway.audit).
    # NULL for events sealed before gateway migration 0013.
    txid = models.BigIntegerField(null=True, editable=False, db_default=CURRENT_TXID)

    class Meta:
        indexes = [
            models.Index(fields=["effect", "id"]),
            # The sequencer's search for unsealed events: a tenant's events from its floor on.
            models.Index(
                fields=["tenant", "txid"],
                name="event_seal_queue",
                condition=models.Q(txid__isnull=False),
            ),
            # The dashboard's roll-up (gateway.rollup): the status changes of the last minutes.
            # Events are appended in time order: a BRIN index, a few pages, no cost per insert
            # worth measuring (it is summarised by VACUUM, not at each insert).
            BrinIndex(fields=["created_at"], name="event_created_brin"),
        ]

    def __str__(self) -> str:
        return f"{self.effect_id} {self.kind} {self.from_status}->{self.to_status}"


class ProviderCredential(models.Model):
    """A tenant's own credential for one provider (its own Stripe account), sealed with the
    vault key; only its fingerprint and last 4 characters are ever shown."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    provider = models.CharField(max_length=100)
    # seal_bound of the secret, bound to the tenant, the provider and the fingerprint
    # (gateway.provider_credentials): a value copied from another row does not open.
    secret_sealed = models.TextField()
    # gateway.providers.config.fingerprint of the secret: what the attempts it sent record.
    fingerprint = models.CharField(max_length=40)
    # The secret's last 4 characters; "" when it is shorter than 16 (too much of it).
    last4 = models.CharField(max_length=4, blank=True)
    state = models.CharField(
        max_length=8, choices=CredentialState.choices, default=CredentialState.ACTIVE
    )
    created_by = models.CharField(max_length=200)
    created_at = models.DateTimeField()
    # When a newer credential replaced it (it still serves the effects it sent).
    rotated_at = models.DateTimeField(null=True, blank=True)
    retired_at = models.DateTimeField(null=True, blank=True)
    retired_by = models.CharField(max_length=200, blank=True)
    # The credential this one replaced (rotation).
    replaces = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # Its own rate limit ("25/s"), shared by every worker; "" for the provider's configured
    # one (gateway.providers.protection.credential_policy).
    rate_limit = models.CharField(max_length=32, blank=True, default="")

    class Meta:
        constraints = [
            # One active credential per tenant and provider: the one new sends use.
            models.UniqueConstraint(
                fields=["tenant", "provider"],
                condition=Q(state=CredentialState.ACTIVE),
                name="provider_credential_one_active",
            ),
            # A fingerprint names one credential of a tenant's provider (what a lookup asks
            # with is found by the attempt's fingerprint).
            models.UniqueConstraint(
                fields=["tenant", "provider", "fingerprint"],
                name="provider_credential_unique_fingerprint",
            ),
            models.CheckConstraint(
                condition=Q(state__in=CredentialState.values),
                name="provider_credential_state_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.provider} {self.fingerprint} ({self.state})"


class SavedView(models.Model):
    """A named query string of a console page (triage, search, audit), kept by its owner and,
    when shared, listed for every console user of the tenant (gateway.saved_views)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    owner = models.ForeignKey(Principal, on_delete=models.CASCADE, related_name="saved_views")
    page = models.CharField(max_length=16, choices=SavedViewPage.choices)
    name = models.CharField(max_length=80)
    # The page's filters as its own parser keeps them (never the page cursor).
    query = models.CharField(max_length=2000, blank=True)
    shared = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "page", "name"], name="saved_view_name"),
            models.CheckConstraint(
                condition=Q(page__in=SavedViewPage.values), name="saved_view_page_valid"
            ),
        ]
        indexes = [
            # The list of a page: the tenant's shared views and the caller's own.
            models.Index(fields=["tenant", "page"], name="saved_view_page"),
        ]

    def __str__(self) -> str:
        return f"{self.page} view {self.name!r} of {self.owner_id}"


class LedgerRollup(models.Model):
    """One tenant's ledger over one minute (``width`` 1) or one hour (60), per series, key and
    bucket: what the console's dashboard draws, counted by gateway.rollup from the ledger's
    append-only rows and recounted whole, so a second count of the same span is a no-op."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    # Minutes the row spans: 1 (the last hour's views) or 60 (the day's and the week's).
    width = models.PositiveSmallIntegerField()
    start = models.DateTimeField()
    # "status": status changes into ``key``; "attempt": finished attempts at provider ``key``,
    # by latency bucket, with the errors among them; "confirm": effects of provider ``key``
    # confirmed, by bucket of time since submission.
    series = models.CharField(max_length=16)
    key = models.CharField(max_length=100, blank=True)
    bucket = models.SmallIntegerField(default=0)
    count = models.BigIntegerField()
    errors = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            # The roll-up's upsert target, and the dashboard's range scan: a tenant's series at
            # one width from a start time on.
            models.UniqueConstraint(
                fields=["tenant", "series", "width", "start", "key", "bucket"],
                name="ledgerrollup_unique",
            ),
            models.CheckConstraint(condition=Q(width__in=[1, 60]), name="ledgerrollup_width"),
        ]
        indexes = [
            # The roll-up's newest minute (where the next pass starts) and its retention delete.
            models.Index(fields=["start"], name="ledgerrollup_start"),
        ]

    def __str__(self) -> str:
        return f"{self.series} {self.key} {self.start:%Y-%m-%d %H:%M} +{self.width}m"


class SigningKey(models.Model):
    """A key that signs approvals: a person's passkey (WebAuthn) or a machine's Ed25519 key.

    A passkey signs only once another approver or an admin confirmed it; a machine key is
    registered, and so confirmed, by an admin. Registration and confirmation are control
    events of the tenant's audit chain."""

    class Kind(models.TextChoices):
        PASSKEY = "passkey"
        ED25519 = "ed25519"

    principal = models.ForeignKey(Principal, on_delete=models.PROTECT, related_name="signing_keys")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    name = models.CharField(max_length=100, blank=True)
    # WebAuthn: the credential id (base64url); Ed25519: the key's fingerprint.
    credential_id = models.CharField(max_length=1400, unique=True)
    # WebAuthn: the COSE public key; Ed25519: the raw 32-byte key (both base64url).
    public_key = models.TextField()
    sign_count = models.BigIntegerField(default=0)
    # The WebAuthn relying party id the passkey was registered for ("" for a machine key).
    rp_id = models.CharField(max_length=253, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    confirmed_by = models.ForeignKey(
        Principal, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    confirmed_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(kind__in=["passkey", "ed25519"]), name="signing_key_kind_valid"
            ),
            # Nobody confirms their own key.
            models.CheckConstraint(
                condition=~Q(confirmed_by=F("principal")), name="signing_key_not_self_confirmed"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.name or self.credential_id[:12]} of {self.principal}"


class SigningChallenge(models.Model):
    """A one-use server nonce with a short expiry: a passkey registration's challenge, or the
    nonce that an approval challenge (gateway.lib.approval_challenge) binds."""

    nonce = models.CharField(max_length=64, primary_key=True)
    principal = models.ForeignKey(Principal, on_delete=models.CASCADE, related_name="+")
    purpose = models.CharField(max_length=16)  # "register" | "approve" | "reject"
    effect_id = models.CharField(max_length=32, blank=True)
    payload_digest = models.CharField(max_length=71, blank=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.purpose} challenge of {self.principal}"


class ApprovalSignature(models.Model):
    """The signature an approver's key gave over an approval challenge, stored with the
    approval and verified again at dispatch and by ``verify_audit``."""

    effect = models.ForeignKey(Effect, on_delete=models.PROTECT, related_name="signatures")
    principal = models.ForeignKey(Principal, on_delete=models.PROTECT, related_name="+")
    key = models.ForeignKey(SigningKey, on_delete=models.PROTECT, related_name="signatures")
    decision = models.CharField(max_length=16)
    payload_digest = models.CharField(max_length=71)
    nonce = models.CharField(max_length=64)
    # WebAuthn: the assertion as the authenticator gave it (base64url); Ed25519: signature only.
    authenticator_data = models.TextField(blank=True)
    client_data_json = models.TextField(blank=True)
    signature = models.TextField()
    sign_count = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.decision} of {self.effect_id} by {self.principal}"
