"""The dispatch sweep: the ledger's answer to a lost message. Every few seconds it expires the
commands that ran out before they were sent, and hands the dispatchable effects whose
dispatch has gone quiet to a worker again (``gateway.services.dispatch_sweep``, run by the
beat's task). The broker can lose a message; the ledger cannot.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import DateTimeField, DurationField, ExpressionWrapper, F, Value
from django.db.models.functions import Greatest, Least
from django.utils import timezone

from gateway import hooks, ledger
from gateway.choices import BEFORE_DISPATCH, DISPATCHABLE, EffectStatus
from gateway.models import Effect

logger = logging.getLogger(__name__)

S = EffectStatus


def redeliver_at(now: datetime) -> Any:
    """When the sweeper may send an overdue effect's message again (an SQL expression on the
    row): after as long as the effect has waited so far, at least GATEWAY_REDELIVER_AFTER and
    at most GATEWAY_REDELIVER_MAX.

    The first message is most likely waiting behind a backlog, not lost: a fixed interval
    re-sent every waiting effect every 30 s (300 effects queued → 1983 messages, 1620 of them
    no-ops that lengthened the very backlog). Doubling the wait bounds the copies per effect
    by log2(backlog / interval) and still resends a truly lost message within the cap.
    """
    waited = ExpressionWrapper(Value(now) - F("status_changed_at"), output_field=DurationField())
    wait = Least(
        Greatest(Value(timedelta(seconds=settings.GATEWAY_REDELIVER_AFTER)), waited),
        Value(timedelta(seconds=settings.GATEWAY_REDELIVER_MAX)),
    )
    return ExpressionWrapper(Value(now) + wait, output_field=DateTimeField())


def dispatch_sweep(*, limit: int = 500) -> int:
    """Re-send PREPARED/NOT_STARTED effects whose dispatch has gone quiet, and expire the ones
    whose command ran out. The broker can lose a message; the ledger cannot.

    An overdue effect is most often waiting behind a backlog, not lost: a drainer is at work
    and will claim it with the rest. So the first time a drain would take it (PREPARED, not a
    saga's step), the sweeper wakes one more drainer for all of them at once instead of a
    message each; one message per overdue effect had each sent through the single dispatch,
    the dearest path, while the backlog lasted (9,050 overdue at once in one profiled pass of
    the bench: half the worker's samples went to publishing and running those messages).
    Held effects (a frozen principal or type) are no drain's: during a backlog they wait, as
    they must, and once unfrozen they are due to every drain again (the next one takes them,
    or the sweep's first look after the drainers stop sends them one by one).
    While a drainer is at work (it claimed in the last few seconds: ``hooks.drainers_at_work``)
    that holds at every look, however long the backlog lasts. Otherwise an effect overdue
    again (a wake-up nobody answered: no drainer threads, or Redis lost it), a NOT_STARTED
    one (its retry time, which a drain respects, was just pushed back) and a saga's step get
    their own message, as always. ``_first_look`` says how the sweeper tells a second look.
    """
    from gateway.services import effect_expire  # services re-exports this sweep

    now = timezone.now()
    expired = 0
    for effect in Effect.objects.select_related("command").filter(
        status__in=BEFORE_DISPATCH, command__expires_at__lte=now
    )[:limit]:
        with transaction.atomic():
            expired += effect_expire(effect=effect, actor="sweeper")
    waiting = Effect.objects.filter(
        status__in=DISPATCHABLE, next_dispatch_at__lte=now, frozen=False
    )
    # Effects held (a frozen saga) wait where they are: sending them to a worker that will
    # refuse them every sweep is noise.
    for hold in hooks.dispatch_holds:
        waiting = hold.exclude(waiting)
    # One batch: the due rows locked and pushed back in two statements, however many.
    # SKIP LOCKED against a second sweeper (two beats, a misconfiguration) and against a
    # worker claiming one of them right now; even a double enqueue sends once (the claim).
    with transaction.atomic():
        due = list(
            waiting.order_by("next_dispatch_at")
            .select_for_update(skip_locked=True, of=("self",))
            .values_list("pk", "status", "status_changed_at", "command__saga_id")[:limit]
        )
        if due:
            Effect.objects.filter(pk__in=[row[0] for row in due]).update(
                next_dispatch_at=redeliver_at(now)
            )
    drains_take = [row for row in due if row[1] == S.PREPARED and not row[3]]
    at_work = bool(drains_take) and _drainers_at_work()
    drained = [row[0] for row in drains_take if at_work or _first_look(now, row[2])]
    if drained:
        # One wake-up past the due flag, whoever holds it: a drainer claims every PREPARED
        # effect, in order of next_dispatch_at, until none is left.
        ledger.publish(hooks.wake_sender.send, f"sweep: {len(drained)} overdue")
    for effect_id in {row[0] for row in due} - set(drained):
        ledger.publish(hooks.dispatch_sender.send, effect_id)
    return len(due) + expired


def _drainers_at_work() -> bool:
    """Whether a drainer claimed work in the last few seconds (``hooks.drainers_at_work``);
    False when Redis cannot say: the sweep then sends what it saw before one by one."""
    try:
        return hooks.drainers_at_work.ask()
    except Exception:
        logger.warning("could not ask whether a drainer is at work", exc_info=True)
        return False


def _first_look(now: datetime, status_changed_at: datetime) -> bool:
    """Whether the sweeper sees an overdue PREPARED effect for the first time. Without a
    column for it: such an effect is due ``GATEWAY_REDELIVER_AFTER`` after its status changed
    (submission or approval), and each look pushes it back by at least as long as it has
    waited (``redeliver_at``), so at a second look it has waited at least twice that. A
    sweeper that was down longer than that sends one by one, as before: the old way is always
    correct, only dearer."""
    return now - status_changed_at < 2 * timedelta(seconds=settings.GATEWAY_REDELIVER_AFTER)
