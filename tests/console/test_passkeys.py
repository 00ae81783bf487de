"""Passkeys in the console without a browser: a software authenticator (tests/support) answers
the ceremonies the pages start. Registration waits for another approver or an admin; the
inbox asks for a passkey on money and irreversible types; the assertion goes with the
approval form and is stored with the approval. The browser's own virtual authenticator runs
the same flow in tests/console/test_browser_passkeys.py."""

from __future__ import annotations

import json

import pytest

from gateway import services
from gateway.lib.approval_challenge import unb64url
from gateway.models import ApprovalSignature, EffectEvent, SigningKey
from tests.console.conftest import BIG_REFUND, submit
from tests.support.authenticator import SoftAuthenticator

pytestmark = pytest.mark.django_db

# Django's test client talks to http://testserver: the RP id and origin follow the request.
ORIGIN = "http://testserver"


def register(person, authenticator: SoftAuthenticator, name: str = "laptop") -> SigningKey:
    options = person.client.post("/passkeys/options").json()
    assert options["rp"]["id"] == "testserver"
    assert options["authenticatorSelection"]["userVerification"] == "required"
    response = person.client.post(
        "/passkeys/register",
        json.dumps({"credential": authenticator.register(options), "name": name}),
        content_type="application/json",
    )
    assert response.status_code == 200, response.content
    return SigningKey.objects.get(pk=response.json()["id"])


def signed_form(person, authenticator: SoftAuthenticator, effect) -> dict:
    challenge = person.client.post(f"/effects/{effect.pk}/approval-challenge").json()
    assert challenge["payload_digest"] == effect.command.payload_digest
    signed = authenticator.sign(unb64url(challenge["challenge"]))
    return {
        "payload_digest": effect.command.payload_digest,
        "view": "approvals",
        "signature": signed["signature"],
        "signature_nonce": challenge["nonce"],
        "signature_key_id": signed["key_id"],
        "signature_authenticator_data": signed["authenticator_data"],
        "signature_client_data_json": signed["client_data_json"],
    }


def test_a_passkey_signs_nothing_until_another_approver_confirms_it(
    signed_approvals, alice, root, bot
):
    authenticator = SoftAuthenticator(origin=ORIGIN, rp_id="testserver")
    key = register(alice, authenticator)
    assert key.confirmed_at is None and key.rp_id == "testserver"
    page = alice.client.get("/passkeys").content.decode()
    assert "waiting for a confirmation" in page
    # Its owner cannot confirm it.
    assert alice.client.post(f"/passkeys/{key.pk}/confirm").status_code == 403
    effect = submit(bot.principal, BIG_REFUND)
    inbox = alice.client.get("/approvals").content.decode()
    assert "you have no confirmed one" in inbox
    # An assertion by the pending key is refused: nothing changes.
    response = alice.htmx(
        "post", f"/effects/{effect.pk}/approve", signed_form(alice, authenticator, effect)
    )
    assert response.status_code == 403
    effect.refresh_from_db()
    assert effect.status == "AWAITING_APPROVAL"
    # The admin sees it waiting and confirms it; both acts are in the audit chain.
    assert "Confirm alice's passkey" in root.client.get("/passkeys").content.decode()
    assert root.client.post(f"/passkeys/{key.pk}/confirm").status_code == 302
    key.refresh_from_db()
    assert key.confirmed_by == root.principal
    kinds = set(
        EffectEvent.objects.filter(subject=f"signing-key:{key.pk}").values_list("kind", flat=True)
    )
    assert kinds == {"signing_key_registered", "signing_key_confirmed"}


def test_approving_with_a_confirmed_passkey_stores_the_assertion_and_sends_once(
    signed_approvals, alice, root, bot, sandbox
):
    authenticator = SoftAuthenticator(origin=ORIGIN, rp_id="testserver")
    key = register(alice, authenticator)
    root.client.post(f"/passkeys/{key.pk}/confirm")
    effect = submit(bot.principal, BIG_REFUND)
    inbox = alice.client.get("/approvals").content.decode()
    assert "Approve with passkey" in inbox and "data-passkey-approve" in inbox
    assert "/static/passkeys.js" in inbox
    # Without the assertion: refused, the digest alone is not enough for money.
    plain = alice.htmx(
        "post",
        f"/effects/{effect.pk}/approve",
        {"payload_digest": effect.command.payload_digest, "view": "approvals"},
    )
    assert plain.status_code == 403
    response = alice.htmx(
        "post", f"/effects/{effect.pk}/approve", signed_form(alice, authenticator, effect)
    )
    assert response.status_code == 200, response.content
    assert "Now PREPARED: approved by alice" in response.content.decode()
    stored = ApprovalSignature.objects.get(effect=effect)
    assert stored.key == key and stored.payload_digest == effect.command.payload_digest
    assert stored.authenticator_data and stored.client_data_json and stored.sign_count == 1
    services.effect_dispatch(effect_id=effect.pk, worker="test")
    services.effect_dispatch(effect_id=effect.pk, worker="test-2")
    assert len(sandbox.log()) == 1


def test_an_assertion_from_another_origin_is_refused(signed_approvals, alice, root, bot):
    authenticator = SoftAuthenticator(origin=ORIGIN, rp_id="testserver")
    key = register(alice, authenticator)
    root.client.post(f"/passkeys/{key.pk}/confirm")
    effect = submit(bot.principal, BIG_REFUND)
    challenge = alice.client.post(f"/effects/{effect.pk}/approval-challenge").json()
    phished = authenticator.sign(unb64url(challenge["challenge"]), origin="https://evil.example")
    form = {
        "payload_digest": effect.command.payload_digest,
        "view": "approvals",
        "signature": phished["signature"],
        "signature_nonce": challenge["nonce"],
        "signature_key_id": phished["key_id"],
        "signature_authenticator_data": phished["authenticator_data"],
        "signature_client_data_json": phished["client_data_json"],
    }
    assert alice.htmx("post", f"/effects/{effect.pk}/approve", form).status_code == 403
    effect.refresh_from_db()
    assert effect.status == "AWAITING_APPROVAL"


def test_the_effect_page_approves_with_a_passkey_too(signed_approvals, alice, root, bot):
    authenticator = SoftAuthenticator(origin=ORIGIN, rp_id="testserver")
    key = register(alice, authenticator)
    root.client.post(f"/passkeys/{key.pk}/confirm")
    effect = submit(bot.principal, BIG_REFUND)
    page = alice.client.get(f"/effects/{effect.pk}").content.decode()
    assert "Approve this digest with passkey" in page and "data-passkey-approve" in page
    form = {**signed_form(alice, authenticator, effect), "view": "effect"}
    assert alice.htmx("post", f"/effects/{effect.pk}/approve", form).status_code == 200
    effect.refresh_from_db()
    assert effect.status == "PREPARED" and effect.signatures.count() == 1
