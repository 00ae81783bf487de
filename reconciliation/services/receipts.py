"""Asynchronous receipts: providers' webhooks, applied at most once and never backwards."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError
from django.utils import timezone

from gateway import ledger
from gateway.choices import TO_RECONCILE, Outcome
from gateway.contracts import get_contract
from gateway.models import Command, Effect, Receipt, Tenant
from gateway.providers.base import CallResult, ProviderOperation
from gateway.providers.http import classify_operation
from gateway.submission import provider_key_tenant
from reconciliation.choices import CaseReason, WebhookOutcome
from reconciliation.metrics import WEBHOOKS
from reconciliation.models import OrphanReceipt, WebhookDelivery
from reconciliation.services.cases import _case_settle, case_open
from reconciliation.services.core import _CONFIRMED_OR_LATER, S, _writing, logger, on_mismatch


@dataclass(frozen=True)
class WebhookReceipt:
    """One provider event, as parsed from a verified webhook body."""

    provider: str
    event_id: str
    idempotency_key: str
    operation: ProviderOperation
    signed_at: datetime


def webhook_receive(*, receipt: WebhookReceipt) -> tuple[WebhookDelivery, bool]:
    """Apply one asynchronous receipt, once. Returns (delivery, created); a redelivered event
    returns the first delivery and changes nothing."""
    duplicate = WebhookDelivery.objects.filter(
        provider=receipt.provider, event_id=receipt.event_id
    ).first()
    if duplicate is not None:
        return duplicate, False
    operation = receipt.operation
    command = None
    if receipt.idempotency_key:
        # The key the gateway sent is the tenant-scoped provider_key.
        command = Command.objects.filter(
            provider=receipt.provider, provider_key=receipt.idempotency_key
        ).first()
    effect_id = command.effect_id if command is not None else None
    if effect_id is None and operation.id:
        effect_id = (
            Effect.objects.filter(
                command__provider=receipt.provider, provider_operation_id=operation.id
            )
            .values_list("pk", flat=True)
            .first()
        )
    tenant_id = (
        Effect.objects.filter(pk=effect_id).values_list("tenant_id", flat=True).first()
        if effect_id is not None
        else None
    )
    now = timezone.now()
    try:
        with _writing(tenant_id):
            # A concurrent copy of the same event queues on the chain head (or, for an
            # orphan, on the unique (provider, event_id) index) and then fails against that
            # index: it changes nothing.
            delivery = WebhookDelivery.objects.create(
                provider=receipt.provider,
                event_id=receipt.event_id,
                idempotency_key=receipt.idempotency_key,
                provider_operation_id=operation.id,
                provider_status=operation.status,
                payload_digest=operation.payload_digest,
                outcome=WebhookOutcome.NOTED,
                signed_at=receipt.signed_at,
                received_at=now,
            )
            effect: Effect | None = None
            status = ""
            if effect_id is None:
                _orphan(delivery, receipt, now)
                outcome: str = WebhookOutcome.ORPHAN
                detail = "no command of ours has this key or operation id; kept for a human"
            else:
                # Locked against the reconciler and an operator writing the same effect.
                effect = (
                    Effect.objects.select_for_update().select_related("command").get(pk=effect_id)
                )
                status = effect.status
                outcome, detail = _apply_receipt(effect, receipt, now)
            WebhookDelivery.objects.filter(pk=delivery.pk).update(
                effect=effect, effect_status=status, outcome=outcome, detail=detail[:4000]
            )
    except IntegrityError:
        duplicate = WebhookDelivery.objects.filter(
            provider=receipt.provider, event_id=receipt.event_id
        ).first()
        if duplicate is None:
            raise
        return duplicate, False
    delivery.refresh_from_db()
    WEBHOOKS.labels(provider=receipt.provider, outcome=delivery.outcome).inc()
    return delivery, True


def _orphan(delivery: WebhookDelivery, receipt: WebhookReceipt, now: datetime) -> OrphanReceipt:
    slug = provider_key_tenant(receipt.idempotency_key)
    tenant = Tenant.objects.filter(slug=slug).first() if slug is not None else None
    logger.warning(
        "orphan receipt",
        extra={"provider": receipt.provider, "operation_id": receipt.operation.id},
    )
    return OrphanReceipt.objects.create(
        delivery=delivery,
        tenant=tenant,
        provider=receipt.provider,
        idempotency_key=receipt.idempotency_key,
        provider_operation_id=receipt.operation.id,
        provider_status=receipt.operation.status,
        payload_digest=receipt.operation.payload_digest,
        result=receipt.operation.result,
        received_at=now,
    )


@dataclass(frozen=True)
class _Applying:
    """A receipt being applied to its locked effect: what the provider's operation proves
    (``found``), the events' evidence (``data``), who writes (``actor``) and when."""

    effect: Effect
    found: CallResult
    operation: ProviderOperation
    data: dict[str, Any]
    actor: str
    now: datetime

    @classmethod
    def of(cls, effect: Effect, receipt: WebhookReceipt, now: datetime) -> _Applying:
        contract = get_contract(effect.type)
        operation = receipt.operation
        found = classify_operation(
            operation,
            expected_digest=effect.command.payload_digest,
            completion_statuses=contract.completion_statuses if contract else frozenset(),
        )
        data = {
            "event_id": receipt.event_id,
            "provider_operation_id": operation.id,
            "provider_status": operation.status,
            "provider_digest": operation.payload_digest,
        }
        return cls(effect, found, operation, data, f"webhook:{receipt.provider}", now)

    def store(self) -> None:
        ledger.record_receipt(
            self.effect, self.found, source=Receipt.Source.WEBHOOK, attempt_id=None, now=self.now
        )


