"""The tamper-evident audit trail: every effect event becomes a link in its tenant's hash chain.

``link = sha256(previous link ‖ JCS(event fields))``. Events are **inserted without any
tenant-wide lock** (``append``): the hot path only inserts a row, and **nothing ever writes to
an event again**. A sequencer (``seal_pending``, the ``seal_audit`` beat task, every
``GATEWAY_AUDIT_SEAL_INTERVAL`` seconds) takes each tenant's chain head with ``FOR UPDATE SKIP
LOCKED``, reads the tenant's committed events that no batch names yet, in transaction order,
and writes them as one ``AuditBatch`` row — their ids in chain order, each one's link hash,
the head before and after — together with the new head. Chain order is therefore the order
in which events became visible to the sequencer, not id order (a transaction that commits late
gets a later position than a higher id that committed first).

How the sequencer finds what is unsealed without marking events: each event carries the id of
the transaction that inserted it (``txid``, set by the database). When a pass has read every
committed event it could see, every transaction below its snapshot's ``xmin`` had ended, so an
event that becomes visible later has a ``txid`` at or above that ``xmin``: it becomes the
tenant's floor (``AuditChainHead.floor_txid``). The unsealed events are those at or above the
floor (index ``event_seal_queue``) that none of the batches still holding events at or above it
(``AuditChainHead.reach``, usually the last one or two) names: a range scan of a few rows, and
nothing at all to write when nothing committed. (The same reasoning as PgQ's
snapshot-bounded batches, without their wait for the oldest transaction of the cluster.)

What protects an event between its commit and its seal (the sealing lag, about the interval):
the database trigger only, which refuses every UPDATE and DELETE of an event (gateway migration
0013). Once sealed, an event is also covered by ``manage.py verify_audit``, which catches what
the trigger cannot (a superuser who disabled it, an edited backup). docs/concepts/audit.md,
"Sealed after commit", has the trade.

``lock_chain`` remains as the tenant-wide mutex of the writers that touch several rows of a
tenant in one transaction (the reconciler's case writes, the saga orchestrator): they take
the head first, then rows, so they queue on each other instead of deadlocking. A single
transition never takes it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from gateway.lib import merkle, prepared
from gateway.lib.digest import canonical_json
from gateway.models import AuditBatch, AuditChainHead, AuditLeaf, EffectEvent

GENESIS = "0" * 64
LINK_BYTES = 32

logger = logging.getLogger(__name__)


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


def leaf_bytes(event: EffectEvent) -> bytes:
    """The event's link body as canonical JSON: what its chain link and its Merkle leaf
    (gateway.audit_tree) hash."""
    return canonical_json(_link_body(event))


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
    """Insert ``event`` (unsaved): no lock, one INSERT. Inside the caller's transaction it
    commits with the change it records; the sequencer seals it after."""
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


# --- finding what is unsealed ------------------------------------------------------------------

# The transaction ids of this statement's snapshot, on the events' scale (gateway_txid()):
# below ``low`` every transaction has ended, except this one (a snapshot leaves its own
# transaction out of its xmin: what it writes after this pass must stay above the floor).
_HORIZON = """
SELECT LEAST(pg_snapshot_xmin(s), pg_current_xact_id_if_assigned())::text::bigint
           + gateway_txid_offset() AS low,
       pg_snapshot_xmax(s)::text::bigint + gateway_txid_offset() AS high
  FROM pg_current_snapshot() AS s
"""

# Events of the tenant at or above the floor that none of the batches in the head's reach
# names. The batches are read by primary key (a range over the batch table would be planned
# from a guess: the floor is a parameter), and the subquery does not depend on the event, so
# PostgreSQL hashes it once.
_UNSEALED = """
e.tenant_id = %(tenant)s AND e.txid >= %(floor)s
AND e.id NOT IN (SELECT unnest(b.event_ids) FROM gateway_auditbatch b
                  WHERE b.id = ANY (%(reach)s::bigint[]))
