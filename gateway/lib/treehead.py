"""Signed tree heads and the checks on them that need no database: the signature of a head,
an event's inclusion under a head, and consistency between two heads (gateway.lib.merkle).

A head is ``{"kind", "tenant", "tenant_id", "tree_size", "root_hash", "timestamp", "key",
"signature"}``: the signature is Ed25519 over the canonical JSON of every other field, so a
tree head can never be read as a chain checkpoint (gateway.checkpoints) signed by the same
key. A witness cosignature (``manage.py audit_witness``) is its own key's signature over the
tree the head names (tenant, size, root, gateway key) and the time it checked it.
``verify_audit`` and the witness run these checks on files and HTTP answers alone.
"""

from __future__ import annotations

import base64
import hashlib
from datetime import UTC, datetime
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from gateway.lib import merkle
from gateway.lib.digest import canonical_json

KIND = "effect-gateway tree head v1"
COSIGNED = "effect-gateway tree head cosignature v1"
FIELDS = ("kind", "tenant", "tenant_id", "tree_size", "root_hash", "timestamp", "key")


class Invalid(Exception):
    """A head, proof or cosignature that does not check out; the message says why."""


def public_b64(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def fingerprint(key_b64: str) -> str:
    """A short name of a public key, for people comparing keys."""
    return hashlib.sha256(base64.b64decode(key_b64)).hexdigest()[:16]


def _statement(head: dict[str, Any]) -> bytes:
    return canonical_json({field: head.get(field) for field in FIELDS})


def _cosigned(head: dict[str, Any], witnessed_at: Any) -> bytes:
    """What a witness signs: the tree (not the head's own timestamp: the gateway signs a
    fresh head at every request) and when the witness checked it."""
    body = {field: head.get(field) for field in ("tenant", "tenant_id", "tree_size", "key")}
    body.update(kind=COSIGNED, root_hash=head.get("root_hash"), witnessed_at=witnessed_at)
    return canonical_json(body)


def sign(body: dict[str, Any], key: Ed25519PrivateKey) -> dict[str, Any]:
    """``body`` (tenant, tenant_id, tree_size, root_hash, timestamp) as a signed head."""
    head = {**body, "kind": KIND, "key": public_b64(key)}
    head["signature"] = base64.b64encode(key.sign(_statement(head))).decode()
    return head


def cosign(head: dict[str, Any], key: Ed25519PrivateKey) -> dict[str, Any]:
    """A witness's signature over ``head`` (which it has checked)."""
    witnessed_at = datetime.now(UTC).isoformat()
    signature = key.sign(_cosigned(head, witnessed_at))
    return {
        "tree_size": head["tree_size"],
        "root_hash": head["root_hash"],
        "witnessed_at": witnessed_at,
        "witness_key": public_b64(key),
        "signature": base64.b64encode(signature).decode(),
    }


def _verify(key_b64: str, signature: Any, statement: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(base64.b64decode(key_b64, validate=True)).verify(
            base64.b64decode(str(signature), validate=True), statement
        )
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def _shape(head: Any) -> tuple[int, bytes]:
    if not isinstance(head, dict) or head.get("kind") != KIND:
        raise Invalid("not a tree head (no kind " + repr(KIND) + ")")
    size, root = head.get("tree_size"), head.get("root_hash")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise Invalid("the tree head has no valid tree_size")
    try:
        raw = bytes.fromhex(str(root))
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise Invalid(f"the tree head of size {size} has no valid root_hash")
    return size, raw


def check_head(head: Any, trusted_key: str) -> tuple[int, bytes]:
    """The head's size and root when it is signed by ``trusted_key`` (base64), else Invalid."""
    size, root = _shape(head)
    if head.get("key") != trusted_key:
        raise Invalid(
            f"the tree head of size {size} is signed by key {fingerprint_or(head.get('key'))}, "
            f"not by the trusted {fingerprint_or(trusted_key)}"
        )
    if not _verify(trusted_key, head.get("signature"), _statement(head)):
        raise Invalid(f"the signature of the tree head of size {size} does not verify")
    return size, root


def check_cosignature(head: dict[str, Any], cosignature: Any, witness_key: str) -> None:
    """Invalid unless ``cosignature`` is ``witness_key``'s signature over ``head``."""
    if not isinstance(cosignature, dict) or cosignature.get("witness_key") != witness_key:
        raise Invalid("the cosignature is not by the trusted witness key")
    statement = _cosigned(head, cosignature.get("witnessed_at"))
    if not _verify(witness_key, cosignature.get("signature"), statement):
        raise Invalid(f"the witness cosignature of size {head.get('tree_size')} does not verify")


def fingerprint_or(key: Any) -> str:
    try:
        return fingerprint(str(key))
    except ValueError:
        return "(none)"


def _hashes(values: Any, what: str) -> list[bytes]:
    if not isinstance(values, list):
        raise Invalid(f"the {what} is not a list of hashes")
    try:
        found = [bytes.fromhex(str(value)) for value in values]
    except ValueError:
        found = []
    if len(found) != len(values) or any(len(value) != 32 for value in found):
        raise Invalid(f"the {what} holds something other than 32-byte hex hashes")
    return found


def check_inclusion(head: dict[str, Any], proof: Any, trusted_key: str) -> None:
    """Invalid unless ``proof`` (leaf_index, leaf_hash, audit_path) proves a leaf of the tree
    that ``head``, signed by ``trusted_key``, commits to."""
    size, root = check_head(head, trusted_key)
    if not isinstance(proof, dict):
        raise Invalid("the inclusion proof is not an object")
    index = proof.get("leaf_index")
    if proof.get("tree_size") not in (None, size):
        raise Invalid(f"the proof is for size {proof.get('tree_size')}, the head is of {size}")
    leaf = _hashes([proof.get("leaf_hash")], "leaf hash")[0]
    path = _hashes(proof.get("audit_path"), "audit path")
    if not isinstance(index, int) or not merkle.verify_inclusion(leaf, index, size, path, root):
        raise Invalid(
            f"leaf {index} ({leaf.hex()[:12]}…) is not in the tree of size {size} "
            f"with root {root.hex()[:12]}…"
        )


def check_consistency(
    first: dict[str, Any], second: dict[str, Any], proof: Any, trusted_key: str
) -> None:
    """Invalid unless the tree of ``first`` is a prefix of the tree of ``second`` (both heads
    signed by ``trusted_key``) by ``proof`` (a list of hex hashes, or ``{"proof": [...]}``)."""
    m, first_root = check_head(first, trusted_key)
    n, second_root = check_head(second, trusted_key)
    if first.get("tenant_id") != second.get("tenant_id"):
        raise Invalid("the two tree heads are of different tenants")
    path = _hashes(proof.get("proof") if isinstance(proof, dict) else proof, "consistency proof")
    if not merkle.verify_consistency(m, n, first_root, second_root, path):
        raise Invalid(
            f"the log was rewritten: the tree of size {n} with root {second_root.hex()} "
            f"does not extend the tree of size {m} with root {first_root.hex()}"
        )
