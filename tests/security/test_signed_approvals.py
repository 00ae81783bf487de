"""Approvals signed by the approver's own key, not by a row (gateway.signing).

A database writer who flips an approval row, stores a garbage assertion, or copies a
signature given over another digest or another effect cannot make the dispatcher send: the
claim verifies the stored signature against the registered public key and the command's own
digest, freezes and flags the effect, and the sandbox provider's log stays empty.
``verify_audit`` reports the same approvals. A machine approver signs with an Ed25519 key
that an admin registered. A command submitted with a token after its revocation is refused
at dispatch likewise."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from gateway import dispatcher, services
from gateway.lib import approval_challenge as ac
from gateway.models import (
    ApiToken,
    ApprovalSignature,
    Command,
    Effect,
    EffectEvent,
    SigningChallenge,
    SigningKey,
)
from reconciliation.models import Case
from reconciliation.services import cases_open_for_flagged
from tests.conftest import TICKET, Persona
from tests.support.authenticator import MachineKey

pytestmark = pytest.mark.django_db


def refund(amount: int = 20_000, order: str = "ord_1") -> dict:
    return {
        "type": "billing.refund.create",
        "resource": {"type": "order", "id": order, "version": 1},
        "payload": {"amount": amount, "currency": "EUR", "reason": "duplicate charge"},
    }


@pytest.fixture
def machine(admin) -> tuple[Persona, MachineKey, str]:
    """An approver that is a program, with an Ed25519 key registered by the admin."""
    persona = Persona("acme", "approve-bot", "approver")
    key = MachineKey()
    response = admin.client.post(
        "/api/v1/signing-keys",
        {"principal": "approve-bot", "public_key": key.public, "name": "ci"},
        format="json",
    )
    assert response.status_code == 201, response.content
    assert response.json()["confirmed_by"] == "root"
    return persona, key, response.json()["credential_id"]


def challenge_for(persona: Persona, effect_id: str) -> dict:
    response = persona.client.post(
        f"/api/v1/effects/{effect_id}/approval-challenge", {}, format="json"
    )
    assert response.status_code == 200, response.content
    return response.json()


def signed_body(effect: dict, challenge: dict, key_id: str, signature: str) -> dict:
    """The approve request's body: the effect's digest and a signature under ``challenge``."""
    return {
        "payload_digest": effect["payload_digest"],
        "signature": {"nonce": challenge["nonce"], "key_id": key_id, "signature": signature},
    }


def approve_with(persona: Persona, effect: dict, body: dict):
    return persona.client.post(
        f"/api/v1/effects/{effect['effect_id']}/approve", body, format="json"
    )


def approve_signed(persona: Persona, key: MachineKey, key_id: str, effect: dict):
    challenge = challenge_for(persona, effect["effect_id"])
    signature = key.sign(ac.unb64url(challenge["challenge"]))
    return approve_with(persona, effect, signed_body(effect, challenge, key_id, signature))


def challenge_bytes(effect: dict, nonce: str, digest: str | None = None) -> bytes:
    """What an approver signs for ``effect`` (over ``digest``, default the effect's own)."""
    return ac.challenge(
        tenant="acme",
        effect_id=effect["effect_id"],
        payload_digest=digest or effect["payload_digest"],
        decision="approve",
        nonce=nonce,
    )


def store_signature(
    effect: dict, principal: str, key: SigningKey, nonce: str, signature: str
) -> ApprovalSignature:
    """What a writer of the database stores beside a forged approval row."""
    return ApprovalSignature.objects.create(
        effect_id=effect["effect_id"],
        principal=principal,
        key=key,
        decision="approve",
        payload_digest=effect["payload_digest"],
        nonce=nonce,
        signature=signature,
    )


def rogue_key(principal: str, **confirmation) -> tuple[MachineKey, SigningKey]:
    """A key a writer inserts for ``principal`` themselves, not registered through the API."""
    rogue = MachineKey()
    key = SigningKey.objects.create(
        principal=principal,
        kind="ed25519",
        credential_id="ed25519:rogue",
        public_key=rogue.public,
        **confirmation,
    )
    return rogue, key


def forge_approval(effect_id: str, approver: Persona) -> None:
    """What a writer of the database does: the row says approved, by an approver, now."""
    effect = Effect.objects.select_related("command").get(pk=effect_id)
    now = timezone.now()
    Effect.objects.filter(pk=effect_id).update(
        status="PREPARED",
        approval_state="approved",
        approved_by=approver.principal,
        approved_digest=effect.command.payload_digest,
        approved_at=now,
        next_dispatch_at=now,
    )


def assert_refused_at_dispatch(effect_id: str, sandbox, *, kind: str) -> EffectEvent:
    before = sandbox.log()
    services.effect_dispatch(effect_id=effect_id, worker="test")
    dispatcher.drain(flag=None, worker="test-drainer")  # the batch claim too
    assert sandbox.log() == before  # the provider saw nothing more
    effect = Effect.objects.get(pk=effect_id)
    assert effect.frozen
    event = EffectEvent.objects.get(effect_id=effect_id, kind=kind)
    assert "never sent" in event.reason
    services.effect_dispatch(effect_id=effect_id, worker="test-2")  # a redelivery
    assert sandbox.log() == before
    return event


def test_the_shipped_policy_signs_money_and_irreversible_types(settings):
    from gateway.contracts import get_contract
    from gateway.signing import signature_required

    settings.GATEWAY_SIGNED_APPROVAL_CLASSES = ["financial_write", "irreversible"]
    assert signature_required(tenant="acme", contract=get_contract("billing.refund.create"))
    assert signature_required(tenant="acme", contract=get_contract("email.message.send"))
    assert not signature_required(tenant="acme", contract=get_contract("ticket.create"))
    settings.GATEWAY_SIGNED_APPROVAL_WAIVERS = ["sandbox:billing.*"]
    assert not signature_required(tenant="sandbox", contract=get_contract("billing.refund.create"))
    assert signature_required(tenant="acme", contract=get_contract("billing.refund.create"))
    settings.GATEWAY_SIGNED_APPROVAL_REQUIRED = ["acme:ticket.*"]
    assert signature_required(tenant="acme", contract=get_contract("ticket.create"))


def test_an_approval_without_a_signature_is_refused_and_changes_nothing(
    signed_approvals, agent, approver
):
    effect = agent.submit(refund(), "refund-1").json()
    events = EffectEvent.objects.count()
    response = approver.client.post(
        f"/api/v1/effects/{effect['effect_id']}/approve",
        {"payload_digest": effect["payload_digest"]},
        format="json",
    )
    assert response.status_code == 403
    assert "passkey" in response.json()["detail"]
    assert Effect.objects.get(pk=effect["effect_id"]).status == "AWAITING_APPROVAL"
    assert EffectEvent.objects.count() == events


def test_a_machine_approves_with_its_ed25519_key_and_the_effect_is_sent_once(
    signed_approvals, agent, machine, sandbox
):
    persona, key, key_id = machine
    effect = agent.submit(refund(), "refund-1").json()
    response = approve_signed(persona, key, key_id, effect)
    assert response.status_code == 200, response.content
    stored = ApprovalSignature.objects.get(effect_id=effect["effect_id"])
    assert stored.payload_digest == effect["payload_digest"] and stored.key.kind == "ed25519"
    # The approval's event, a link of the audit chain, names the key and hashes the signature.
    approved = EffectEvent.objects.get(effect_id=effect["effect_id"], kind="approved")
    assert approved.data["signing_key"] == key_id and len(approved.data["signature_sha256"]) == 64
    services.effect_dispatch(effect_id=effect["effect_id"], worker="test")
    assert len(sandbox.log()) == 1
    assert Effect.objects.get(pk=effect["effect_id"]).status == "CONFIRMED"
    call_command("verify_audit", tenant="acme")  # the signed approval verifies


def test_a_used_challenge_and_another_persons_key_are_refused(
    signed_approvals, agent, machine, approver
):
    persona, key, key_id = machine
    effect = agent.submit(refund(), "refund-1").json()
    challenge = challenge_for(persona, effect["effect_id"])
    body = signed_body(effect, challenge, key_id, key.sign(ac.unb64url(challenge["challenge"])))
    # alice presents the machine's signature: not her key.
    url = f"/api/v1/effects/{effect['effect_id']}/approve"
    assert approver.client.post(url, body, format="json").status_code == 403
    assert persona.client.post(url, body, format="json").status_code == 200
    # The nonce is spent: the same signature does not approve again (or elsewhere).
    assert persona.client.post(url, body, format="json").status_code in (403, 409)


def test_an_expired_challenge_is_refused(signed_approvals, agent, machine):
    persona, key, key_id = machine
    effect = agent.submit(refund(), "refund-1").json()
    challenge = challenge_for(persona, effect["effect_id"])
    SigningChallenge.objects.filter(nonce=challenge["nonce"]).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    signature = key.sign(ac.unb64url(challenge["challenge"]))
    response = approve_with(persona, effect, signed_body(effect, challenge, key_id, signature))
    assert response.status_code == 403 and "expired" in response.json()["detail"]
    assert Effect.objects.get(pk=effect["effect_id"]).status == "AWAITING_APPROVAL"


def test_a_signature_over_another_digest_is_refused_at_approval(signed_approvals, agent, machine):
    persona, key, key_id = machine
    effect = agent.submit(refund(), "refund-1").json()
    challenge = challenge_for(persona, effect["effect_id"])
    other = challenge_bytes(effect, challenge["nonce"], "sha256:" + "1" * 64)
    response = approve_with(
        persona, effect, signed_body(effect, challenge, key_id, key.sign(other))
    )
    assert response.status_code == 403
    assert "does not verify" in response.json()["detail"]
    assert Effect.objects.get(pk=effect["effect_id"]).status == "AWAITING_APPROVAL"


def test_a_forged_approval_row_is_refused_at_dispatch_and_reported(
    signed_approvals, agent, approver, sandbox
):
    effect = agent.submit(refund(), "refund-1").json()
    forge_approval(effect["effect_id"], approver)
    event = assert_refused_at_dispatch(effect["effect_id"], sandbox, kind="approval_unverified")
    assert "no signature is stored" in event.reason
    assert Effect.objects.get(pk=effect["effect_id"]).mismatch
    cases_open_for_flagged()
    case = Case.objects.get(effect_id=effect["effect_id"])
    assert "not signed by the approver" in case.reason_text and "never sent" in case.reason_text
    with pytest.raises(CommandError):
        call_command("verify_audit", tenant="acme")


def test_a_garbage_assertion_stored_with_a_forged_row_is_refused(
    signed_approvals, agent, machine, sandbox
):
    persona, _, key_id = machine
    effect = agent.submit(refund(), "refund-1").json()
    forge_approval(effect["effect_id"], persona)
    key = SigningKey.objects.get(credential_id=key_id)
    store_signature(effect, persona.principal, key, "made-up", ac.b64url(b"\x00" * 64))
    event = assert_refused_at_dispatch(effect["effect_id"], sandbox, kind="approval_unverified")
    assert "does not verify" in event.reason


def test_a_signature_copied_from_another_effect_is_refused_at_dispatch(
    signed_approvals, agent, machine, sandbox
):
    persona, key, key_id = machine
    signed = agent.submit(refund(20_000, "ord_1"), "refund-1").json()
    target = agent.submit(refund(90_000, "ord_2"), "refund-2").json()
    assert approve_signed(persona, key, key_id, signed).status_code == 200
    services.effect_dispatch(effect_id=signed["effect_id"], worker="test")
    assert len(sandbox.log()) == 1  # the signed one, once
    forge_approval(target["effect_id"], persona)
    original = ApprovalSignature.objects.get(effect_id=signed["effect_id"])
    original.pk = None
    original.effect_id = target["effect_id"]
    original.save()
    event = assert_refused_at_dispatch(target["effect_id"], sandbox, kind="approval_unverified")
    assert "does not verify" in event.reason


def test_an_approvers_signature_over_another_digest_is_refused_at_dispatch(
    signed_approvals, agent, machine, sandbox
):
    """The approver's real key signed this effect with another digest (what the row showed
    them): the command's own digest is what dispatch checks the signature against."""
    persona, key, key_id = machine
    effect = agent.submit(refund(), "refund-1").json()
    forge_approval(effect["effect_id"], persona)
    shown = challenge_bytes(effect, "n-1", "sha256:" + "2" * 64)
    stored_key = SigningKey.objects.get(credential_id=key_id)
    store_signature(effect, persona.principal, stored_key, "n-1", key.sign(shown))
    event = assert_refused_at_dispatch(effect["effect_id"], sandbox, kind="approval_unverified")
    assert "does not verify" in event.reason


def test_a_signature_by_a_key_inserted_unconfirmed_is_refused_at_dispatch(
    signed_approvals, agent, approver, sandbox
):
    """A writer inserts a key of their own for alice, unconfirmed, and signs with it."""
    effect = agent.submit(refund(), "refund-1").json()
    forge_approval(effect["effect_id"], approver)
    rogue, key = rogue_key(approver.principal)
    signature = rogue.sign(challenge_bytes(effect, "n-2"))
    store_signature(effect, approver.principal, key, "n-2", signature)
    event = assert_refused_at_dispatch(effect["effect_id"], sandbox, kind="approval_unverified")
    assert "never confirmed" in event.reason


def test_a_flipped_approval_flag_is_refused_by_the_fast_claim(signed_approvals, agent, sandbox):
    """The command row says no approval was needed; its contract says this amount needs one."""
    effect = agent.submit(refund(), "refund-1").json()
    with connection.cursor() as cursor:
        # A writer who can also switch off the command table's freeze trigger (its owner).
        cursor.execute("SET LOCAL session_replication_role = replica")
        Command.objects.filter(pk=effect["effect_id"]).update(approval_required=False)
        cursor.execute("SET LOCAL session_replication_role = origin")
    now = timezone.now()
    Effect.objects.filter(pk=effect["effect_id"]).update(
        status="PREPARED", approval_state="not_required", next_dispatch_at=now
    )
    assert_refused_at_dispatch(effect["effect_id"], sandbox, kind="approval_unverified")


# --- the revocation window ---------------------------------------------------------------------


def test_a_command_submitted_after_its_tokens_revocation_is_never_sent(settings, agent, sandbox):
    """Another process revoked the token; this one still trusts its cached copy (the window
    before the revocation's message arrives) and accepts a submission. Dispatch refuses it."""
    settings.GATEWAY_TOKEN_CACHE_TTL = 60
    assert agent.client.get("/api/v1/effects").status_code == 200  # cached now
    token = ApiToken.objects.get(principal=agent.principal)
    ApiToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now())
    response = agent.submit(TICKET, "ticket-after-revocation")
    assert response.status_code == 201  # the stale cache let it in
    effect_id = response.json()["effect_id"]
    assert Command.objects.get(pk=effect_id).submitted_with_id == token.pk
    event = assert_refused_at_dispatch(effect_id, sandbox, kind="submitted_after_revocation")
    assert "revoked at" in event.reason
    effect = Effect.objects.get(pk=effect_id)
    assert effect.escalated and not effect.mismatch
    cases_open_for_flagged()
    assert "after its revocation" in Case.objects.get(effect_id=effect_id).reason_text


