"""Receipts recorded by a person, checked against the provider once its lookups answer: the
provider's receipt is appended next to the manual one (never over it), and a disagreement on
the operation id, the payload digest or a declared receipt field opens a mismatch case."""

from __future__ import annotations

import time
from typing import Any

from django.db.models import Exists, OuterRef
from django.utils import timezone

from gateway import ledger
from gateway.choices import Outcome
from gateway.contracts import EffectContract, get_contract
from gateway.models import Effect, Receipt
from gateway.providers.base import LookupResult
from gateway.providers.base import LookupStatus as ProviderLookupStatus
from gateway.providers.http import classify_operation
from reconciliation.choices import UNRESOLVED, CaseReason
from reconciliation.models import Case
from reconciliation.services.cases import case_open
from reconciliation.services.core import RECONCILER, _writing, logger


def manual_receipts_pending(limit: int = 20) -> list[str]:
    """Effects whose newest receipt is a person's and that have no open case: the provider
    has not been heard since (served by the partial index ``receipt_manual``)."""
    provider_since = Receipt.objects.filter(
        effect_id=OuterRef("effect_id"), received_at__gt=OuterRef("received_at")
    ).exclude(source=Receipt.Source.MANUAL)
    open_case = Case.objects.filter(effect_id=OuterRef("effect_id"), state__in=sorted(UNRESOLVED))
    newer_manual = Receipt.objects.filter(
        effect_id=OuterRef("effect_id"),
        source=Receipt.Source.MANUAL,
        received_at__gt=OuterRef("received_at"),
    )
    return list(
        Receipt.objects.filter(source=Receipt.Source.MANUAL)
        .exclude(Exists(provider_since))
        .exclude(Exists(newer_manual))
        .exclude(Exists(open_case))
        .order_by("received_at")
        .values_list("effect_id", flat=True)[:limit]
    )


def manual_receipts_verify(*, limit: int = 20, deadline: float | None = None) -> int:
    """Look up the effects confirmed by hand whose provider has not answered since; returns
    how many the provider answered for. An unreachable provider is asked again next sweep;
    ``deadline`` (a ``time.monotonic`` value) stops starting new lookups."""
    from reconciliation.services.reconciler import _lookup

    answered = 0
    for effect_id in manual_receipts_pending(limit):
        if deadline is not None and time.monotonic() >= deadline:
            break
        effect = Effect.objects.select_related("command").get(pk=effect_id)
        contract = get_contract(effect.type)
        if contract is None:
            continue
        try:
            _, lookup = _lookup(effect, contract)
        except Exception:
            logger.exception("manual receipt lookup failed", extra={"effect_id": effect_id})
            continue
        if lookup.status in (ProviderLookupStatus.FOUND, ProviderLookupStatus.NOT_FOUND):
            manual_receipt_compare(effect, contract, lookup)
            answered += 1
    return answered


def disagreements(
    manual: Receipt, contract: EffectContract, lookup: LookupResult, expected_digest: str
) -> list[str]:
    """Where the provider's answer and the person's receipt differ, one phrase each."""
    operation = lookup.operation
    if lookup.status != ProviderLookupStatus.FOUND or operation is None:
        return ["the provider has no operation for this effect"]
    found = classify_operation(
        operation,
        expected_digest=expected_digest,
        completion_statuses=contract.completion_statuses,
        http_status=lookup.http_status,
    )
    differ: list[str] = []
    if manual.provider_operation_id and operation.id != manual.provider_operation_id:
        differ.append(f"operation id {operation.id}, not {manual.provider_operation_id}")
    if operation.payload_digest != manual.payload_digest:
        differ.append(f"payload digest {operation.payload_digest or 'none'}")
    for name in contract.receipt_fields:
        given = manual.result.get(name)
        if given and str(operation.result.get(name, "")) != given:
            differ.append(f"{name} {operation.result.get(name) or 'none'}, not {given}")
    if found.outcome == Outcome.REJECTED:
        differ.append(f"it failed ({found.reason})")
    return differ


def manual_receipt_compare(effect: Effect, contract: EffectContract, lookup: LookupResult) -> None:
    """Append the provider's receipt; open a mismatch case when it disagrees with the one a
    person recorded."""
    now = timezone.now()
    with _writing(effect.tenant_id):
        locked = Effect.objects.select_for_update().select_related("command").get(pk=effect.pk)
        manual = (
            locked.receipts.filter(source=Receipt.Source.MANUAL)
            .order_by("-received_at", "-id")
            .first()
        )
        if manual is None:
            return
        differ = disagreements(manual, contract, lookup, locked.command.payload_digest)
        operation = lookup.operation
        data: dict[str, Any] = {
            "manual_receipt": manual.pk,
            "provider_operation_id": operation.id if operation else None,
            "provider_status": operation.status if operation else None,
            "provider_digest": operation.payload_digest if operation else None,
            "lookup_status": lookup.status,
        }
        if operation is not None:
            found = classify_operation(
                operation,
                expected_digest=locked.command.payload_digest,
                completion_statuses=contract.completion_statuses,
                http_status=lookup.http_status,
            )
            ledger.record_receipt(
                locked, found, source=Receipt.Source.RECONCILER, attempt_id=None, now=now
            )
        if not differ:
            ledger.append_event(
                locked,
                kind="receipt_verified",
                actor=RECONCILER,
                from_status=locked.status,
                to_status=locked.status,
                reason=f"the provider's receipt agrees with the one {manual.recorded_by} recorded",
                data=data,
                now=now,
            )
            return
        text = f"the provider disagrees with the receipt {manual.recorded_by} recorded: " + (
            "; ".join(differ)
        )
        ledger.append_event(
            locked,
            kind="receipt_mismatch",
            actor=RECONCILER,
            from_status=locked.status,
            to_status=locked.status,
            reason=text,
            data=data,
            now=now,
        )
        case_open(
            effect=locked, reason=CaseReason.MISMATCH, text=text, actor=RECONCILER, evidence=data
        )
