"""Approvals signed by the approver's own key, not by a row.

**Keys.** A person registers a passkey from the console (WebAuthn, verified by py_webauthn);
it signs nothing until another approver or an admin confirms it. A machine that approves
through the API signs with an Ed25519 key that an admin registers. Each registration,
confirmation and revocation is a control event of the tenant's audit chain.

**Policy.** An approval must be signed when the effect type's class is one of
``GATEWAY_SIGNED_APPROVAL_CLASSES`` (financial writes and irreversible types by default) or
``tenant:type`` matches ``GATEWAY_SIGNED_APPROVAL_REQUIRED``, unless it matches
``GATEWAY_SIGNED_APPROVAL_WAIVERS``. The policy lives in settings, not in the database, so a
writer of the database can neither waive a signature nor make one look required.

**Signing.** ``approval_challenge_issue`` stores a one-use nonce with a short expiry bound to
the approver, the effect and its payload digest; the key signs
``gateway.lib.approval_challenge.challenge`` over tenant, effect id, digest, decision and
nonce. ``approval_signature`` verifies it when the approval is given, and the signature is
stored with it (``ApprovalSignature``). **At dispatch** (``dispatch_refusal``, called by the
claim before any fence moves) the stored signature is verified again against the registered
public key and the command's own digest: a forged approval row, a signature over another
digest or by an unconfirmed key is refused, the effect frozen and flagged, nothing sent.
``verify_audit`` runs the same check over every approved effect (``approval_problems``).
The same check refuses a command submitted with an API token after that token's revocation.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from webauthn import generate_registration_options, options_to_json, verify_registration_response
from webauthn.helpers.exceptions import InvalidRegistrationResponse
from webauthn.helpers.structs import (
    AuthenticatorSelectionCriteria,
    PublicKeyCredentialDescriptor,
    ResidentKeyRequirement,
    UserVerificationRequirement,
)

from gateway import audit
from gateway.choices import APPROVER_ROLES, ApprovalState, Role
from gateway.contracts import EffectContract, get_contract
from gateway.errors import NotFound, NotPermitted, ValidationProblem
from gateway.lib import approval_challenge as ac
from gateway.models import (
    ApprovalSignature,
    Effect,
    EffectEvent,
    Principal,
    SigningChallenge,
    SigningKey,
)

K = SigningKey.Kind


# --- policy ------------------------------------------------------------------------------------


def signature_required(*, tenant: str, contract: EffectContract | None) -> bool:
    """Whether approvals of ``contract``'s type in ``tenant`` (its slug) must be signed."""
    if contract is None:
        return True  # an unknown type is never waved through
    subject = f"{tenant}:{contract.type}"
    if any(fnmatch.fnmatchcase(subject, p) for p in settings.GATEWAY_SIGNED_APPROVAL_WAIVERS):
        return False
    if _class_requires(contract):
        return True
    return any(fnmatch.fnmatchcase(subject, p) for p in settings.GATEWAY_SIGNED_APPROVAL_REQUIRED)


def _class_requires(contract: EffectContract) -> bool:
    classes = set(settings.GATEWAY_SIGNED_APPROVAL_CLASSES)
    return str(contract.effect_class) in classes or (
        contract.irreversible and "irreversible" in classes
    )


def signed_types() -> list[str]:
    """The types whose approvals need a signature in some tenant (a superset: a waiver only
    narrows it). The fast claim leaves approved commands of these to the general claim,
    which verifies the signature (gateway.fastpath.CLAIM_CHECKS). Read at every claim, so
    kept per policy (tests change the settings)."""
    from gateway.contracts import CONTRACTS

    policy = (
        tuple(settings.GATEWAY_SIGNED_APPROVAL_CLASSES),
        tuple(settings.GATEWAY_SIGNED_APPROVAL_REQUIRED),
        id(CONTRACTS),
        len(CONTRACTS),
    )
    known = _signed_types.get(policy)
    if known is None:
        known = _signed_types[policy] = sorted(
            type_
            for type_, contract in CONTRACTS.items()
            if _class_requires(contract)
            or any(
                fnmatch.fnmatchcase(type_, pattern.split(":", 1)[-1])
                for pattern in settings.GATEWAY_SIGNED_APPROVAL_REQUIRED
            )
        )
    return known


_signed_types: dict[tuple[Any, ...], list[str]] = {}


def effect_needs_signature(effect: Effect) -> bool:
    return signature_required(tenant=effect.tenant.slug, contract=get_contract(effect.type))


# --- challenges --------------------------------------------------------------------------------


