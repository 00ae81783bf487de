"""What sagas hear from the ledger, through ``gateway.hooks`` (registered in
``SagasConfig.ready``): the ledger never imports sagas.

- ``after_transition``: a status change of one of a run's effects advances the run, after
  commit (a worker must see the change).
- ``dispatch_holds``: nothing of a frozen run is sent, and the dispatch sweep does not
  re-enqueue its waiting effects.
- ``mismatch_found``: an effect that disagrees with its command freezes its run.
"""

from __future__ import annotations

from functools import partial

from django.db import transaction
from django.db.models import QuerySet

from gateway import ledger
from gateway.hooks import DispatchHold, fast_path_idle
from gateway.models import Effect
from sagas.models import SagaRun
from sagas.selectors import saga_blocks_dispatch
from sagas.services import saga_freeze
from sagas.tasks import advance_saga


@fast_path_idle("the claim and the record require c.saga_id = '': no step of a saga")
def advance_after_transition(effect: Effect, *, from_status: str, to: str) -> None:
    saga_id = effect.command.saga_id
    if saga_id:
        transaction.on_commit(partial(ledger.publish, advance_saga.delay, saga_id))


def _held(effect: Effect) -> bool:
    saga_id = effect.command.saga_id
    return bool(saga_id) and saga_blocks_dispatch(saga_id)


def _exclude_frozen(query: QuerySet[Effect]) -> QuerySet[Effect]:
    return query.exclude(command__saga_id__in=SagaRun.objects.filter(frozen=True).values("pk"))


FROZEN_SAGA = DispatchHold(
    "frozen saga",
    holds=_held,
    exclude=_exclude_frozen,
    fast_path_idle="the claim requires c.saga_id = '': no step of a saga",
)


def freeze_on_mismatch(effect: Effect, *, actor: str, reason: str) -> None:
    saga_id = effect.command.saga_id
    if saga_id:
        saga_freeze(saga_id=saga_id, actor=actor, reason=reason, mismatch_effect_id=effect.pk)