"""

_EVENT_FIELDS = [
    field for field in EffectEvent._meta.concrete_fields if field.column not in ("txid",)
]
_EVENT_COLUMNS = ", ".join(f'e."{field.column}"' for field in _EVENT_FIELDS)

# One statement, one snapshot: the horizon is read with the events it bounds.
_CANDIDATES = f"""
WITH horizon AS ({_HORIZON})
SELECT horizon.low, horizon.high, e.txid, {_EVENT_COLUMNS}
  FROM horizon
  LEFT JOIN LATERAL (
      SELECT e.* FROM gateway_effectevent e WHERE {_UNSEALED}
       ORDER BY e.txid, e.id LIMIT %(limit)s
  ) AS e ON true
"""

# The same without the floor: every event of the tenant that no batch names (an anti-join
# over the whole chain, which PostgreSQL hashes or merges). After a rebase only.
_CANDIDATES_ALL = f"""
WITH horizon AS ({_HORIZON})
SELECT horizon.low, horizon.high, e.txid, {_EVENT_COLUMNS}
  FROM horizon
  LEFT JOIN LATERAL (
      SELECT e.* FROM gateway_effectevent e
        LEFT JOIN (SELECT unnest(b.event_ids) AS id FROM gateway_auditbatch b
                    WHERE b.tenant_id = %(tenant)s) AS sealed ON sealed.id = e.id
       WHERE e.tenant_id = %(tenant)s AND e.txid IS NOT NULL AND sealed.id IS NULL
       ORDER BY e.txid, e.id LIMIT %(limit)s
  ) AS e ON true
