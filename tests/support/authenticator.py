"""A software WebAuthn authenticator (ES256, "none" attestation) and an Ed25519 machine key,
for tests that sign approvals without a browser. It builds the bytes a real authenticator
returns (authenticator data, client data JSON, attestation object, DER signature) as the
WebAuthn Level 2 specification lays them out; the browser tests use Chromium's own virtual
authenticator instead."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass, field
from typing import Any

import cbor2
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gateway.lib.approval_challenge import b64url, unb64url

UP, UV, AT = 0x01, 0x04, 0x40


@dataclass
class SoftAuthenticator:
    origin: str = "http://localhost"
    rp_id: str = "localhost"
    key: ec.EllipticCurvePrivateKey = field(
        default_factory=lambda: ec.generate_private_key(ec.SECP256R1())
    )
    credential_id: bytes = field(default_factory=lambda: os.urandom(16))
    counter: int = 0

    def _cose_key(self) -> bytes:
        numbers = self.key.public_key().public_numbers()
        return cbor2.dumps(
            {
                1: 2,
                3: -7,
                -1: 1,
                -2: numbers.x.to_bytes(32, "big"),
                -3: numbers.y.to_bytes(32, "big"),
            }
        )

    def _client_data(self, kind: str, challenge: bytes, origin: str | None) -> bytes:
        return json.dumps(
            {
                "type": kind,
                "challenge": b64url(challenge),
                "origin": origin or self.origin,
                "crossOrigin": False,
            }
        ).encode()

    def register(self, options: dict[str, Any], *, origin: str | None = None) -> dict[str, Any]:
        """The answer of ``navigator.credentials.create`` to ``options`` (JSON form)."""
        client_data = self._client_data("webauthn.create", unb64url(options["challenge"]), origin)
        auth_data = (
            hashlib.sha256(options["rp"]["id"].encode()).digest()
            + bytes([UP | UV | AT])
            + struct.pack(">I", self.counter)
            + bytes(16)
            + struct.pack(">H", len(self.credential_id))
            + self.credential_id
            + self._cose_key()
        )
        attestation = cbor2.dumps({"fmt": "none", "attStmt": {}, "authData": auth_data})
        return {
            "id": b64url(self.credential_id),
            "rawId": b64url(self.credential_id),
            "type": "public-key",
            "response": {
                "clientDataJSON": b64url(client_data),
                "attestationObject": b64url(attestation),
            },
            "clientExtensionResults": {},
        }

    def sign(self, challenge: bytes, *, origin: str | None = None, flags: int = UP | UV) -> dict:
        """An assertion over ``challenge``: the approve form's (or body's) signature fields."""
        self.counter += 1
        client_data = self._client_data("webauthn.get", challenge, origin)
        auth_data = (
            hashlib.sha256(self.rp_id.encode()).digest()
            + bytes([flags])
            + struct.pack(">I", self.counter)
        )
        signature = self.key.sign(
            auth_data + hashlib.sha256(client_data).digest(), ec.ECDSA(hashes.SHA256())
        )
        return {
            "key_id": b64url(self.credential_id),
            "authenticator_data": b64url(auth_data),
            "client_data_json": b64url(client_data),
            "signature": b64url(signature),
        }


@dataclass
class MachineKey:
    key: Ed25519PrivateKey = field(default_factory=Ed25519PrivateKey.generate)

    @property
    def public(self) -> str:
        raw = self.key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        return b64url(raw)

    def sign(self, challenge: bytes) -> str:
        return b64url(self.key.sign(challenge))