def _challenge_new(
    principal: Principal, purpose: str, *, effect_id: str = "", digest: str = ""
) -> SigningChallenge:
    # The principal's expired challenges go with each new one: the table stays small.
    SigningChallenge.objects.filter(principal=principal, expires_at__lt=timezone.now()).delete()
    return SigningChallenge.objects.create(
        nonce=secrets.token_urlsafe(32),
        principal=principal,
        purpose=purpose,
        effect_id=effect_id,
        payload_digest=digest,
        expires_at=timezone.now() + timedelta(seconds=settings.GATEWAY_SIGNING_CHALLENGE_TTL),
    )


def _challenge_take(nonce: str, principal: Principal, purpose: str, effect_id: str = "") -> None:
    """Use the nonce once: a compare-and-set against a second request racing with the same
    one (a replayed assertion), refused when it is unknown, another's, used or expired."""
    taken = SigningChallenge.objects.filter(
        nonce=nonce,
        principal=principal,
        purpose=purpose,
        effect_id=effect_id,
        used_at__isnull=True,
        expires_at__gt=timezone.now(),
    ).update(used_at=timezone.now())
    if taken != 1:
        raise NotPermitted(
            "The signing challenge is unknown, expired or already used: ask for a new one."
        )


@dataclass(frozen=True)
class ApprovalChallenge:
    """What the approver's key signs, and what a client needs to ask it to."""

    nonce: str
    challenge: bytes
    tenant: str
    effect_id: str
    payload_digest: str
    decision: str
    expires_at: Any
    credential_ids: list[str]

    def as_data(self) -> dict[str, Any]:
        return {
            "nonce": self.nonce,
            "challenge": ac.b64url(self.challenge),
            "tenant": self.tenant,
            "effect_id": self.effect_id,
            "payload_digest": self.payload_digest,
            "decision": self.decision,
            "expires_at": self.expires_at.isoformat(),
            "credential_ids": self.credential_ids,
            "rp_id": settings.GATEWAY_WEBAUTHN_RP_ID or None,
        }


def approval_challenge_issue(
    *, principal: Principal, effect: Effect, decision: str = "approve"
) -> ApprovalChallenge:
    """A fresh challenge for ``principal`` to sign ``decision`` on ``effect``'s digest."""
    if principal.role not in APPROVER_ROLES:
        raise NotPermitted(f"A principal with role {principal.role} cannot approve commands.")
    if decision not in ac.DECISIONS:
        raise ValidationProblem("Unknown decision.", errors={"decision": list(ac.DECISIONS)})
    digest = effect.command.payload_digest
    row = _challenge_new(principal, decision, effect_id=effect.pk, digest=digest)
    return ApprovalChallenge(
        nonce=row.nonce,
        challenge=ac.challenge(
            tenant=effect.tenant.slug,
            effect_id=effect.pk,
            payload_digest=digest,
            decision=decision,
            nonce=row.nonce,
        ),
        tenant=effect.tenant.slug,
        effect_id=effect.pk,
        payload_digest=digest,
        decision=decision,
        expires_at=row.expires_at,
        credential_ids=[key.credential_id for key in usable_keys(principal, K.PASSKEY)],
    )


# --- keys --------------------------------------------------------------------------------------


def usable_keys(principal: Principal, kind: str | None = None):
    query = SigningKey.objects.filter(
        principal=principal, confirmed_at__isnull=False, revoked_at__isnull=True
    )
    return query.filter(kind=kind) if kind else query


def key_fingerprint(key: SigningKey) -> str:
    return "sha256:" + hashlib.sha256(key.public_key.encode()).hexdigest()


def _key_event(key: SigningKey, kind: str, actor: Principal, reason: str = "") -> None:
    audit.record_control(
        tenant_id=key.principal.tenant_id,
        kind=kind,
        subject=f"signing-key:{key.pk}",
        actor=actor.label,
        principal=actor,
        reason=reason,
        data={
            "owner": key.principal.name,
            "key_kind": key.kind,
            "credential_id": key.credential_id,
            "public_key": key_fingerprint(key),
        },
    )


def passkey_registration_options(*, principal: Principal, rp_id: str) -> dict[str, Any]:
    """The ``navigator.credentials.create`` options (JSON) with a stored one-use challenge."""
    if principal.role not in APPROVER_ROLES or principal.user_id is None:
        raise NotPermitted("Only approvers and admins with a console login register passkeys.")
    row = _challenge_new(principal, "register")
    options = generate_registration_options(
        rp_id=rp_id,
        rp_name="Effect Gateway",
        user_name=f"{principal.name}@{principal.tenant.slug}",
        user_id=f"{principal.tenant_id}:{principal.pk}".encode(),
        challenge=row.nonce.encode(),
        authenticator_selection=AuthenticatorSelectionCriteria(
            resident_key=ResidentKeyRequirement.PREFERRED,
            user_verification=UserVerificationRequirement.REQUIRED,
        ),
        exclude_credentials=[
            PublicKeyCredentialDescriptor(id=ac.unb64url(key.credential_id))
            for key in SigningKey.objects.filter(principal=principal, kind=K.PASSKEY)
        ],
    )
    return json.loads(options_to_json(options))