"""


_DATA = [field.column for field in _EVENT_FIELDS].index("data")


class _ReadEvent:
    """An event as the sequencer reads it: the attributes a link hashes (``_link_body``) and
    its id, without a model instance (building one cost half of the sequencer's CPU)."""

    __slots__ = tuple(field.attname for field in _EVENT_FIELDS)

    def __init__(self, values) -> None:
        for name, value in zip(self.__slots__, values, strict=True):
            setattr(self, name, value)

    @property
    def pk(self) -> int:
        return self.id  # type: ignore[attr-defined]


def _event_from_row(values) -> EffectEvent:
    values = list(values)
    if isinstance(values[_DATA], str):
        values[_DATA] = json.loads(values[_DATA])  # jsonb arrives as text on this cursor
    # What link_hash and the batch read of an event, duck-typed.
    return _ReadEvent(values)  # type: ignore[return-value]


def seal_tenant(
    tenant_id: int, *, batch: int | None = None, everything: bool = False, after_full: bool = False
) -> int:
    """Seal up to ``batch`` of the tenant's committed, unsealed events, in the order of their
    transactions (and ids within one), as the next links of its chain (one AuditBatch row).
    Returns how many were sealed (0 if another sequencer holds the head, or if the sequencer
    is halted: see ``SealState.halted``).

    ``everything``: look past the floor, for any event no batch names (``audit_rebase``).
    ``after_full``: the previous call sealed a full batch; if this one finds nothing, it still
    raises the floor past that batch (else every idle pass would look at its last events)."""
    batch = batch or settings.GATEWAY_AUDIT_SEAL_BATCH
    with transaction.atomic():
        head = _head_for_sealing(tenant_id)
        if head is None:
            return 0
        rows = prepared.fetchall(
            _CANDIDATES_ALL if everything else _CANDIDATES,
            {
                "tenant": tenant_id,
                "floor": head.floor_txid,
                "reach": head.reach,
                "limit": batch,
            },
        )
        low, high = rows[0][0], rows[0][1]
        if high < head.floor_txid:
            _report_halted(tenant_id, head.floor_txid, high)
            return 0
        rows = [row for row in rows if row[2] is not None]
        if not rows:
            if after_full and low > head.floor_txid:
                AuditChainHead.objects.filter(pk=head.pk).update(
                    floor_txid=low, reach=_reaching(head.reach, low)
                )
            return 0
        events = [_event_from_row(row[3:]) for row in rows]
        previous, links, leaves = head.last_hash, [], []
        for position, event in enumerate(events, start=head.length):
            body = leaf_bytes(event)
            previous = hashlib.sha256(previous.encode() + body).hexdigest()
            links.append(bytes.fromhex(previous))
            leaves.append(
                AuditLeaf(
                    tenant_id=tenant_id,
                    index=position,
                    event_id=event.pk,
                    leaf_hash=merkle.leaf_hash(body),
                )
            )
        now = timezone.now()
        sealed = AuditBatch.objects.create(
            tenant_id=tenant_id,
            first=head.length + 1,
            last=head.length + len(events),
            event_ids=[event.pk for event in events],
            links=b"".join(links),
            prev_hash=head.last_hash,
            hash=previous,
            max_txid=max(row[2] for row in rows),
            sealed_at=now,
        )
        AuditLeaf.objects.bulk_create(leaves)
        # Everything visible below this snapshot's xmin is now sealed; when the batch limit
        # cut the read short, everything below the last transaction it reached (the read is
        # in transaction order), so that catching up on a backlog stays linear.
        reached = rows[-1][2] if len(events) == batch else low
        floor = max(head.floor_txid, min(low, reached))
        AuditChainHead.objects.filter(pk=head.pk).update(
            last_hash=previous,
            last_event_id=events[-1].pk,
            length=head.length + len(events),
            sealed_at=now,
            floor_txid=floor,
            reach=_reaching([*head.reach, sealed.pk], floor),
        )
    return len(events)


def _reaching(batch_ids: list[int], floor: int) -> list[int]:
    """Of these batches, those still holding an event at or above ``floor``."""
    if not batch_ids:
        return []
    return sorted(
        AuditBatch.objects.filter(pk__in=batch_ids, max_txid__gte=floor).values_list(
            "pk", flat=True
        )
    )


def _report_halted(tenant_id: int, floor: int, high: int) -> None:
    logger.error(
        "audit sequencer halted: PostgreSQL's transaction ids are behind the chain's floor "
        "(the ledger was restored into another cluster?); run manage.py audit_rebase",
        extra={"tenant_id": tenant_id, "floor_txid": floor, "next_txid": high},
    )


# Tenants of a shard with something to seal: per tenant (LATERAL: a probe of event_seal_queue
# from its floor, not a join over all events), stopping at the first unsealed event. An idle
# tenant costs an index lookup that finds nothing, or the few sealed events at its floor.
_TENANTS_WITH_WORK = """
SELECT t.id FROM gateway_tenant t
  LEFT JOIN gateway_auditchainhead h ON h.tenant_id = t.id
 CROSS JOIN LATERAL (
     SELECT 1 FROM gateway_effectevent e
      WHERE e.tenant_id = t.id AND e.txid >= COALESCE(h.floor_txid, 0)
        AND NOT EXISTS (
            SELECT 1 FROM gateway_auditbatch b
             WHERE b.id = ANY (h.reach) AND e.id = ANY (b.event_ids))
      -- in index order: the planner cannot see how few rows a parameter floor leaves
      ORDER BY e.txid LIMIT 1
 ) AS work
 WHERE t.id %% %(shards)s = %(shard)s
 ORDER BY t.id
"""


def seal_pending(*, shard: int = 0, shards: int = 1, batch: int | None = None) -> int:
    """The sequencer's pass: seal every tenant of this shard (tenant id mod ``shards``) until
    nothing committed is left unsealed. Returns how many events were sealed."""
    # Prepared (gateway.lib.prepared): this runs every half second, and planning it cost more
    # than running it.
    rows = prepared.fetchall(_TENANTS_WITH_WORK, {"shard": shard, "shards": shards})
    tenants = [tenant_id for (tenant_id,) in rows]
    sealed = 0
    for tenant_id in tenants:
        full = False
        while True:
            count = seal_tenant(tenant_id, batch=batch, after_full=full)
            sealed += count
            full = count == (batch or settings.GATEWAY_AUDIT_SEAL_BATCH)
            if not full:
                break
    return sealed


# --- reading the chain -------------------------------------------------------------------------


@dataclass(frozen=True)
class SealState:
    """A tenant's sealed head and what waits behind it."""

    length: int
    last_hash: str
    sealed_at: Any
    unsealed: int
    oldest_unsealed_at: Any
    # PostgreSQL's transaction ids went behind the chain's floor (a logical restore into
    # another cluster): the sequencer seals nothing until ``manage.py audit_rebase``.
    halted: bool = False

    @property
    def lag_seconds(self) -> float:
        """How long the oldest committed, unsealed event has waited (0 when none)."""
        if self.oldest_unsealed_at is None:
            return 0.0
        return max(0.0, (timezone.now() - self.oldest_unsealed_at).total_seconds())


_FLOOR = (
    "(SELECT COALESCE(max(floor_txid), 0) FROM gateway_auditchainhead WHERE tenant_id = %(tenant)s)"
)
_REACH = "(SELECT reach FROM gateway_auditchainhead WHERE tenant_id = %(tenant)s)"

_SEAL_STATE = f"""
WITH horizon AS ({_HORIZON})
SELECT h.length, h.last_hash, h.sealed_at, {_FLOOR} > horizon.high, waiting.count,
       waiting.oldest
  FROM horizon
  LEFT JOIN gateway_auditchainhead AS h ON h.tenant_id = %(tenant)s
 CROSS JOIN (
      SELECT count(*) AS count, min(e.created_at) AS oldest FROM gateway_effectevent e
       WHERE {_UNSEALED.replace("%(floor)s", _FLOOR).replace("%(reach)s", _REACH)}
 ) AS waiting
"""


def seal_state(tenant_id: int) -> SealState:
    """The sealed head and the unsealed backlog, in one query."""
    row = prepared.fetchone(_SEAL_STATE, {"tenant": tenant_id})
    assert row is not None  # aggregates: one row
    length, last_hash, sealed_at, halted, unsealed, oldest = row
    return SealState(
        length=length or 0,
        last_hash=last_hash or GENESIS,
        sealed_at=sealed_at,
        unsealed=unsealed,
        oldest_unsealed_at=oldest,
        halted=bool(halted),
    )


def chain_event_ids(tenant_id: int) -> list[int]:
    """The tenant's sealed events in chain order (position 1 first)."""
    ids: list[int] = []
    for event_ids in (
        AuditBatch.objects.filter(tenant_id=tenant_id)
        .order_by("last")
        .values_list("event_ids", flat=True)
    ):
        ids.extend(event_ids)
    return ids


def seal_times(event_ids: list[int]) -> dict[int, Any]:
    """When each of these events was sealed (those not sealed yet are left out)."""
    if not event_ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT sealed.id, b.sealed_at FROM gateway_auditbatch b, "
            "unnest(b.event_ids) AS sealed (id) "
            "WHERE b.tenant_id IN (SELECT DISTINCT tenant_id FROM gateway_effectevent "
            "WHERE id = ANY(%(ids)s)) AND sealed.id = ANY(%(ids)s)",
            {"ids": list(event_ids)},
        )
        return dict(cursor.fetchall())


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


