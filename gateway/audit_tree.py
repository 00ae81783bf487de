"""Each tenant's audit log as a Merkle tree (RFC 6962 / 9162): its sealed events, in sealing
order, are the leaves (``AuditLeaf``, written by the sequencer with each batch: gateway.audit),
and the gateway signs tree heads with the checkpoint key (gateway.checkpoints) and answers
inclusion and consistency proofs (``/api/v1/audit/...``). A witness (``manage.py
audit_witness``) cosigns heads it has checked; its cosignatures are kept beside the
checkpoints, outside the database.

Subtree hashes are computed from the stored leaf hashes on demand: a proof reads the tenant's
leaves up to the tree size, linear in the log (fine for tens of thousands of events per
tenant; the next step is cached interior nodes per complete power-of-two range).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.db import transaction
from django.utils import timezone

from gateway import audit, checkpoints
from gateway.errors import NotFound, ValidationProblem
from gateway.lib import merkle, treehead
from gateway.models import AuditChainHead, AuditLeaf, EffectEvent, Tenant


def size(tenant_id: int) -> int:
    """How many leaves the tenant's tree has (its sealed events with a leaf)."""
    last = (
        AuditLeaf.objects.filter(tenant_id=tenant_id)
        .order_by("-index")
        .values_list("index", flat=True)
        .first()
    )
    return 0 if last is None else last + 1


def leaf_hashes(tenant_id: int, tree_size: int) -> list[bytes]:
    """The first ``tree_size`` leaf hashes of the tenant, in order."""
    found = [
        bytes(value)
        for value in AuditLeaf.objects.filter(tenant_id=tenant_id, index__lt=tree_size)
        .order_by("index")
        .values_list("leaf_hash", flat=True)
    ]
    if len(found) != tree_size:
        raise NotFound(f"The tree has {len(found)} leaves below {tree_size}, not {tree_size}.")
    return found


def tree_head(tenant: Tenant) -> dict[str, Any]:
    """The tenant's current tree, signed with the checkpoint key."""
    with transaction.atomic():
        tree_size = size(tenant.pk)
        root = merkle.root(leaf_hashes(tenant.pk, tree_size))
    body = {
        "tenant": tenant.slug,
        "tenant_id": tenant.pk,
        "tree_size": tree_size,
        "root_hash": root.hex(),
        "timestamp": timezone.now().isoformat(),
    }
    return treehead.sign(body, checkpoints.signing_key())


def _tree_size(tenant_id: int, requested: int | None, field: str) -> int:
    current = size(tenant_id)
    if requested is None:
        return current
    if requested > current:
        raise ValidationProblem(
            f"The tree has {current} leaves; {field} {requested} is beyond it.",
            errors={field: [f"at most {current}"]},
        )
    return requested


def inclusion(tenant_id: int, event_id: int, tree_size: int | None) -> dict[str, Any]:
    """The audit path of the tenant's event ``event_id`` in its tree of ``tree_size`` (the
    current tree when None)."""
    leaf = AuditLeaf.objects.filter(tenant_id=tenant_id, event_id=event_id).first()
    if leaf is None:
        raise NotFound(f"Event {event_id} is not a sealed event of this tenant.")
    tree_size = _tree_size(tenant_id, tree_size, "tree_size")
    if leaf.index >= tree_size:
        raise ValidationProblem(
            f"Event {event_id} is leaf {leaf.index}, not in a tree of size {tree_size}.",
            errors={"tree_size": [f"more than {leaf.index}"]},
        )
    leaves = leaf_hashes(tenant_id, tree_size)
    return {
        "event_id": event_id,
        "leaf_index": leaf.index,
        "leaf_hash": bytes(leaf.leaf_hash).hex(),
        "tree_size": tree_size,
        "root_hash": merkle.root(leaves).hex(),
        "audit_path": [node.hex() for node in merkle.inclusion_proof(leaf.index, leaves)],
    }


def consistency(tenant_id: int, first: int, second: int | None) -> dict[str, Any]:
    """The proof that the tenant's tree of ``first`` leaves is a prefix of its tree of
    ``second`` (the current tree when None)."""
    second = _tree_size(tenant_id, second, "second")
    if not 0 <= first <= second:
        raise ValidationProblem(
            f"first ({first}) must be between 0 and second ({second}).",
            errors={"first": [f"between 0 and {second}"]},
        )
    leaves = leaf_hashes(tenant_id, second)
    return {
        "first": first,
        "second": second,
        "first_root": merkle.root(leaves[:first]).hex(),
        "second_root": merkle.root(leaves).hex(),
        "proof": [node.hex() for node in merkle.consistency_proof(first, leaves)],
    }


def leaf_problems(tenant_id: int) -> list[str]:
    """Where the stored leaves disagree with the chain: a leaf hash that is not the hash of
    its event's link body, or an event in another place (``verify_audit``)."""
    problems: list[str] = []
    order = audit.chain_event_ids(tenant_id)
    leaves = list(
        AuditLeaf.objects.filter(tenant_id=tenant_id)
        .order_by("index")
        .values_list("index", "event_id", "leaf_hash")
    )
    events = EffectEvent.objects.in_bulk([event_id for _, event_id, _ in leaves])
    for index, event_id, stored in leaves:
        if index >= len(order) or order[index] != event_id:
            problems.append(f"leaf {index} names event {event_id}, not the chain's event there")
            continue
        event = events.get(event_id)
        if event is None or merkle.leaf_hash(audit.leaf_bytes(event)) != bytes(stored):
            problems.append(f"leaf {index} (event {event_id}) does not match the event")
    return problems


# --- witness cosignatures, kept beside the checkpoints (outside the database) -------------------


def _cosignature_file(tenant_slug: str) -> Path:
    return checkpoints.checkpoint_dir() / f"{tenant_slug}.cosignatures.jsonl"


def cosignature_store(tenant: Tenant, head: Any, cosignature: Any) -> dict[str, Any]:
    """Keep a witness's cosignature of one of the tenant's heads, after checking that the head
    is the gateway's own and the cosignature verifies; appended to a file."""
    try:
        tree_size, root = treehead.check_head(head, checkpoints.public_key_b64())
        if head.get("tenant_id") != tenant.pk:
            raise treehead.Invalid("the tree head is of another tenant")
        witness_key = cosignature.get("witness_key") if isinstance(cosignature, dict) else None
        treehead.check_cosignature(head, cosignature, str(witness_key))
    except treehead.Invalid as exc:
        raise ValidationProblem(str(exc), errors={"cosignature": [str(exc)]}) from exc
    leaves = leaf_hashes(tenant.pk, tree_size) if tree_size <= size(tenant.pk) else None
    if leaves is None or merkle.root(leaves) != root:
        raise ValidationProblem(
            f"The tree of size {tree_size} has another root here.",
            errors={"head": ["not a head of this log"]},
        )
    line = {"head": head, "cosignature": cosignature, "received": timezone.now().isoformat()}
    path = _cosignature_file(tenant.slug)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(line, sort_keys=True) + "\n")
    return line


def cosignatures_read(tenant_slug: str) -> list[dict[str, Any]]:
    path = _cosignature_file(tenant_slug)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def chain_length(tenant_id: int) -> int:
    head = AuditChainHead.objects.filter(tenant_id=tenant_id).first()
    return head.length if head else 0
