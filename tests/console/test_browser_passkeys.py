"""Passkey approvals in the real browser: Debian's chromium with its virtual authenticator
(Chrome DevTools Protocol, ``WebAuthn`` domain: CTAP2, resident keys, user verification).

alice registers a passkey on /passkeys (static/passkeys.js calls navigator.credentials), the
admin confirms it, alice approves a refund in the inbox with it, and the dispatcher sends it
once: the sandbox provider's log is the oracle. A refund whose approval row is forged is
refused at dispatch and never reaches the provider.

The live server answers on http://localhost:PORT: browsers refuse an IP address as a WebAuthn
relying party id, and ``localhost`` is a secure context without TLS. The RP id follows the
request's host (GATEWAY_WEBAUTHN_RP_ID unset)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from gateway import services
from gateway.models import ApprovalSignature, Effect, EffectEvent, SigningKey
from tests.console.conftest import BIG_REFUND, submit
from tests.console.test_browser import CHROMIUM, browser, page_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.skipif(
    not __import__("pathlib").Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing"
)


def with_virtual_authenticator(page) -> str:
    """Give ``page`` a platform authenticator that verifies its user; its id."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("WebAuthn.enable")
    added = cdp.send(
        "WebAuthn.addVirtualAuthenticator",
        {
            "options": {
                "protocol": "ctap2",
                "transport": "internal",
                "hasResidentKey": True,
                "hasUserVerification": True,
                "isUserVerified": True,
            }
        },
    )
    page._passkey_cdp = cdp  # kept alive with the page
    return added["authenticatorId"]


def test_enrol_confirm_approve_with_a_passkey_and_refuse_a_forged_row(
    browser,  # noqa: F811
    live_server,
    alice,
    root,
    bot,
    sandbox,
    signed_approvals,
):
    assert live_server.url.startswith("http://localhost:")
    page = page_for(browser, live_server, "alice@acme")
    authenticator = with_virtual_authenticator(page)
    # The ceremonies run from a static file: no page here breaks the CSP.
    page.add_init_script(
        "window.__violations = [];"
        "document.addEventListener('securitypolicyviolation', e =>"
        "  window.__violations.push(e.violatedDirective + ' ' + e.blockedURI));"
    )

    # Enrol: the passkey is pending until someone else confirms it.
    page.goto(f"{live_server.url}/passkeys")
    page.get_by_label("Name of the new passkey").fill("virtual")
    page.get_by_role("button", name="Register a passkey").click()
    page.get_by_text("waiting for a confirmation").wait_for()
    key = SigningKey.objects.get(principal=alice.principal)
    assert key.kind == "passkey" and key.rp_id == "localhost" and key.confirmed_at is None
    credentials = page._passkey_cdp.send(
        "WebAuthn.getCredentials", {"authenticatorId": authenticator}
    )
    assert len(credentials["credentials"]) == 1

    # A second person (the admin) confirms it on the same page of theirs.
    admin = page_for(browser, live_server, "root@acme")
    admin.goto(f"{live_server.url}/passkeys")
    admin.get_by_role("button", name="Confirm alice's passkey").click()
    admin.wait_for_url(f"{live_server.url}/passkeys")
    key.refresh_from_db()
    assert key.confirmed_by == root.principal
    admin.context.close()

    # Approve: the inbox asks the authenticator to sign the effect's challenge.
    effect = submit(bot.principal, BIG_REFUND)
    page.goto(f"{live_server.url}/approvals")
    card = page.locator(f"#approval-{effect.pk}")
    digest = page.locator(f"#approval-{effect.pk}-digest").inner_text()
    card.get_by_label("Digest you read").fill(digest)
    card.get_by_role("button", name="Approve with passkey").click()
    card.get_by_text("Now PREPARED: approved by alice").wait_for()
    assert page.evaluate("window.__violations") == []
    stored = ApprovalSignature.objects.get(effect_id=effect.pk)
    assert stored.key_id == key.pk and stored.payload_digest == digest
    page.context.close()

    services.effect_dispatch(effect_id=effect.pk, worker="test")
    services.effect_dispatch(effect_id=effect.pk, worker="test-again")
    assert len(sandbox.log()) == 1  # sent once
    assert Effect.objects.get(pk=effect.pk).status == "CONFIRMED"

    # A forged approval row (no assertion) is refused at dispatch: nothing more is sent.
    forged = submit(bot.principal, {**BIG_REFUND, "resource": {"type": "order", "id": "ord_9"}})
    Effect.objects.filter(pk=forged.pk).update(
        status="PREPARED",
        approval_state="approved",
        approved_by=alice.principal,
        approved_digest=forged.command.payload_digest,
        approved_at=timezone.now(),
        next_dispatch_at=timezone.now(),
    )
    services.effect_dispatch(effect_id=forged.pk, worker="test")
    assert len(sandbox.log()) == 1
    forged.refresh_from_db()
    assert forged.frozen and forged.mismatch
    assert EffectEvent.objects.filter(effect_id=forged.pk, kind="approval_unverified").exists()