def passkey_register(
    *, principal: Principal, credential: dict[str, Any], rp_id: str, origin: str, name: str = ""
) -> SigningKey:
    """Verify a ``navigator.credentials.create`` answer and keep the passkey, pending until
    another approver or an admin confirms it."""
    try:
        client_data = json.loads(ac.unb64url(credential["response"]["clientDataJSON"]))
        nonce = ac.unb64url(client_data["challenge"]).decode()
    except (KeyError, TypeError, ValueError, UnicodeDecodeError):
        raise ValidationProblem(
            "Not a WebAuthn registration.", errors={"credential": ["malformed"]}
        ) from None
    with transaction.atomic():
        _challenge_take(nonce, principal, "register")
        try:
            verified = verify_registration_response(
                credential=credential,
                expected_challenge=nonce.encode(),
                expected_rp_id=rp_id,
                expected_origin=origins_for(origin),
                require_user_verification=True,
            )
        except (InvalidRegistrationResponse, ValueError, KeyError, TypeError) as exc:
            raise ValidationProblem(
                f"The passkey registration does not verify: {exc}",
                errors={"credential": ["does not verify"]},
            ) from None
        key = SigningKey.objects.create(
            principal=principal,
            kind=K.PASSKEY,
            name=name[:100],
            credential_id=ac.b64url(verified.credential_id),
            public_key=ac.b64url(verified.credential_public_key),
            sign_count=verified.sign_count,
            rp_id=rp_id,
        )
        _key_event(key, "signing_key_registered", principal)
    return key


def signing_key_confirm(*, key: SigningKey, actor: Principal) -> SigningKey:
    """Another approver or an admin of the tenant vouches for a pending passkey."""
    if key.principal.tenant_id != actor.tenant_id:
        raise NotFound("No such key.")
    if actor.role not in APPROVER_ROLES:
        raise NotPermitted("Only approvers and admins confirm passkeys.")
    if key.principal_id == actor.pk:
        raise NotPermitted("A passkey is confirmed by another approver or an admin, not its owner.")
    with transaction.atomic():
        # Compare-and-set against a second confirmation or a revocation racing with this one.
        changed = SigningKey.objects.filter(
            pk=key.pk, confirmed_at__isnull=True, revoked_at__isnull=True
        ).update(confirmed_by=actor, confirmed_at=timezone.now())
        if not changed:
            raise NotPermitted("This key is already confirmed or revoked.")
        key.refresh_from_db()
        _key_event(key, "signing_key_confirmed", actor)
    return key


def signing_key_revoke(*, key: SigningKey, actor: Principal, reason: str = "") -> SigningKey:
    if key.principal.tenant_id != actor.tenant_id:
        raise NotFound("No such key.")
    if key.principal_id != actor.pk and actor.role != Role.ADMIN:
        raise NotPermitted("Only admins revoke other principals' keys.")
    with transaction.atomic():
        if SigningKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        ):
            key.refresh_from_db()
            _key_event(key, "signing_key_revoked", actor, reason)
    return key


def machine_key_register(
    *, principal: Principal, public_key: str, actor: Principal, name: str = ""
) -> SigningKey:
    """An admin registers a machine approver's Ed25519 public key (raw base64 or PEM)."""
    if actor.role != Role.ADMIN or principal.tenant_id != actor.tenant_id:
        raise NotPermitted("Only an admin of the tenant registers machine keys.")
    if principal.role not in APPROVER_ROLES:
        raise ValidationProblem(
            "Only an approver (or admin) principal approves.", errors={"principal": ["role"]}
        )
    if principal.pk == actor.pk:
        raise NotPermitted("An admin registers keys for other principals, not for themselves.")
    try:
        raw = ac.ed25519_public_key(public_key)
    except ValueError as exc:
        raise ValidationProblem(str(exc), errors={"public_key": [str(exc)]}) from None
    with transaction.atomic():
        key = SigningKey.objects.create(
            principal=principal,
            kind=K.ED25519,
            name=name[:100],
            credential_id=ac.ed25519_fingerprint(raw),
            public_key=ac.b64url(raw),
            confirmed_by=actor,
            confirmed_at=timezone.now(),
        )
        _key_event(key, "signing_key_confirmed", actor)
    return key


