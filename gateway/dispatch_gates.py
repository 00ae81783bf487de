"""The provider gates (gateway.providers.protection) on the ledger's dispatch paths that send
one effect at a time: the single dispatch (``services.effect_dispatch``, the sweeper's
message) and the general path a drainer hands refused rows to.

A gate is asked before the claim, for the credential the effect goes out with
(``provider_credentials.dispatch_sender``: its tenant's own, or the deployment's). An effect
it holds back is not claimed: it stays PREPARED or NOT_STARTED, and its ``next_dispatch_at``
moves to when the gate reopens, so the dispatch sweep hands it to a worker again then
(``defer``). A drainer leaves held providers out of its
claim statements (gateway.dispatcher) and drains again when the earliest gate reopens.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

from django.db.models import F
from django.db.models.functions import Greatest

from gateway import provider_credentials
from gateway.choices import DISPATCHABLE
from gateway.contracts import get_contract
from gateway.models import Effect
from gateway.providers import protection
from gateway.providers.base import CallResult
from gateway.providers.gates import Hold

logger = logging.getLogger(__name__)


def gated(effect_id: str, send: Callable[[], bool]) -> bool:
    """``send()`` (claim, call, record: True if it sent) if the effect's provider may take a
    call now; else leave the effect queued until the gate reopens, and return False."""
    view = protection.outlook()  # every provider's, from Redis: no database round trip
    if not view.restricted:
        return send()  # no gate anywhere: what every dispatch meets most of the time
    # One statement: the effect, and the credential its next attempt goes out with.
    row = provider_credentials.dispatch_sender(effect_id)
    if row is None:
        return send()  # no such effect: the claim says so
    name, effect_type, attempts, credential, rate = row
    contract = get_contract(effect_type)
    if contract is not None and attempts >= contract.recovery.max_dispatch_attempts:
        return send()  # its budget is spent: the claim hands it to a human, sends nothing
    hold = view.held.get(name)
    if hold is None and name not in view.permits:
        return send()  # closed, no cap, no rate, no pause: nothing to count
    if hold is not None:
        protection.note_held(name, hold)
        defer(effect_id, hold)
        return False
    granted = protection.admit(name, 1, credential=credential, rate=rate)
    if isinstance(granted, Hold):
        defer(effect_id, granted)
        return False
    sent = False
    try:
        sent = send()
    finally:
        granted.keep(1 if sent else 0)
        if sent:  # answered (or raised): its slot and its probe are free
            protection.release(name, granted.leases, probe=granted.probe)
    return sent


def defer(effect_id: str, hold: Hold) -> None:
    """Keep a held effect queued until its gate reopens. Only a dispatchable effect with a
    dispatch time is moved, and never earlier: a claim that got there first (another worker),
    an approval still awaited or a later retry time stays what it is."""
    at = datetime.fromtimestamp(hold.until, tz=UTC)
    moved = Effect.objects.filter(
        pk=effect_id, status__in=DISPATCHABLE, next_dispatch_at__isnull=False
    ).update(next_dispatch_at=Greatest(F("next_dispatch_at"), at))
    if moved:
        logger.info(
            "dispatch held by the provider's %s",
            hold.gate,
            extra={"effect_id": effect_id, "until": at.isoformat()},
        )


def observe_answer(effect_type: str, result: CallResult, credential: str | None = None) -> None:
    """Count a provider's answer for its circuit and its ``Retry-After`` (every send path
    passes its answers here, ``services._observe_dispatch``), the pause against the
    ``credential`` the call carried (a tenant's fingerprint; None: the deployment's)."""
    contract = get_contract(effect_type)
    if contract is not None:
        protection.observe(contract.provider, [result], credential=credential)