# --- verifying ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Break:
    tenant_id: int
    event_id: int | None
    reason: str


def _batch_events(batches: list[AuditBatch]) -> dict[int, EffectEvent]:
    ids = [event_id for batch in batches for event_id in batch.event_ids]
    return EffectEvent.objects.in_bulk(ids)


def verify_tenant(tenant_id: int, *, batch: int = 200) -> Break | None:
    """Walk one tenant's sealed chain batch by batch, recomputing every link from the events;
    the first broken link, or None."""
    head = AuditChainHead.objects.filter(tenant_id=tenant_id).first()
    previous, position = GENESIS, 0
    seen: set[int] = set()
    while True:
        batches = list(
            AuditBatch.objects.filter(tenant_id=tenant_id, last__gt=position).order_by("last")[
                :batch
            ]
        )
        if not batches:
            break
        events = _batch_events(batches)
        for sealed in batches:
            found = _verify_batch(tenant_id, sealed, previous, position, events, seen, head)
            if found is not None:
                return found
            previous, position = sealed.hash, sealed.last
    if head is None:
        return None if position == 0 else Break(tenant_id, None, "the chain head is missing")
    if head.last_hash != previous or head.length != position:
        return Break(
            tenant_id,
            head.last_event_id,
            f"the chain head says {head.length} links ending {head.last_hash[:12]}…, the "
            f"batches have {position} ending {previous[:12]}… (events were removed from the "
            "end)",
        )
    return _unchained(tenant_id, head)