# --- signing and checking an approval ---------------------------------------------------------


@dataclass(frozen=True)
class SignedDecision:
    """A client's signature over an approval challenge: a WebAuthn assertion
    (``authenticator_data`` and ``client_data_json`` set) or an Ed25519 signature."""

    nonce: str
    key_id: str  # the passkey's credential id, or the machine key's fingerprint
    signature: str
    authenticator_data: str = ""
    client_data_json: str = ""
    user_handle: str | None = None
    # Where the ceremony ran (set by the view from the request, never by the client).
    rp_id: str = ""
    origin: str = ""


def origins_for(request_origin: str) -> list[str]:
    return list(settings.GATEWAY_WEBAUTHN_ORIGINS) or [request_origin]


def _stored_origins(key: SigningKey, client_data_json: str) -> list[str]:
    """The origins a stored assertion may name: the configured ones, or (none configured)
    the one it names when its host is the key's RP id or under it."""
    if settings.GATEWAY_WEBAUTHN_ORIGINS:
        return list(settings.GATEWAY_WEBAUTHN_ORIGINS)
    try:
        origin = json.loads(ac.unb64url(client_data_json)).get("origin", "")
    except (ValueError, TypeError, AttributeError):
        return []
    host = urlsplit(origin).hostname or ""
    return [origin] if key.rp_id and (host == key.rp_id or host.endswith("." + key.rp_id)) else []


def verify_signature(
    sig: ApprovalSignature | SignedDecision,
    key: SigningKey,
    expected: bytes,
    *,
    origins: list[str],
    rp_id: str,
    sign_count: int = 0,
) -> tuple[int, str]:
    """(new sign count, '') or (0, why ``sig`` is not ``key``'s signature of ``expected``)."""
    if key.kind == K.ED25519:
        problem = ac.verify_ed25519(
            public_key=key.public_key, expected_challenge=expected, signature=sig.signature
        )
        return 0, problem
    assertion = ac.Assertion(
        credential_id=key.credential_id,
        authenticator_data=sig.authenticator_data,
        client_data_json=sig.client_data_json,
        signature=sig.signature,
        user_handle=getattr(sig, "user_handle", None),
    )
    return ac.verify_passkey(
        assertion,
        expected_challenge=expected,
        public_key=key.public_key,
        rp_id=rp_id,
        origins=origins,
        sign_count=sign_count,
    )


def approval_signature(
    *, effect: Effect, principal: Principal, signed: SignedDecision | None
) -> ApprovalSignature | None:
    """The signature to store with ``principal``'s approval of ``effect`` (not saved yet), or
    None where none is needed; NotPermitted when one is needed and this is not it. Runs in
    the approval's transaction: the nonce is used up only if the approval is written."""
    required = effect_needs_signature(effect)
    if signed is None:
        if required:
            raise NotPermitted(
                f"Approvals of {effect.type} must be signed with your own passkey (or, for a "
                "machine, its registered Ed25519 key): ask for a challenge and sign it."
            )
        return None
    key = usable_keys(principal).filter(credential_id=signed.key_id).first()
    if key is None:
        raise NotPermitted("No confirmed, unrevoked signing key of yours has that id.")
    _challenge_take(signed.nonce, principal, "approve", effect.pk)
    digest = effect.command.payload_digest
    expected = ac.challenge(
        tenant=effect.tenant.slug,
        effect_id=effect.pk,
        payload_digest=digest,
        decision="approve",
        nonce=signed.nonce,
    )
    count, problem = verify_signature(
        signed,
        key,
        expected,
        origins=origins_for(signed.origin),
        rp_id=signed.rp_id or key.rp_id,
        sign_count=key.sign_count,
    )
    if problem:
        raise NotPermitted(f"The approval's signature was refused: {problem}.")
    if key.kind == K.PASSKEY:
        # Compare-and-set on the counter against a cloned authenticator signing in parallel.
        SigningKey.objects.filter(pk=key.pk, sign_count=key.sign_count).update(sign_count=count)
    return ApprovalSignature(
        effect=effect,
        principal=principal,
        key=key,
        decision="approve",
        payload_digest=digest,
        nonce=signed.nonce,
        authenticator_data=signed.authenticator_data,
        client_data_json=signed.client_data_json,
        signature=signed.signature,
        sign_count=count,
    )


