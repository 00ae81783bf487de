"""Asynchronous receipts: signed, deduplicated, order-safe, and never dropped."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from django.test import Client

from gateway.models import Receipt
from reconciliation import services
from reconciliation.choices import CaseReason, WebhookOutcome
from reconciliation.models import Case, OrphanReceipt, WebhookDelivery
from reconciliation.webhooks import BadSignature, sign, verify
from tests.reconciliation.conftest import WEBHOOK_SECRETS, fresh, operations, sends

SECRET = WEBHOOK_SECRETS["tickets"]
URL = "/hooks/providers/tickets"


def hook_body(operation: dict[str, Any], event_id: str, **changes: Any) -> bytes:
    op = {
        key: operation[key]
        for key in ("id", "status", "payload_digest", "result", "idempotency_key")
    }
    op.update(changes)
    return json.dumps({"event_id": event_id, "operation": op}).encode()


def post(body: bytes, *, secret: str = SECRET, at: int | None = None, signature: str | None = None):
    timestamp = str(at if at is not None else int(time.time()))
    client = Client(enforce_csrf_checks=True)  # no session, no CSRF token: must still pass
    return client.post(
        URL,
        data=body,
        content_type="application/json",
        HTTP_X_GATEWAY_TIMESTAMP=timestamp,
        HTTP_X_GATEWAY_SIGNATURE=signature or sign(secret, timestamp, body),
    )


@pytest.fixture
def unknown_with_op(recon_unknown, recon_sandbox):
    effect = recon_unknown()
    [operation] = operations(recon_sandbox, effect)
    return effect, operation


# --- signatures (no database) -------------------------------------------------------------


def test_verify_accepts_a_fresh_signature_and_either_of_two_during_rotation():
    body = b'{"x": 1}'
    now = 1_800_000_000
    good = sign("new", now, body)
    assert verify(secret="new", timestamp=str(now), signature=good, body=body, now=now) == now
    both = f"{sign('old', now, body)}, {good}"
    assert verify(secret="new", timestamp=str(now), signature=both, body=body, now=now + 299)


@pytest.mark.parametrize(
    "timestamp, signature, reason",
    [
        ("1800000000", "v1=" + "0" * 64, "mismatch"),
        ("1799999699", None, "stale"),
        ("1800000301", None, "stale"),
        ("yesterday", None, "malformed"),
        ("", None, "missing"),
    ],
)
def test_verify_refuses(timestamp, signature, reason):
    body = b"{}"
    signature = signature or sign("s", timestamp, body)
    with pytest.raises(BadSignature) as refused:
        verify(secret="s", timestamp=timestamp, signature=signature, body=body, now=1_800_000_000)
    assert refused.value.reason == reason


def test_a_signature_over_another_body_is_refused():
    now = 1_800_000_000
    signature = sign("s", now, b'{"status": "processing"}')
    with pytest.raises(BadSignature):
        verify(
            secret="s",
            timestamp=str(now),
            signature=signature,
            body=b'{"status": "succeeded"}',
            now=now,
        )


# --- the endpoint ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_succeeded_receipt_confirms_an_unknown_effect(unknown_with_op, recon_sandbox):
    effect, operation = unknown_with_op

    response = post(hook_body(operation, "evt_1"))

    assert response.status_code == 200, response.content
    assert response.json() == {
        "received": True,
        "duplicate": False,
        "outcome": "confirmed",
        "effect_id": effect.pk,
    }
    effect = fresh(effect)
    assert effect.status == "CONFIRMED"
    receipt = Receipt.objects.get(effect=effect)
    assert receipt.source == Receipt.Source.WEBHOOK
    assert receipt.digest_matches is True
    assert len(sends(recon_sandbox, effect)) == 1


@pytest.mark.django_db
def test_a_replayed_event_is_applied_once(unknown_with_op):
    effect, operation = unknown_with_op
    body = hook_body(operation, "evt_dup")

    first = post(body)
    second = post(body)

    assert first.status_code == second.status_code == 200
    assert second.json()["duplicate"] is True
    assert WebhookDelivery.objects.filter(event_id="evt_dup").count() == 1
    assert Receipt.objects.filter(effect=effect).count() == 1
    assert fresh(effect).status == "CONFIRMED"


@pytest.mark.django_db
def test_a_late_processing_never_downgrades_a_confirmed_effect(unknown_with_op):
    effect, operation = unknown_with_op

    assert post(hook_body(operation, "evt_done")).json()["outcome"] == "confirmed"
    late = post(hook_body(operation, "evt_early", status="processing"))

    assert late.status_code == 200
    assert late.json()["outcome"] == WebhookOutcome.NOTED
    assert fresh(effect).status == "CONFIRMED"
    assert Receipt.objects.filter(effect=effect).count() == 1


@pytest.mark.django_db
def test_processing_then_succeeded_in_order(unknown_with_op):
    effect, operation = unknown_with_op

    assert post(hook_body(operation, "e1", status="processing")).json()["outcome"] == (
        "in_progress"
    )
    assert fresh(effect).status == "IN_PROGRESS"
    assert post(hook_body(operation, "e2")).json()["outcome"] == "confirmed"
    assert fresh(effect).status == "CONFIRMED"


@pytest.mark.django_db
def test_a_receipt_with_another_digest_is_a_mismatch(unknown_with_op, recon_enqueued):
    effect, operation = unknown_with_op
    recon_enqueued.clear()

    response = post(hook_body(operation, "evt_x", payload_digest="sha256:" + "a" * 64))

    assert response.json()["outcome"] == "mismatch"
    effect = fresh(effect)
    assert effect.status == "UNKNOWN"
    assert effect.mismatch is True
    assert Case.objects.get(effect=effect).reason == CaseReason.MISMATCH
    assert Receipt.objects.get(effect=effect).digest_matches is False
    assert recon_enqueued == []


@pytest.mark.django_db
def test_a_bad_signature_is_401_and_changes_nothing(unknown_with_op):
    effect, operation = unknown_with_op
    body = hook_body(operation, "evt_forged")

    response = post(body, secret="not-the-secret")

    assert response.status_code == 401
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["status"] == 401
    assert not WebhookDelivery.objects.exists()
    assert fresh(effect).status == "UNKNOWN"


@pytest.mark.django_db
def test_a_signature_older_than_five_minutes_is_401(unknown_with_op):
    effect, operation = unknown_with_op

    response = post(hook_body(operation, "evt_old"), at=int(time.time()) - 301)

    assert response.status_code == 401
    assert not WebhookDelivery.objects.exists()
    assert fresh(effect).status == "UNKNOWN"


@pytest.mark.django_db
def test_a_provider_without_a_secret_is_401(unknown_with_op, settings):
    effect, operation = unknown_with_op
    settings.GATEWAY_WEBHOOK_SECRETS = {}

    assert post(hook_body(operation, "evt_nosecret")).status_code == 401
    assert fresh(effect).status == "UNKNOWN"


@pytest.mark.django_db
def test_a_receipt_for_an_unknown_key_is_kept_as_an_orphan(recon_sandbox, recon_requester):
    operation = {
        "id": "op_stray",
        "status": "succeeded",
        "payload_digest": "sha256:" + "b" * 64,
        "result": {"ticket_id": "TCK-1"},
        "idempotency_key": "initech:never-sent",
    }

    response = post(hook_body(operation, "evt_orphan"))

    assert response.status_code == 200
    assert response.json()["outcome"] == "orphan"
    orphan = OrphanReceipt.objects.get()
    assert orphan.provider_operation_id == "op_stray"
    assert orphan.tenant == recon_requester.principal.tenant
    assert orphan.state == "open"
    assert orphan.result == {"ticket_id": "TCK-1"}
    # A replay of the orphan is still one record.
    assert post(hook_body(operation, "evt_orphan")).json()["duplicate"] is True
    assert OrphanReceipt.objects.count() == 1


@pytest.mark.django_db
def test_a_failure_after_confirmation_opens_a_contradiction_case(unknown_with_op):
    effect, operation = unknown_with_op
    post(hook_body(operation, "evt_ok"))

    response = post(hook_body(operation, "evt_fail", status="failed"))

    assert response.json()["outcome"] == "contradiction"
    assert fresh(effect).status == "CONFIRMED"
    assert Case.objects.get(effect=effect).reason == CaseReason.CONTRADICTION


@pytest.mark.django_db
def test_a_malformed_but_signed_body_is_400(recon_sandbox):
    response = post(json.dumps({"event_id": "e", "operation": {"status": 3}}).encode())

    assert response.status_code == 400
    assert set(response.json()["errors"]) >= {"operation.id", "operation.status"}
    assert not WebhookDelivery.objects.exists()


@pytest.mark.django_db
def test_a_receipt_settles_an_escalated_effect_and_its_case(unknown_with_op, recon_sandbox):
    effect, operation = unknown_with_op
    recon_sandbox.add_fault("lookup_unreachable", times=None)
    for _ in range(8):
        services.effect_reconcile(effect_id=effect.pk)
    assert fresh(effect).escalated

    post(hook_body(operation, "evt_late"))

    effect = fresh(effect)
    assert (effect.status, effect.escalated) == ("CONFIRMED", False)
    case = Case.objects.get(effect=effect)
    assert case.state == "resolved"
    assert case.resolved_actor == "webhook:tickets"
