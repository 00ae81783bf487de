"""Signed checkpoints of each tenant's audit chain, kept outside the ledger database.

The hash chain (gateway.audit) proves the events agree with each other, not that they are the
events that were written: whoever can write the tables can rewrite an event and re-hash
everything after it, cut the tail and fix the head, or TRUNCATE events and heads together.
So the chain's head leaves the database. Periodically (beat, ``GATEWAY_CHECKPOINT_INTERVAL``)
each tenant's tree head — chain length, last hash, time — is signed with an Ed25519 key the
database never holds (``GATEWAY_AUDIT_SIGNING_KEY``) and appended to a file under
``GATEWAY_CHECKPOINT_DIR`` (one JSON line per checkpoint, opened append-only; in production
point it at storage the database host cannot rewrite, e.g. a write-once bucket mount).
``verify_audit --against FILE`` then proves the ledger *extends* each checkpoint: its first
``length`` links still end in the signed hash.

Two things the chain does not link are checked against it: each effect's current status must
be the ``to_status`` of its last status event, and each receipt carries a seal (HMAC-SHA256
under a key derived from the signing key) over its fields, so an edited receipt or status is
reported even when the chain itself is intact.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from gateway import audit
from gateway.lib.digest import canonical_json
from gateway.lib.secretfile import read_or_create
from gateway.models import AuditBatch, AuditChainHead, Effect, EffectEvent, Receipt, Tenant

VERSION = 1


# --- keys -------------------------------------------------------------------------------------


def _development_seed() -> bytes:
    path = settings.VAR_DIR / "audit_signing.key"
    return base64.b64decode(read_or_create(path, lambda: base64.b64encode(os.urandom(32)).decode()))


@cache
def _seed(raw: str) -> bytes:
    if not raw:
        if settings.PRODUCTION:
            raise ImproperlyConfigured("GATEWAY_AUDIT_SIGNING_KEY is required in production")
        return _development_seed()
    try:
        seed = base64.b64decode(raw, validate=True)
    except ValueError:
        seed = b""
    if len(seed) != 32:
        raise ImproperlyConfigured("GATEWAY_AUDIT_SIGNING_KEY must be 32 bytes, base64")
    return seed


def signing_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(_seed(settings.GATEWAY_AUDIT_SIGNING_KEY))


def public_key_b64(key: Ed25519PublicKey | None = None) -> str:
    key = key or signing_key().public_key()
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def _seal_key() -> bytes:
    return HKDF(
        algorithm=hashes.SHA256(), length=32, salt=None, info=b"effect-gateway receipt seal"
    ).derive(_seed(settings.GATEWAY_AUDIT_SIGNING_KEY))


# --- receipts ---------------------------------------------------------------------------------


class ReceiptFields(NamedTuple):
    """A receipt's sealed fields, named as on the model: what ``receipt_seal`` reads, for a
    statement that writes the row itself (gateway.fastpath_batch) and has no model to build
    (a model's keyword constructor cost the drainer a twentieth of its CPU per effect)."""

    effect_id: str
    attempt_id: int | None
    source: str
    provider: str
    provider_operation_id: str
    provider_status: str
    payload_digest: str
    digest_matches: bool
    result_digest: str
    received_at: datetime


def _receipt_body(receipt: Receipt | ReceiptFields) -> dict[str, Any]:
    body: dict[str, Any] = {
        "effect": receipt.effect_id,
        "attempt": receipt.attempt_id,
        "source": receipt.source,
        "provider": receipt.provider,
        "operation": receipt.provider_operation_id,
        "status": receipt.provider_status,
        "payload_digest": receipt.payload_digest,
        "digest_matches": receipt.digest_matches,
        "result_digest": receipt.result_digest,
        "at": receipt.received_at.isoformat(),
    }
    # A person's receipt seals who recorded it and why (a provider's has neither).
    recorded_by = getattr(receipt, "recorded_by", "")
    if recorded_by:
        body["recorded_by"] = recorded_by
        body["evidence"] = getattr(receipt, "evidence", "")
    return body


def receipt_seal(receipt: Receipt | ReceiptFields) -> str:
    """HMAC over a receipt's fields (set before it is inserted)."""
    return hmac.new(_seal_key(), canonical_json(_receipt_body(receipt)), "sha256").hexdigest()


def receipt_problems(tenant_id: int) -> list[str]:
    """Receipts whose fields no longer match their seal (or whose result its digest)."""
    from gateway.lib.digest import sha256_digest

    problems = []
    for receipt in Receipt.objects.filter(effect__tenant_id=tenant_id).order_by("pk").iterator():
        if not receipt.seal:
            continue  # written before receipts were sealed
        if not hmac.compare_digest(receipt.seal, receipt_seal(receipt)):
            problems.append(f"receipt {receipt.pk} of {receipt.effect_id} was altered")
        elif sha256_digest(receipt.result) != receipt.result_digest:
            problems.append(f"receipt {receipt.pk} of {receipt.effect_id}: result altered")
    return problems


def status_problems(tenant_id: int) -> list[str]:
    """Effects whose status is not the one their last status event moved them to."""
    last = (
        EffectEvent.objects.filter(effect_id=OuterRef("pk"))
        .exclude(to_status="")
        .order_by("-id")
        .values("to_status")[:1]
    )
    rows = (
        Effect.objects.filter(tenant_id=tenant_id)
        .annotate(chained=Subquery(last))
        .values_list("pk", "status", "chained")
    )
    return [
        f"effect {pk} is {status}, its events say {chained or 'nothing'}"
        for pk, status, chained in rows.iterator()
        if status != chained
    ]


# --- checkpoints ------------------------------------------------------------------------------


def _statement(body: dict[str, Any]) -> bytes:
    return canonical_json({key: body[key] for key in sorted(body) if key != "signature"})


def checkpoint_make(tenant: Tenant, *, now: datetime | None = None) -> dict[str, Any]:
    """The tenant's current tree head, signed."""
    head = AuditChainHead.objects.filter(tenant_id=tenant.pk).first()
    body: dict[str, Any] = {
        "version": VERSION,
        "tenant": tenant.slug,
        "tenant_id": tenant.pk,
        "length": head.length if head else 0,
        "head": head.last_hash if head else "0" * 64,
        "last_event_id": head.last_event_id if head else None,
        "at": (now or timezone.now()).isoformat(),
        "key": public_key_b64(),
    }
    body["signature"] = base64.b64encode(signing_key().sign(_statement(body))).decode()
    return body


def checkpoint_dir() -> Path:
    return Path(settings.GATEWAY_CHECKPOINT_DIR)


def _file(tenant_slug: str) -> Path:
    return checkpoint_dir() / f"{tenant_slug}.jsonl"


def checkpoint_write(checkpoint: dict[str, Any]) -> Path:
    """Append one checkpoint line; the file is only ever opened for appending."""
    path = _file(checkpoint["tenant"])
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    with os.fdopen(fd, "a") as handle:
        handle.write(json.dumps(checkpoint, sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    return path


def checkpoints_write_all() -> int:
    """Beat: one checkpoint per tenant whose chain moved since its last checkpoint. What is
    committed is sealed first (gateway.audit), so the checkpoint names the current head."""
    audit.seal_pending()
    written = 0
    for tenant in Tenant.objects.order_by("pk"):
        checkpoint = checkpoint_make(tenant)
        previous = checkpoints_read(tenant.slug)[-1:]
        if previous and previous[0]["head"] == checkpoint["head"]:
            continue
        checkpoint_write(checkpoint)
        written += 1
    return written


def checkpoints_read(tenant_slug: str, *, limit: int | None = None) -> list[dict[str, Any]]:
    path = _file(tenant_slug)
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    if limit is not None:
        lines = lines[-limit:]
    return [json.loads(line) for line in lines if line.strip()]


def load(source: str) -> list[dict[str, Any]]:
    """Checkpoints from a file (JSON lines, or one JSON object) or a JSON string."""
    text = source.strip()
    if not text.startswith(("{", "[")):
        text = Path(source).read_text(encoding="utf-8").strip()
    if text.startswith("[") or (text.startswith("{") and "\n" not in text):
        value = json.loads(text)
        return value if isinstance(value, list) else [value]
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@dataclass(frozen=True)
class Verdict:
    tenant: str
    length: int
    ok: bool
    reason: str


def checkpoint_verify(checkpoint: dict[str, Any], *, trusted_key: str | None = None) -> Verdict:
    """Does the ledger extend ``checkpoint``? Signature first, then the link at ``length``."""
    tenant_slug = str(checkpoint.get("tenant", "?"))
    length = checkpoint.get("length")
    if not isinstance(length, int) or length < 0:
        return Verdict(tenant_slug, -1, False, "the checkpoint has no valid length")
    key_b64 = trusted_key or public_key_b64()
    if checkpoint.get("key") != key_b64:
        return Verdict(tenant_slug, length, False, "signed by another key than the trusted one")
    try:
        Ed25519PublicKey.from_public_bytes(base64.b64decode(key_b64)).verify(
            base64.b64decode(checkpoint.get("signature", "")), _statement(checkpoint)
        )
    except (InvalidSignature, ValueError):
        return Verdict(tenant_slug, length, False, "the signature does not verify")
    tenant = Tenant.objects.filter(slug=tenant_slug).first()
    if tenant is None or tenant.pk != checkpoint.get("tenant_id"):
        return Verdict(tenant_slug, length, False, "the tenant is missing from the ledger")
    if length == 0:
        return Verdict(tenant_slug, 0, True, "an empty chain is extended by anything")
    found, problem = audit.link_at(tenant.pk, length)
    if found is None:
        total = (
            AuditBatch.objects.filter(tenant_id=tenant.pk)
            .order_by("-last")
            .values_list("last", flat=True)
            .first()
        ) or 0
        return Verdict(
            tenant_slug,
            length,
            False,
            f"the ledger has {total} links, the checkpoint {length}; {problem} "
            "(events were removed)",
        )
    if found != checkpoint["head"]:
        return Verdict(
            tenant_slug,
            length,
            False,
            f"link {length} is {found[:12]}…, the checkpoint signed {checkpoint['head'][:12]}… "
            "(history before the checkpoint was rewritten)",
        )
    return Verdict(tenant_slug, length, True, "the ledger extends the checkpoint")


def fingerprint() -> str:
    """A short name of the signing key, for people comparing keys."""
    return hashlib.sha256(base64.b64decode(public_key_b64())).hexdigest()[:16]
