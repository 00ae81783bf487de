"""Standard Webhooks signatures (https://www.standardwebhooks.com): the sender's side.

``webhook-signature: v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">``, keyed with the
base64-decoded part of the ``whsec_…`` secret. Receivers verify with the reference library
(``standardwebhooks.Webhook(secret).verify(body, headers)``); the tests do exactly that.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def _key(secret: str) -> bytes:
    raw = secret.removeprefix(SECRET_PREFIX)
    return base64.b64decode(raw + "=" * (-len(raw) % 4))


def sign(secret: str, *, msg_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(secret: str, *, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, msg_id=msg_id, timestamp=timestamp, body=body),
        "content-type": "application/json",
    }
