"""The tamper-evident audit trail: every effect event becomes a link in its tenant's hash chain.

``hash = sha256(prev_hash ‖ JCS(event fields))``. Events are **inserted without any
tenant-wide lock** (``append``): the hot path only inserts a row. A sequencer
(``seal_pending``, the ``seal_audit`` beat task, every ``GATEWAY_AUDIT_SEAL_INTERVAL``
seconds) takes each tenant's chain head with ``FOR UPDATE SKIP LOCKED``, reads the tenant's
committed, unsealed events in id order, gives them the next chain positions and hashes, and
writes the batch and the new head in one transaction. Chain order is therefore the order in
which events became visible to the sequencer, not id order (a transaction that commits late
gets a later position than a higher id that committed first).

What protects an event between its commit and its seal (the sealing lag, about the interval):
the database trigger only. It refuses DELETE and any UPDATE except filling the seal of an
unsealed event once (gateway migration 0008). Once sealed, an event is also covered by
``manage.py verify_audit``, which catches what the trigger cannot (a superuser who disabled
it, an edited backup). docs/architecture.md, "Audit chain: sealed after commit", has the trade.

``lock_chain`` remains as the tenant-wide mutex of the writers that touch several rows of a
tenant in one transaction (the reconciler's case writes, the saga orchestrator): they take
the head first, then rows, so they queue on each other instead of deadlocking. A single
transition no longer takes it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from gateway.lib.digest import canonical_json
from gateway.models import AuditChainHead, EffectEvent

GENESIS = "0" * 64


def _link_body(event: EffectEvent) -> dict[str, Any]:
    body = _effect_link_body(event)
    if event.subject:
        body["subject"] = event.subject
    return body


def _effect_link_body(event: EffectEvent) -> dict[str, Any]:
    return {
        "tenant": event.tenant_id,
        "effect": event.effect_id,
        "kind": event.kind,
        "from": event.from_status,
        "to": event.to_status,
        "actor": event.actor,
        "principal": event.principal_id,
        "reason": event.reason,
        "data": event.data,
        "at": event.created_at.isoformat(),
    }


def link_hash(prev_hash: str, event: EffectEvent) -> str:
    return hashlib.sha256(prev_hash.encode() + canonical_json(_link_body(event))).hexdigest()


def lock_chain(tenant_id: int) -> AuditChainHead:
    """The tenant's chain head, locked until the caller's transaction ends."""
    head = AuditChainHead.objects.select_for_update().filter(tenant_id=tenant_id).first()
    if head is not None:
        return head
    try:
        with transaction.atomic():  # a savepoint: a concurrent creator may win
            AuditChainHead.objects.create(tenant_id=tenant_id, last_hash=GENESIS)
    except IntegrityError:
        pass
    return AuditChainHead.objects.select_for_update().get(tenant_id=tenant_id)


def append(event: EffectEvent) -> EffectEvent:
    """Insert ``event`` (unsaved), unsealed: no lock, one INSERT. Inside the caller's
    transaction it commits with the change it records; the sequencer seals it after."""
    event.prev_hash = event.hash = ""
    event.save(force_insert=True)
    return event


def _head_for_sealing(tenant_id: int) -> AuditChainHead | None:
    """The tenant's head, locked, or None when another sequencer (or a tenant-wide writer)
    holds it: that one will seal, this one moves on."""
    head = (
        AuditChainHead.objects.select_for_update(skip_locked=True)
        .filter(tenant_id=tenant_id)
        .first()
    )
    if head is not None or AuditChainHead.objects.filter(tenant_id=tenant_id).exists():
        return head
    try:
        with transaction.atomic():  # a savepoint: a concurrent creator may win
            AuditChainHead.objects.create(tenant_id=tenant_id, last_hash=GENESIS)
    except IntegrityError:
        pass
    return (
        AuditChainHead.objects.select_for_update(skip_locked=True)
        .filter(tenant_id=tenant_id)
        .first()
    )


def seal_tenant(tenant_id: int, *, batch: int | None = None) -> int:
    """Seal up to ``batch`` of the tenant's committed, unsealed events, in id order, as the
    next links of its chain. Returns how many were sealed (0 if another sequencer holds it)."""
    batch = batch or settings.GATEWAY_AUDIT_SEAL_BATCH
    with transaction.atomic():
        head = _head_for_sealing(tenant_id)
        if head is None:
            return 0
        events = list(
            EffectEvent.objects.filter(tenant_id=tenant_id, position__isnull=True).order_by("id")[
                :batch
            ]
        )
        if not events:
            return 0
        now = timezone.now()
        previous, position, rows = head.last_hash, head.length, []
        for event in events:
            position += 1
            digest = link_hash(previous, event)
            rows.append((event.pk, position, previous, digest))
            previous = digest
        values = ", ".join(["(%s, %s, %s, %s)"] * len(rows))
        with connection.cursor() as cursor:
            # One statement for the batch; the trigger lets it fill each seal exactly once.
            cursor.execute(
                f"""
                UPDATE gateway_effectevent AS event
                   SET position = sealed.position, prev_hash = sealed.prev_hash,
                       hash = sealed.hash, sealed_at = %s
                  FROM (VALUES {values}) AS sealed (id, position, prev_hash, hash)
                 WHERE event.id = sealed.id AND event.position IS NULL
                """,
                [now, *(value for row in rows for value in row)],
            )
            if cursor.rowcount != len(rows):  # pragma: no cover - the head lock forbids it
                raise IntegrityError(f"sealed {cursor.rowcount} of {len(rows)} events")
        AuditChainHead.objects.filter(pk=head.pk).update(
            last_hash=previous, last_event_id=events[-1].pk, length=position, sealed_at=now
        )
    return len(events)


def seal_pending(*, shard: int = 0, shards: int = 1, batch: int | None = None) -> int:
    """The sequencer's pass: seal every tenant of this shard (tenant id mod ``shards``) until
    nothing committed is left unsealed. Returns how many events were sealed."""
    tenants = (
        EffectEvent.objects.filter(position__isnull=True)
        .values_list("tenant_id", flat=True)
        .distinct()
    )
    sealed = 0
    for tenant_id in tenants:
        if tenant_id % shards != shard:
            continue
        while True:
            count = seal_tenant(tenant_id, batch=batch)
            sealed += count
            if count < (batch or settings.GATEWAY_AUDIT_SEAL_BATCH):
                break
    return sealed


@dataclass(frozen=True)
class SealState:
    """A tenant's sealed head and what waits behind it."""

    length: int
    last_hash: str
    sealed_at: Any
    unsealed: int
    oldest_unsealed_at: Any

    @property
    def lag_seconds(self) -> float:
        """How long the oldest committed, unsealed event has waited (0 when none)."""
        if self.oldest_unsealed_at is None:
            return 0.0
        return max(0.0, (timezone.now() - self.oldest_unsealed_at).total_seconds())


