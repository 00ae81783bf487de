"""Encryption of payloads at rest with Fernet (AES-128-CBC + HMAC-SHA256, from ``cryptography``).

``GATEWAY_VAULT_KEY`` holds one or more comma-separated Fernet keys. The first encrypts; all of
them decrypt, so a key is rotated by putting the new one first and re-sealing at leisure
(``MultiFernet.rotate``). Without a key, development generates one under ``var/`` and
production (``GATEWAY_PRODUCTION=true``) refuses to start.
"""

from __future__ import annotations

import json
import os
from functools import cache
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

__all__ = ["InvalidToken", "open_json", "seal_json"]


def _development_key() -> str:
    path = settings.VAR_DIR / "vault.key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(Fernet.generate_key().decode())
    return path.read_text().strip()


@cache
def _fernet() -> MultiFernet:
    raw = settings.GATEWAY_VAULT_KEY
    if not raw:
        if os.environ.get("GATEWAY_PRODUCTION", "").lower() in {"1", "true", "yes"}:
            raise ImproperlyConfigured("GATEWAY_VAULT_KEY is required in production")
        raw = _development_key()
    try:
        return MultiFernet([Fernet(key.strip()) for key in raw.split(",") if key.strip()])
    except ValueError as exc:
        raise ImproperlyConfigured(f"GATEWAY_VAULT_KEY is not a Fernet key: {exc}") from None


def seal_json(value: Any) -> str:
    return _fernet().encrypt(json.dumps(value, separators=(",", ":")).encode()).decode()


def open_json(token: str) -> Any:
    return json.loads(_fernet().decrypt(token.encode()))


def reseal(token: str) -> str:
    """The same plaintext under the current primary key (key rotation)."""
    return _fernet().rotate(token.encode()).decode()
