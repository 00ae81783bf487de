"""Webhook signatures: HMAC-SHA256 over ``f"{timestamp}.{body}"`` with a per-provider secret.

Headers: ``X-Gateway-Timestamp`` (Unix seconds) and ``X-Gateway-Signature: v1=<hex>`` (several
``v1=`` entries, comma-separated, are accepted, so a provider can sign with an old and a new
secret while they are rotated). A timestamp more than :data:`TOLERANCE` seconds away from now
is refused, so a captured request cannot be replayed later.
"""

from __future__ import annotations

import hashlib
import hmac

TOLERANCE = 300
SCHEME = "v1"


class BadSignature(Exception):
    """The request is not provably from the provider (or not from now)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason  # a short slug, for the refusal counter


def sign(secret: str, timestamp: int | str, body: bytes) -> str:
    """The header value a provider sends: ``v1=<hex>``."""
    message = f"{timestamp}.".encode() + body
    return f"{SCHEME}=" + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def verify(
    *, secret: str, timestamp: str | None, signature: str | None, body: bytes, now: float
) -> int:
    """The signed timestamp, or :class:`BadSignature` saying why not."""
    if not secret:
        raise BadSignature("unconfigured", "this provider has no webhook secret here")
    if not timestamp or not signature:
        raise BadSignature("missing", "X-Gateway-Timestamp and X-Gateway-Signature are required")
    try:
        signed_at = int(timestamp)
    except ValueError:
        raise BadSignature("malformed", "X-Gateway-Timestamp must be Unix seconds") from None
    if abs(now - signed_at) > TOLERANCE:
        raise BadSignature("stale", f"the signature is older (or newer) than {TOLERANCE} seconds")
    # Over the header exactly as sent: that string is what the provider signed.
    expected = sign(secret, timestamp, body)
    offered = [part.strip() for part in signature.split(",")]
    # compare_digest against every offered entry: no early exit that a timing attack could read.
    matches = [hmac.compare_digest(expected, candidate) for candidate in offered]
    if not any(matches):
        raise BadSignature("mismatch", "the signature does not match")
    return signed_at
