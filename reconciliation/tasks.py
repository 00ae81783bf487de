"""Thin Celery tasks (STYLE 10): call one service. A redelivered or overlapping sweep is
harmless: claims skip locked rows and every write is a compare-and-set."""

from celery import shared_task

from reconciliation import services
from reconciliation.tally import tally_pending


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def reconcile_due() -> int:
    """Beat, every GATEWAY_RECONCILE_INTERVAL: recover leases, then look up what is due. The
    safety net: the wakers (reconciliation.waker) do both at the due times."""
    return services.reconcile_due()


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def reconcile_effect(effect_id: str) -> bool:
    """Look one effect up now (e.g. after an operator's request from the console)."""
    return services.effect_reconcile(effect_id=effect_id) is not None


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def recover_leases() -> int:
    """Beat, every GATEWAY_SWEEP_INTERVAL, on the recovery queue: expired claims become
    UNKNOWN and attempts their workers left "sending" are closed."""
    from gateway.recovery import attempts_close_abandoned

    return services.effects_recover_expired_leases() + attempts_close_abandoned()


@shared_task(ignore_result=True)
def tally_effects() -> int:
    """Beat, every GATEWAY_TALLY_INTERVAL: count the newly sealed status changes into the
    settled counts of the /metrics gauge (reconciliation.tally)."""
    return tally_pending()


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def run_bulk_job(job_id: int) -> int:
    """Work one bulk job of the console (look up a whole group); a redelivery resumes it."""
    from reconciliation.jobs import bulk_job_run

    return bulk_job_run(job_id=job_id)


@shared_task(ignore_result=True)
def resume_bulk_jobs() -> int:
    """Beat, every GATEWAY_SWEEP_INTERVAL: send again the bulk jobs no worker is on."""
    from reconciliation.jobs import bulk_jobs_resume

    return bulk_jobs_resume()