def _verify_batch(
    tenant_id: int,
    sealed: AuditBatch,
    previous: str,
    position: int,
    events: dict[int, EffectEvent],
    seen: set[int],
    head: AuditChainHead | None,
) -> Break | None:
    where = f"links {sealed.first}-{sealed.last}"
    first_id = sealed.event_ids[0] if sealed.event_ids else None
    if sealed.first != position + 1:
        return Break(
            tenant_id, first_id, f"{where} follow link {position} (a sealed batch was removed)"
        )
    if sealed.prev_hash != previous:
        return Break(
            tenant_id,
            first_id,
            f"{where} do not continue the chain (a sealed batch was removed or replaced)",
        )
    links = bytes(sealed.links)
    count = sealed.last - sealed.first + 1
    if len(sealed.event_ids) != count or len(links) != count * LINK_BYTES:
        return Break(tenant_id, first_id, f"{where}: the batch's lists disagree (it was altered)")
    for index, event_id in enumerate(sealed.event_ids):
        link = sealed.first + index
        if event_id in seen:
            return Break(tenant_id, event_id, f"link {link} seals an event twice (altered)")
        seen.add(event_id)
        event = events.get(event_id)
        if event is None:
            at_end = (
                head is not None
                and all(later not in events for later in sealed.event_ids[index:])
                and sealed.last == head.length
            )
            why = "events were removed from the end" if at_end else "events were removed"
            return Break(tenant_id, event_id, f"the event of link {link} is missing ({why})")
        if event.tenant_id != tenant_id:
            return Break(tenant_id, event_id, f"link {link} names another tenant's event")
        digest = link_hash(previous, event)
        if links[index * LINK_BYTES : (index + 1) * LINK_BYTES].hex() != digest:
            return Break(
                tenant_id,
                event_id,
                "hash does not match the event's contents (the event was altered)",
            )
        previous = digest
    if previous != sealed.hash:
        return Break(tenant_id, first_id, f"{where}: the batch's head is not its last link")
    return None


def _unchained(tenant_id: int, head: AuditChainHead) -> Break | None:
    """Events that no batch names and the sequencer will never look at: below the floor (or
    with no transaction id at all). Only a write with the triggers off makes one."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT e.id FROM gateway_effectevent e
              LEFT JOIN (SELECT unnest(b.event_ids) AS id FROM gateway_auditbatch b
                          WHERE b.tenant_id = %(tenant)s) AS sealed ON sealed.id = e.id
             WHERE e.tenant_id = %(tenant)s AND sealed.id IS NULL
               AND (e.txid IS NULL OR e.txid < %(floor)s)
             ORDER BY e.id LIMIT 1
            """,
            {"tenant": tenant_id, "floor": head.floor_txid},
        )
        row = cursor.fetchone()
    if row is None:
        return None
    return Break(
        tenant_id, row[0], "an event outside the chain that will never be sealed (inserted)"
    )


def link_at(tenant_id: int, position: int) -> tuple[str | None, str]:
    """The chain's link hash at ``position``, recomputed from the events of the batch that
    holds it (and that batch's stored head before it); None and why, when it cannot be."""
    sealed = (
        AuditBatch.objects.filter(tenant_id=tenant_id, last__gte=position).order_by("last").first()
    )
    if sealed is None or sealed.first > position:
        return None, "no such link"
    ids = sealed.event_ids[: position - sealed.first + 1]
    events = EffectEvent.objects.in_bulk(ids)
    previous = sealed.prev_hash
    for event_id in ids:
        event = events.get(event_id)
        if event is None:
            return None, f"the event of a link up to {position} is missing"
        previous = link_hash(previous, event)
    return previous, ""