def _apply_receipt(effect: Effect, receipt: WebhookReceipt, now: datetime) -> tuple[str, str]:
    """What one receipt does to a locked effect. Order-safe: a receipt never moves an effect
    backwards (a late ``processing`` after CONFIRMED is only noted), and it confirms only on a
    matching digest."""
    applying = _Applying.of(effect, receipt, now)
    status = effect.status
    if status in TO_RECONCILE:
        return _apply_to_uncertain(applying)
    if status in _CONFIRMED_OR_LATER:
        return _apply_after_confirmation(applying)
    # In flight (DISPATCHING: the worker's own answer or lease recovery settles it), not yet
    # sent, or already terminal: kept as evidence, nothing changes.
    return WebhookOutcome.NOTED, f"{applying.found.reason}; the effect is {status}, left as it is"


def _apply_to_uncertain(applying: _Applying) -> tuple[str, str]:
    """An UNKNOWN or IN_PROGRESS effect: the receipt settles it, moves it on, or flags it."""
    effect, found, status = applying.effect, applying.found, applying.effect.status
    if effect.mismatch:
        applying.store()
        return WebhookOutcome.NOTED, (
            f"{found.reason}; the effect is held for a mismatch, so an owner decides"
        )
    if found.mismatch:
        return _receipt_mismatch(applying)
    if found.outcome in (Outcome.CONFIRMED, Outcome.REJECTED):
        to = S.CONFIRMED if found.outcome == Outcome.CONFIRMED else S.REJECTED
        extra: dict[str, Any] = {"confirmed_at": applying.now} if to == S.CONFIRMED else {}
        ledger.transition(
            effect,
            to=to,
            actor=applying.actor,
            kind="webhook",
            reason=f"asynchronous receipt: {found.reason}",
            data=applying.data,
            next_check_at=None,
            lease_expires_at=None,
            escalated=False,
            provider_operation_id=applying.operation.id,
            **extra,
        )
        applying.store()
        _case_settle(effect, actor=applying.actor, resolution=f"settled by webhook: {found.reason}")
        return (
            WebhookOutcome.CONFIRMED if to == S.CONFIRMED else WebhookOutcome.REJECTED,
            found.reason,
        )
    if found.outcome == Outcome.IN_PROGRESS and status == S.UNKNOWN:
        ledger.transition(
            effect,
            to=S.IN_PROGRESS,
            actor=applying.actor,
            kind="webhook",
            reason=f"asynchronous receipt: {found.reason}",
            data=applying.data,
            provider_operation_id=applying.operation.id,
        )
        applying.store()
        return WebhookOutcome.IN_PROGRESS, found.reason
    return WebhookOutcome.NOTED, f"{found.reason}; nothing to change for a {status} effect"


def _receipt_mismatch(applying: _Applying) -> tuple[str, str]:
    """The provider did something other than the command: flagged (an UNKNOWN effect stays
    UNKNOWN, an IN_PROGRESS one becomes UNKNOWN), lookups stop, a case opens."""
    effect, found, actor = applying.effect, applying.found, applying.actor
    fields: dict[str, Any] = {
        "mismatch": True,
        "next_check_at": None,
        "provider_operation_id": applying.operation.id,
    }
    if effect.status == S.UNKNOWN:
        ledger.annotate(
            effect,
            fields=fields,
            kind="mismatch",
            actor=actor,
            reason=found.reason,
            data=applying.data,
            now=applying.now,
        )
    else:
        ledger.transition(
            effect,
            to=S.UNKNOWN,
            actor=actor,
            kind="webhook",
            reason=found.reason,
            data=applying.data,
            **fields,
        )
    applying.store()
    case_open(
        effect=effect,
        reason=CaseReason.MISMATCH,
        text=found.reason,
        actor=actor,
        evidence=applying.data,
    )
    on_mismatch(effect)
    return WebhookOutcome.MISMATCH, found.reason


def _apply_after_confirmation(applying: _Applying) -> tuple[str, str]:
    """CONFIRMED, or later (compensating): never downgraded. A failure or another digest
    after the fact is a contradiction for a human, not a state change."""
    effect, found, status = applying.effect, applying.found, applying.effect.status
    if found.mismatch or found.outcome == Outcome.REJECTED:
        text = f"a receipt for a {status} effect says: {found.reason}"
        ledger.append_event(
            effect,
            kind="receipt_contradiction",
            actor=applying.actor,
            from_status=status,
            to_status=status,
            reason=text,
            data=applying.data,
            now=applying.now,
        )
        applying.store()
        case_open(
            effect=effect,
            reason=CaseReason.CONTRADICTION,
            text=text,
            actor=applying.actor,
            evidence=applying.data,
        )
        return WebhookOutcome.CONTRADICTION, text
    return WebhookOutcome.NOTED, f"late or repeated receipt ({found.reason}), {status} stays"
