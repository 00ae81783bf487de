"""Issue 13 item 3: an approval bound to a digest survives a tampered database. The dispatcher
recomputes the digest of what it opened, and a payload sealed for one command does not open
for another; a tampered effect is frozen, flagged, handed to its owner and never sent."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command

from gateway import services
from gateway.lib import vault
from gateway.models import Command, Effect, EffectEvent
from reconciliation.models import Case
from reconciliation.services import cases_open_for_flagged

pytestmark = pytest.mark.django_db


def refund(amount: int, order: str) -> dict:
    return {
        "type": "billing.refund.create",
        "resource": {"type": "order", "id": order, "version": 1},
        "payload": {"amount": amount, "currency": "EUR", "reason": "duplicate charge"},
    }


def approve(approver, effect: dict) -> None:
    response = approver.client.post(
        f"/api/v1/effects/{effect['effect_id']}/approve",
        {"payload_digest": effect["payload_digest"]},
        format="json",
    )
    assert response.status_code == 200


def assert_refused_and_never_sent(effect_id: str, sandbox) -> Effect:
    services.effect_dispatch(effect_id=effect_id, worker="test")
    effect = Effect.objects.get(pk=effect_id)
    assert sandbox.log() == []  # the provider saw nothing at all
    # PREPARED when the general claim refused it; NOT_STARTED when the one-statement claim
    # (gateway.fastpath) had claimed it before opening the payload: never sent either way.
    assert effect.status in ("PREPARED", "NOT_STARTED") and effect.frozen and effect.mismatch
    assert EffectEvent.objects.filter(effect_id=effect_id, kind="payload_tampered").count() == 1
    # The owners' queue follows the flag: the reconciler's sweep opens the case.
    cases_open_for_flagged()
    case = Case.objects.get(effect_id=effect_id)
    assert case.reason == "mismatch"
    # Worded as what happened: refused before sending, not a provider that disagreed.
    assert "never sent" in case.reason_text and "provider recorded" not in case.reason_text
    # Another delivery of the message changes nothing and sends nothing.
    services.effect_dispatch(effect_id=effect_id, worker="test-2")
    assert sandbox.log() == []
    return effect


def test_another_commands_sealed_payload_copied_in_never_reaches_the_provider(
    agent, approver, sandbox
):
    approved = agent.submit(refund(20_000, "ord_1"), "refund-20000").json()
    other = agent.submit(refund(99_999, "ord_2"), "refund-99999").json()
    approve(approver, approved)
    # The attack: the command trigger allows re-sealing this one column (key rotation).
    Command.objects.filter(pk=approved["effect_id"]).update(
        payload_sealed=Command.objects.get(pk=other["effect_id"]).payload_sealed
    )
    effect = assert_refused_and_never_sent(approved["effect_id"], sandbox)
    event = EffectEvent.objects.get(effect_id=effect.pk, kind="payload_tampered")
    assert "does not open for this command" in event.reason


def test_a_swapped_legacy_payload_is_caught_by_the_recomputed_digest(agent, approver, sandbox):
    # Payloads sealed before binding existed (plain Fernet) open anywhere: the digest of what
    # was opened is what catches the swap.
    approved = agent.submit(refund(20_000, "ord_1"), "refund-20000").json()
    approve(approver, approved)
    legacy = vault.seal_json(refund(99_999, "ord_1")["payload"])
    Command.objects.filter(pk=approved["effect_id"]).update(payload_sealed=legacy)
    effect = assert_refused_and_never_sent(approved["effect_id"], sandbox)
    event = EffectEvent.objects.get(effect_id=effect.pk, kind="payload_tampered")
    assert "has digest" in event.reason


def test_an_edited_approval_digest_is_refused(agent, approver, sandbox):
    approved = agent.submit(refund(20_000, "ord_1"), "refund-20000").json()
    approve(approver, approved)
    Effect.objects.filter(pk=approved["effect_id"]).update(approved_digest="sha256:" + "0" * 64)
    assert_refused_and_never_sent(approved["effect_id"], sandbox)


def test_an_untouched_command_is_sent_exactly_as_approved(agent, approver, sandbox):
    approved = agent.submit(refund(20_000, "ord_1"), "refund-20000").json()
    approve(approver, approved)
    services.effect_dispatch(effect_id=approved["effect_id"], worker="test")
    assert Effect.objects.get(pk=approved["effect_id"]).status == "CONFIRMED"
    (operation,) = sandbox.operations()
    assert operation["payload"]["amount"] == 20_000
    assert operation["sent_payload_digest"] == approved["payload_digest"]


def test_rotation_rebinds_legacy_payloads_and_keeps_them_readable(agent, settings):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.GATEWAY_VAULT_KEY = old
    vault._fernet.cache_clear()
    try:
        effect_id = agent.submit(refund(500, "ord_1"), "r1").json()["effect_id"]
        command = Command.objects.get(pk=effect_id)
        assert command.payload_sealed.startswith(vault.BOUND_PREFIX)
        legacy_id = agent.submit(refund(600, "ord_2"), "r2").json()["effect_id"]
        Command.objects.filter(pk=legacy_id).update(
            payload_sealed=vault.seal_json(refund(600, "ord_2")["payload"])
        )
        settings.GATEWAY_VAULT_KEY = f"{new},{old}"
        vault._fernet.cache_clear()
        call_command("rotate_vault_key", stdout=open("/dev/null", "w"))  # noqa: SIM115
        settings.GATEWAY_VAULT_KEY = new  # the old key is gone
        vault._fernet.cache_clear()
        for pk, amount in ((effect_id, 500), (legacy_id, 600)):
            rotated = Command.objects.get(pk=pk)
            assert rotated.payload_sealed.startswith(vault.BOUND_PREFIX)
            assert services.command_payload(rotated)["amount"] == amount
    finally:
        vault._fernet.cache_clear()
