"""The tamper-evident audit trail: every effect event is a link in its tenant's hash chain.

``hash = sha256(prev_hash ‖ JCS(event fields))``. Appending takes the tenant's chain head
with ``SELECT … FOR UPDATE``, so one tenant's events are chained in commit order (ids are
assigned while the lock is held, so id order is chain order). On PostgreSQL a trigger
refuses UPDATE and DELETE on the event table; ``manage.py verify_audit`` recomputes every
chain and reports the first broken link, which catches what the trigger cannot (a superuser
who disabled it, a restored backup that was edited).

Lock order: the chain head is locked *before* an effect row is updated (``lock_chain`` at
the top of every transition), so two transactions that touch two effects of one tenant
queue on the head instead of deadlocking on the rows.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction

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
    """Chain and insert ``event`` (unsaved). Inside the caller's transaction it commits with
    the change it records (the head stays locked until then); called alone, it is its own."""
    with transaction.atomic():
        head = lock_chain(event.tenant_id)
        event.prev_hash = head.last_hash
        event.hash = link_hash(head.last_hash, event)
        event.save(force_insert=True)
        AuditChainHead.objects.filter(pk=head.pk).update(
            last_hash=event.hash, last_event_id=event.pk, length=head.length + 1
        )
    return event


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
    """Walk one tenant's chain in order; the first broken link, or None."""
    previous = GENESIS
    count = 0
    last_id = 0
    while True:
        events = list(
            EffectEvent.objects.filter(tenant_id=tenant_id, id__gt=last_id).order_by("id")[:batch]
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
            previous = event.hash
            count += 1
            last_id = event.pk
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
