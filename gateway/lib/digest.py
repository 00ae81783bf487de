"""The payload digest that binds an idempotency key to exactly one command.

SPEC §5: ``"sha256:" + hex(sha256(JCS({"type": ..., "resource": ..., "payload": ...})))``
with JCS the RFC 8785 canonical JSON. The intent text is deliberately left out: an agent
may reword its explanation without changing what will be executed.
"""

import hashlib
from typing import Any

import rfc8785

PREFIX = "sha256:"


def canonical_json(value: Any) -> bytes:
    """RFC 8785 canonical bytes of a JSON value."""
    return rfc8785.dumps(value)


def sha256_digest(value: Any) -> str:
    """``sha256:<hex>`` of the canonical JSON of ``value``."""
    return PREFIX + hashlib.sha256(canonical_json(value)).hexdigest()


def payload_digest(*, type: str, resource: dict, payload: dict) -> str:
    """The digest of a command: what an approver signs and a provider must echo back."""
    return sha256_digest({"type": type, "resource": resource, "payload": payload})
