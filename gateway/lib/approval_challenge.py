"""What an approver's key signs, and the checks of a signature over it.

The challenge of an approval is ``SHA-256(JCS({"decision", "effect_id", "nonce",
"payload_digest", "purpose", "tenant"}))``: RFC 8785 canonical JSON of the tenant's slug, the
effect id, the command's payload digest, the decision and a one-use server nonce. A passkey
signs it as the WebAuthn ``challenge`` (inside the client data the authenticator signs with
its authenticator data); a machine's Ed25519 key signs the 32 bytes directly. Nothing in a
database row can make a signature over one challenge pass for another: a flipped approval, a
digest edited after the signature, or another effect's signature all fail these checks.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass

import rfc8785
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from webauthn import verify_authentication_response
from webauthn.helpers import bytes_to_base64url
from webauthn.helpers.exceptions import InvalidAuthenticationResponse

PURPOSE = "effect-gateway/approval"
DECISIONS = ("approve", "reject")


def challenge(
    *, tenant: str, effect_id: str, payload_digest: str, decision: str, nonce: str
) -> bytes:
    """The 32 bytes an approver's key signs for ``decision`` on this effect and digest."""
    if decision not in DECISIONS:
        raise ValueError(f"decision must be one of {DECISIONS}, not {decision!r}")
    document = {
        "decision": decision,
        "effect_id": effect_id,
        "nonce": nonce,
        "payload_digest": payload_digest,
        "purpose": PURPOSE,
        "tenant": tenant,
    }
    return hashlib.sha256(rfc8785.dumps(document)).digest()


def b64url(data: bytes) -> str:
    return bytes_to_base64url(data)


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def ed25519_fingerprint(raw_public_key: bytes) -> str:
    """How a machine key is named: ``ed25519:`` and the first 32 hex digits of its SHA-256."""
    return "ed25519:" + hashlib.sha256(raw_public_key).hexdigest()[:32]


def ed25519_public_key(text: str) -> bytes:
    """A raw 32-byte Ed25519 public key from base64url, standard base64 or PEM; ValueError."""
    from cryptography.hazmat.primitives import serialization

    text = text.strip()
    if text.startswith("-----BEGIN"):
        loaded = serialization.load_pem_public_key(text.encode())
        if not isinstance(loaded, Ed25519PublicKey):
            raise ValueError("the PEM key is not an Ed25519 public key")
        return loaded.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    try:
        raw = unb64url(text.replace("+", "-").replace("/", "_").rstrip("="))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"not base64: {exc}") from None
    if len(raw) != 32:
        raise ValueError(f"an Ed25519 public key has 32 bytes, this one {len(raw)}")
    return raw


@dataclass(frozen=True)
class Assertion:
    """A WebAuthn assertion as the browser returned it (each part base64url)."""

    credential_id: str
    authenticator_data: str
    client_data_json: str
    signature: str
    user_handle: str | None = None

    def as_credential(self) -> dict[str, object]:
        response: dict[str, object] = {
            "authenticatorData": self.authenticator_data,
            "clientDataJSON": self.client_data_json,
            "signature": self.signature,
        }
        if self.user_handle:
            response["userHandle"] = self.user_handle
        return {
            "id": self.credential_id,
            "rawId": self.credential_id,
            "type": "public-key",
            "response": response,
        }


def verify_passkey(
    assertion: Assertion,
    *,
    expected_challenge: bytes,
    public_key: str,
    rp_id: str,
    origins: list[str],
    sign_count: int,
) -> tuple[int, str]:
    """(the authenticator's new sign count, '') or (0, why the assertion does not verify).
    User verification is required: the authenticator checked the person, not only a touch."""
    try:
        verified = verify_authentication_response(
            credential=assertion.as_credential(),
            expected_challenge=expected_challenge,
            expected_rp_id=rp_id,
            expected_origin=origins,
            credential_public_key=unb64url(public_key),
            credential_current_sign_count=sign_count,
            require_user_verification=True,
        )
    except (InvalidAuthenticationResponse, ValueError, KeyError, TypeError) as exc:
        return 0, f"the passkey assertion does not verify ({exc})"
    return verified.new_sign_count, ""


def verify_ed25519(*, public_key: str, expected_challenge: bytes, signature: str) -> str:
    """'' when ``signature`` (base64url) is the key's Ed25519 signature of the challenge."""
    try:
        key = Ed25519PublicKey.from_public_bytes(unb64url(public_key))
        key.verify(unb64url(signature), expected_challenge)
    except (InvalidSignature, ValueError, TypeError) as exc:
        return f"the Ed25519 signature does not verify ({type(exc).__name__})"
    return ""