def signed_data(signature: ApprovalSignature | None) -> dict[str, str]:
    """What the approval's event (a link of the audit chain) records of its signature: the
    key and a hash of the signed bytes, so that a signature swapped in later is seen."""
    if signature is None:
        return {}
    signed = "\x00".join(
        [signature.authenticator_data, signature.client_data_json, signature.signature]
    )
    return {
        "signing_key": signature.key.credential_id,
        "signature_sha256": hashlib.sha256(signed.encode()).hexdigest(),
    }


class Refusal(str):
    """Why dispatch refuses an effect, with how it is recorded: the event's kind and the flag
    that puts it in front of a human (``mismatch`` opens an owners' case; ``escalated`` too)."""

    kind: str = "payload_tampered"
    flag: str = "mismatch"

    def __new__(cls, text: str, *, kind: str, flag: str) -> Refusal:
        refusal = super().__new__(cls, text)
        refusal.kind, refusal.flag = kind, flag
        return refusal


def _forged(text: str) -> Refusal:
    return Refusal(
        f"{text}: the approval is not signed by the approver's key",
        kind="approval_unverified",
        flag="mismatch",
    )


def stored_signature_problem(effect: Effect) -> str:
    """'' when ``effect``'s approval carries a signature of its approver's confirmed key over
    this effect, its command's digest and "approve"; else what is wrong."""
    if effect.approval_state != ApprovalState.APPROVED or effect.approved_by_id is None:
        return "the effect is not approved"
    sig = (
        ApprovalSignature.objects.filter(effect_id=effect.pk, decision="approve")
        .select_related("key")
        .order_by("-id")
        .first()
    )
    if sig is None:
        return "no signature is stored with the approval"
    key = sig.key
    if sig.principal_id != effect.approved_by_id or key.principal_id != effect.approved_by_id:
        return "the signature is not the approver's"
    if key.confirmed_at is None or key.confirmed_by_id == key.principal_id:
        return "the signing key was never confirmed by another approver or an admin"
    if key.revoked_at is not None and key.revoked_at <= sig.created_at:
        return "the signing key was revoked before it signed"
    if not _confirmation_chained(key):
        return "the signing key's confirmation is not in the audit chain"
    expected = ac.challenge(
        tenant=effect.tenant.slug,
        effect_id=effect.pk,
        payload_digest=effect.command.payload_digest,
        decision="approve",
        nonce=sig.nonce,
    )
    _, problem = verify_signature(
        sig, key, expected, origins=_stored_origins(key, sig.client_data_json), rp_id=key.rp_id
    )
    return problem


def _confirmation_chained(key: SigningKey) -> bool:
    """Whether the tenant's audit chain holds the confirmation of this very public key: a
    key row (or its confirmation) written in the database alone has none."""
    return EffectEvent.objects.filter(
        tenant_id=key.principal.tenant_id,
        effect=None,
        kind="signing_key_confirmed",
        subject=f"signing-key:{key.pk}",
        data__public_key=key_fingerprint(key),
        data__credential_id=key.credential_id,
    ).exists()


def dispatch_refusal(effect: Effect, payload: dict[str, Any]) -> Refusal | None:
    """Why the claim must not send ``effect`` (its payload opened and checked), or None."""
    command = effect.command
    token = command.submitted_with
    revoked = token.revoked_at if token is not None else None
    if token is not None and revoked is not None and revoked <= command.created_at:
        return Refusal(
            f"submitted at {command.created_at.isoformat()} with token {token.prefix}…, revoked "
            f"at {revoked.isoformat()}",
            kind="submitted_after_revocation",
            flag="escalated",
        )
    contract = get_contract(effect.type)
    if (
        not command.approval_required
        and contract is not None
        and contract.version == command.contract_version
        and contract.requires_approval(payload)
    ):
        return _forged("its contract requires an approval of this payload, the row says none")
    if not command.approval_required or not effect_needs_signature(effect):
        return None
    problem = stored_signature_problem(effect)
    return _forged(problem) if problem else None


def approval_problems(tenant_id: int, *, limit: int = 20) -> list[str]:
    """``verify_audit``'s check: every effect of the tenant that was approved under a policy
    that needs a signature carries a valid one (a dispatched one too: its signature stays)."""
    problems: list[str] = []
    approved = (
        Effect.objects.filter(tenant_id=tenant_id, approval_state=ApprovalState.APPROVED)
        .select_related("command", "tenant")
        .order_by("command")
    )
    for effect in approved.iterator(chunk_size=500):
        if not effect_needs_signature(effect):
            continue
        problem = stored_signature_problem(effect)
        if problem:
            problems.append(f"effect {effect.pk}: approval unverified: {problem}")
            if len(problems) >= limit:
                break
    return problems