def seal_state(tenant_id: int) -> SealState:
    """The sealed head and the unsealed backlog (from the partial index), in one query."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT head.length, head.last_hash, head.sealed_at,
                   (SELECT count(*) FROM gateway_effectevent
                     WHERE tenant_id = %s AND position IS NULL),
                   (SELECT min(created_at) FROM gateway_effectevent
                     WHERE tenant_id = %s AND position IS NULL)
              FROM (SELECT 1) AS one
              LEFT JOIN gateway_auditchainhead AS head ON head.tenant_id = %s
            """,
            [tenant_id, tenant_id, tenant_id],
        )
        length, last_hash, sealed_at, unsealed, oldest = cursor.fetchone()
    return SealState(
        length=length or 0,
        last_hash=last_hash or GENESIS,
        sealed_at=sealed_at,
        unsealed=unsealed,
        oldest_unsealed_at=oldest,
    )


def record_control(
    *,
    tenant_id: int,
    kind: str,
    subject: str,
    actor: str,
    principal=None,
    reason: str = "",
    data: dict[str, Any] | None = None,
) -> EffectEvent:
    """A tenant-level control action (grant, revocation, freeze) as a link of the chain."""
    from django.utils import timezone

    with transaction.atomic():
        return append(
            EffectEvent(
                tenant_id=tenant_id,
                effect=None,
                subject=subject,
                kind=kind,
                actor=actor,
                principal=principal,
                reason=reason,
                data=data or {},
                created_at=timezone.now(),
            )
        )


@dataclass(frozen=True)
class Break:
    tenant_id: int
    event_id: int | None
    reason: str


def verify_tenant(tenant_id: int, *, batch: int = 5000) -> Break | None:
    """Walk one tenant's sealed chain in position order; the first broken link, or None."""
    previous = GENESIS
    count = 0
    last_position = 0
    while True:
        events = list(
            EffectEvent.objects.filter(tenant_id=tenant_id, position__gt=last_position).order_by(
                "position"
            )[:batch]
        )
        if not events:
            break
        for event in events:
            if event.prev_hash != previous:
                return Break(
                    tenant_id,
                    event.pk,
                    "prev_hash does not match the link before it "
                    "(an event was removed or inserted)",
                )
            if link_hash(previous, event) != event.hash:
                return Break(
                    tenant_id,
                    event.pk,
                    "hash does not match the event's contents (the event was altered)",
                )
            if event.position != count + 1:
                return Break(
                    tenant_id,
                    event.pk,
                    f"position {event.position} follows {count} (a sealed event was removed)",
                )
            previous = event.hash
            count += 1
            last_position = event.position
    head = AuditChainHead.objects.filter(tenant_id=tenant_id).first()
    if head is None:
        return None if count == 0 else Break(tenant_id, None, "the chain head is missing")
    if head.last_hash != previous or head.length != count:
        return Break(
            tenant_id,
            head.last_event_id,
            f"the chain head says {head.length} links ending {head.last_hash[:12]}…, the "
            f"table has {count} ending {previous[:12]}… (events were removed from the end)",
        )
    return None
