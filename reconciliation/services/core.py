"""What every write of reconciliation shares: the actors' names, the one transaction shape
(``_writing``: the tenant's chain head first) and the mismatch hook."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from django.db import transaction

from gateway import audit, hooks
from gateway.choices import EffectStatus
from gateway.models import Effect

# One logger for the package, under the name it always had.
logger = logging.getLogger("reconciliation.services")

S = EffectStatus
RECONCILER = "reconciler"
LEASE_RECOVERY = "lease-recovery"
# Statuses whose effect may still carry a flag (escalated, mismatch) that needs a case.
# PREPARED: a payload found tampered at the claim (gateway.integrity), frozen and never sent.
_FLAGGABLE = (S.UNKNOWN, S.IN_PROGRESS, S.NOT_STARTED, S.PREPARED)
# A receipt never moves these back: the effect happened, whatever arrives late.
_CONFIRMED_OR_LATER = frozenset({S.CONFIRMED, S.COMPENSATING, S.COMPENSATED, S.COMPENSATION_FAILED})
# After an unexpected error on one effect, wait at least this long before trying it again.
POISON_DELAY = timedelta(minutes=5)


@contextmanager
def _writing(tenant_id: int | None) -> Iterator[None]:
    """A transaction that writes effects, cases or events of one tenant.

    It takes the tenant's audit-chain head first: the ledger's lock order (gateway.audit) is
    chain head, then rows. A transition of the same effect by another actor (which locks the
    head, then the row) then queues behind this one instead of deadlocking with it.
    """
    with transaction.atomic():
        if tenant_id is not None:
            audit.lock_chain(tenant_id)
        yield


def on_mismatch(effect: Effect) -> None:
    """Called whenever an effect is found to disagree with its command (inside the transaction
    that records it, or the sweep's for mismatches found at dispatch).

    The listeners of ``hooks.mismatch_found`` act here (sagas freezes the effect's run).
    Beyond them the mismatch flag, the event and the case for the owner are the whole
    response: the effect is never re-executed and never CONFIRMED by the automatic paths.
    """
    logger.warning("effect mismatch", extra={"effect_id": effect.pk, "owner": effect.owner})
    for listener in hooks.mismatch_found:
        listener(
            effect,
            actor=RECONCILER,
            reason=f"effect {effect.pk} disagrees with its command (mismatch)",
        )
