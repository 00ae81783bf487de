"""What an approver reads: a frozen saga or type on the card (and no "queued for dispatch"
while frozen), a wrong digest answered without the right one, amounts in major units, a
promotion beside what is live, a look-alike of something that already happened."""

from __future__ import annotations

from gateway.models import EffectTypeFreeze
from tests.console.conftest import BIG_REFUND, set_state, submit

PROMOTE = {
    "type": "deployment.release.promote",
    "resource": {"type": "service", "id": "checkout", "version": 41},
    "payload": {"environment": "production", "sha": "a1b2c3d4e5f6", "release": "r-42"},
}


def test_wrong_digest_never_prints_the_right_one(alice, bot):
    effect = submit(bot.principal, BIG_REFUND)
    response = alice.htmx(
        "post",
        f"/effects/{effect.pk}/approve",
        {"payload_digest": "sha256:" + "1" * 64, "view": "approvals"},
    )
    assert response.status_code == 409 or response.status_code == 400
    assert effect.command.payload_digest.removeprefix("sha256:") not in response.content.decode()


def test_amounts_in_major_units_on_the_card(alice, bot):
    submit(bot.principal, BIG_REFUND)
    html = alice.client.get("/approvals").content.decode()
    assert '250.00 EUR <span class="muted small">(25000 in minor units)</span>' in html


def test_frozen_type_is_on_the_card_and_approval_does_not_say_queued(alice, root, bot):
    effect = submit(bot.principal, BIG_REFUND)
    EffectTypeFreeze.objects.create(
        tenant=root.principal.tenant, type=effect.type, frozen_by=root.principal, reason="incident"
    )
    html = alice.client.get("/approvals").content.decode()
    assert "Approving does not send it now: billing.refund.create is frozen" in html
    response = alice.client.post(
        f"/effects/{effect.pk}/approve",
        {"payload_digest": effect.command.payload_digest},
        follow=True,
    )
    page = response.content.decode()
    assert "is not dispatched yet: billing.refund.create is frozen" in page
    assert "queued for dispatch" not in page


def test_promotion_shows_what_is_live_and_look_alikes(alice, bot):
    live = set_state(
        submit(
            bot.principal,
            {
                **PROMOTE,
                "payload": {**PROMOTE["payload"], "sha": "0f9e8d7c6b5a", "release": "r-41"},
            },
        ),
        status="CONFIRMED",
    )
    from django.utils import timezone

    set_state(live, confirmed_at=timezone.now())
    waiting = submit(bot.principal, PROMOTE)
    assert waiting.status == "AWAITING_APPROVAL"
    html = alice.client.get("/approvals").content.decode()
    assert "Live now" in html and "0f9e8d7c6b5a" in html and "a1b2c3d4e5f6" in html
    # The same promotion already happened under another key: a look-alike.
    set_state(submit(bot.principal, PROMOTE), status="CONFIRMED")
    html = alice.client.get("/approvals").content.decode()
    assert "The same digest already happened under another key" in html
