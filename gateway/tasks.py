"""Thin Celery tasks: load by id, call one service (STYLE 10). A redelivered message is a
no-op because every service starts with a compare-and-set."""

from celery import shared_task

from gateway import audit, dispatcher, services


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def dispatch_effect(effect_id: str) -> bool:
    return services.effect_dispatch(effect_id=effect_id)


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def dispatch_due(self) -> int:
    """Drain the due effects (gateway.dispatcher) now: what ``dispatcher.announce_due`` runs
    in eager mode, and a drain an operator can ask for (``celery call``). Workers answer the
    submissions' wake-ups with their drainer threads, without this task. A redelivery drains
    again: harmless."""
    flag = None if self.request.is_eager else dispatcher.DueFlag(self.app.conf.task_default_queue)
    return dispatcher.drain(flag=flag)


@shared_task(acks_late=True, ignore_result=True)
def sweep_dispatch() -> int:
    return services.dispatch_sweep()


@shared_task(acks_late=True, ignore_result=True)
def write_audit_checkpoints() -> int:
    from gateway.checkpoints import checkpoints_write_all

    return checkpoints_write_all()


@shared_task(ignore_result=True)
def seal_audit(shard: int = 0, shards: int = 1) -> int:
    return audit.seal_pending(shard=shard, shards=shards)


@shared_task(ignore_result=True)
def rollup_ledger() -> int:
    """Beat, every GATEWAY_ROLLUP_INTERVAL: count the last minutes of the ledger into the
    dashboard's roll-up (gateway.rollup). A redelivery or an overlap recounts: harmless."""
    from gateway.rollup import rollup_recent

    return rollup_recent()