def test_a_command_submitted_before_the_revocation_is_sent(agent, sandbox):
    response = agent.submit(TICKET, "ticket-before-revocation")
    effect_id = response.json()["effect_id"]
    created = Command.objects.get(pk=effect_id).created_at
    ApiToken.objects.filter(principal=agent.principal).update(
        revoked_at=created + timedelta(milliseconds=1)
    )
    services.effect_dispatch(effect_id=effect_id, worker="test")
    assert len(sandbox.log()) == 1
    assert Effect.objects.get(pk=effect_id).status == "CONFIRMED"


def test_revoked_just_before_the_submission_timestamp_is_refused(agent, sandbox):
    response = agent.submit(TICKET, "ticket-window")
    effect_id = response.json()["effect_id"]
    created = Command.objects.get(pk=effect_id).created_at
    ApiToken.objects.filter(principal=agent.principal).update(
        revoked_at=created - timedelta(milliseconds=1)
    )
    assert_refused_at_dispatch(effect_id, sandbox, kind="submitted_after_revocation")


def test_a_key_row_confirmed_in_the_database_alone_is_refused_at_dispatch(
    signed_approvals, agent, approver, admin, sandbox
):
    """The writer also fills in ``confirmed_by``: the audit chain has no confirmation of it."""
    effect = agent.submit(refund(), "refund-1").json()
    forge_approval(effect["effect_id"], approver)
    rogue, key = rogue_key(
        approver.principal, confirmed_by=admin.principal, confirmed_at=timezone.now()
    )
    signature = rogue.sign(challenge_bytes(effect, "n-3"))
    store_signature(effect, approver.principal, key, "n-3", signature)
    event = assert_refused_at_dispatch(effect["effect_id"], sandbox, kind="approval_unverified")
    assert "not in the audit chain" in event.reason


def test_check_deploy_warns_when_passkeys_name_no_relying_party(settings):
    from gateway.checks import passkeys_name_their_relying_party

    settings.GATEWAY_SIGNED_APPROVAL_CLASSES = ["financial_write"]
    settings.GATEWAY_WEBAUTHN_RP_ID = ""
    assert [m.id for m in passkeys_name_their_relying_party()] == ["gateway.W003"]
    settings.GATEWAY_WEBAUTHN_RP_ID = "gateway.example.com"
    assert passkeys_name_their_relying_party() == []
