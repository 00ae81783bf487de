"""Idempotency keys that name a business intention, not an HTTP attempt.

The recipe: ``<effect-type>:<business-resource>:<intent-revision>:<scope>``, e.g.
``billing.refund.create:ord_881:incident_120-v1:refund-bot``. Everything in it comes from
the agent's plan, so a retry, a crash-and-rerun or a second worker computes the *same* key and
the gateway answers with the effect it already has. A random UUID per attempt defeats this:
every attempt becomes a new command and the customer is refunded twice.

A change of plan (another amount, another reason) is a new command: bump the revision.
"""

from __future__ import annotations

import hashlib
import re
import uuid

MAX_KEY_LENGTH = 255
_UNSAFE = re.compile(r"[^A-Za-z0-9._~@+=/-]+")


def _part(value: object) -> str:
    if value is None or isinstance(value, bool):
        raise ValueError(f"key part {value!r} is not a business value (an id, a revision, a name)")
    if isinstance(value, uuid.UUID):
        raise ValueError(
            "a UUID is not a business key part; derive the key from the plan (the resource, "
            "the revision), so that a retry computes the same key"
        )
    text = _UNSAFE.sub("-", str(value).strip()).strip("-")
    if not text:
        raise ValueError(f"key part {value!r} is empty once normalised")
    return text


def deterministic_key(*parts: object) -> str:
    """Join business values into a stable idempotency key.

    >>> deterministic_key("billing.refund.create", "ord_881", "incident_120", "v1")
    'billing.refund.create:ord_881:incident_120:v1'

    Parts are normalised (whitespace and separators become ``-``); a key longer than the
    gateway accepts keeps its readable head and ends with a digest of the whole.
    """
    if len(parts) < 2:
        raise ValueError("a key needs at least the effect type and the business resource")
    key = ":".join(_part(part) for part in parts)
    if len(key) <= MAX_KEY_LENGTH:
        return key
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return f"{key[: MAX_KEY_LENGTH - 33]}~{digest}"
