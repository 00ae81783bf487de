"""Thin Celery tasks (STYLE 10): load by id, call one service. A redelivered message is a
no-op because the delivery claims each attempt with a compare-and-set."""

from celery import shared_task

from gateway.webhooks import services


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def deliver_webhook(message_id: str) -> bool:
    return services.webhook_deliver(message_id=message_id)


@shared_task(acks_late=True, ignore_result=True)
def sweep_webhooks() -> int:
    return services.webhook_sweep()
