"""Encryption of payloads at rest (from ``cryptography``).

``GATEWAY_VAULT_KEY`` holds one or more comma-separated Fernet keys. The first encrypts; all of
them decrypt, so a key is rotated by putting the new one first and re-sealing at leisure.
Without a key, development generates one under ``var/`` and production
(``GATEWAY_PRODUCTION=true``) refuses to start.

Two formats:

* ``seal_json``/``open_json``: Fernet (AES-128-CBC + HMAC-SHA256), for secrets that belong to
  no command (webhook secrets, saga inputs).
* ``seal_bound``/``open_bound``: AES-256-GCM with *associated data* naming what the
  ciphertext belongs to (a command's effect id and payload digest). A ciphertext copied from
  another command into this one's row does not open: the database allows re-sealing the
  payload column (for rotation), so without the binding anyone who can write that column could
  swap what an approver approved for another command's payload, with no key. The AES key of
  each Fernet key is derived from it with HKDF, so configuration and rotation stay as they are.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from functools import cache
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from gateway.lib.secretfile import read_or_create

__all__ = ["InvalidToken", "open_bound", "open_json", "seal_bound", "seal_json"]

BOUND_PREFIX = "g1:"


@cache
def _development_key(path: Path) -> str:
    """The development key under ``var/``, read once per process: every seal and opening
    asked for it, and reading the file was two thirds of a seal's cost. Nothing rewrites it
    (a rotation puts keys in GATEWAY_VAULT_KEY)."""
    return read_or_create(path, lambda: Fernet.generate_key().decode())


# (VAR_DIR as last read, its development key): building ``VAR_DIR / "vault.key"`` and hashing
# the path for the cache above cost a third of a seal; the same settings object needs neither.
_last_development_key: tuple[Any, str] | None = None


def _raw_keys() -> str:
    global _last_development_key
    raw = settings.GATEWAY_VAULT_KEY
    if not raw:
        if os.environ.get("GATEWAY_PRODUCTION", "").lower() in {"1", "true", "yes"}:
            raise ImproperlyConfigured("GATEWAY_VAULT_KEY is required in production")
        var_dir, last = settings.VAR_DIR, _last_development_key
        if last is not None and last[0] is var_dir:
            return last[1]
        raw = _development_key(var_dir / "vault.key")
        _last_development_key = (var_dir, raw)
    return raw


@cache
def _fernet() -> MultiFernet:
    raw = _raw_keys()
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


@cache
def _aead_keys(raw: str) -> tuple[tuple[str, AESGCM], ...]:
    """(key id, AES-256-GCM) per configured key, primary first; cached per configuration."""
    keys = []
    for key in (k.strip() for k in raw.split(",")):
        if not key:
            continue
        secret = base64.urlsafe_b64decode(key)
        derived = HKDF(
            algorithm=hashes.SHA256(), length=32, salt=None, info=b"effect-gateway bound v1"
        ).derive(secret)
        key_id = hashlib.sha256(derived).hexdigest()[:8]
        keys.append((key_id, AESGCM(derived)))
    return tuple(keys)


class SealBroken(InvalidToken):
    """The sealed value does not open for what it claims to belong to (or for any key)."""


def seal_bound(value: Any, *, bound_to: str) -> str:
    """``value`` encrypted so that it opens only for ``bound_to`` (module doc)."""
    key_id, aead = _aead_keys(_raw_keys())[0]
    nonce = os.urandom(12)
    data = json.dumps(value, separators=(",", ":")).encode()
    sealed = aead.encrypt(nonce, data, bound_to.encode())
    return f"{BOUND_PREFIX}{key_id}:{base64.urlsafe_b64encode(nonce + sealed).decode()}"


def _open_bound_bytes(token: str, bound_to: str) -> bytes:
    try:
        _prefix, key_id, body = token.split(":", 2)
        blob = base64.urlsafe_b64decode(body)
    except ValueError:
        raise SealBroken("not a sealed value") from None
    for candidate_id, aead in _aead_keys(_raw_keys()):
        if candidate_id == key_id:
            try:
                return aead.decrypt(blob[:12], blob[12:], bound_to.encode())
            except InvalidTag:
                raise SealBroken("the sealed value belongs to something else") from None
    raise SealBroken(f"no configured vault key has id {key_id}")


def open_bound(token: str, *, bound_to: str) -> Any:
    """The value sealed for ``bound_to``; SealBroken when it was sealed for anything else.

    A value sealed before binding existed (plain Fernet) still opens: ``rotate_vault_key``
    re-seals it bound, and the dispatcher recomputes the digest of what it opened anyway.
    """
    if not token.startswith(BOUND_PREFIX):
        return open_json(token)
    return json.loads(_open_bound_bytes(token, bound_to))


def reseal_bound(token: str, *, bound_to: str) -> str:
    """The same value, bound to ``bound_to`` under the current primary key (rotation)."""
    return seal_bound(open_bound(token, bound_to=bound_to), bound_to=bound_to)
