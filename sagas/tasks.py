"""Thin Celery tasks (STYLE 10): load by id, call one service. A redelivered or duplicated
message is a no-op: the orchestrator locks the run and decides from what is committed."""

from celery import shared_task

from sagas import services


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def advance_saga(saga_id: str) -> bool:
    """Sent on commit after every status change of one of the run's effects."""
    return services.saga_advance(saga_id=saga_id)


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def sweep_sagas() -> int:
    """Beat: re-advance the runs that went quiet (a lost message, a crashed worker)."""
    return services.saga_sweep()
