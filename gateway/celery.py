"""The Celery application: ``celery -A gateway worker`` and ``celery -A gateway beat``."""

import logging
import os

from celery import Celery
from celery.signals import (
    celeryd_after_setup,
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")

app = Celery("gateway")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

logger = logging.getLogger(__name__)


@celeryd_after_setup.connect
def _consume_recovery(sender, instance, **kwargs) -> None:
    """Every worker also consumes the recovery queue, whatever its -Q: lease recovery and
    reconciliation must never wait behind a dispatch backlog, nor for a dedicated worker."""
    from django.conf import settings

    instance.app.amqp.queues.select_add(settings.GATEWAY_RECOVERY_QUEUE)


def _drains_here() -> bool:
    """Whether this worker takes the default queue's dispatch work (its -Q names it, or it
    consumes every queue)."""
    consumed = app.amqp.queues.consume_from
    return not consumed or app.conf.task_default_queue in consumed


def prefork_pool(consumer) -> bool:
    """Whether the worker's pool forks children (which then start their own threads:
    drainers here, reconciliation.waker's wakers)."""
    pool = getattr(consumer, "pool", None)
    return type(pool).__module__.startswith(
        ("celery.concurrency.prefork", "celery.concurrency.asynpool")
    )


@worker_init.connect
def _refuse_bad_contracts(**kwargs) -> None:
    """A worker does not start while a contract module has errors (``manage.py check``
    names them), as ``runserver`` and ``migrate`` do not: the module's effects would
    otherwise wait under a worker that cannot send them. SystemExit, because Celery logs
    and ignores any other exception a signal handler raises."""
    from django.core import checks

    from gateway.checks import CONTRACTS_TAG

    errors = [m for m in checks.run_checks(tags=[CONTRACTS_TAG]) if m.is_serious()]
    if errors:
        raise SystemExit(
            "The contract modules have errors (manage.py check):\n"
            + "\n".join(f"{m.id}: {m.msg}" for m in errors)
        )


@worker_init.connect
def _freeze_at_start(**kwargs) -> None:
    """What the worker loaded (Django, the apps, the tasks) lives as long as it does: out of
    the collector's full passes (gateway.lib.gcfreeze), before a prefork pool forks, so that
    its children inherit it frozen."""
    from gateway.lib.gcfreeze import freeze_startup_objects

    if not app.conf.task_always_eager:
        freeze_startup_objects()


@worker_ready.connect
def _drain_on_start(sender, **kwargs) -> None:
    """A worker that starts runs its drainer threads (``dispatcher.Drainers``: in this process
    for the thread and solo pools; each prefork child starts its own) and asks for a drain
    of its queue: clear the due flag, then announce as a submission does (set the flag, push
    a wake-up). The drain that many submissions counted on may have died with a killed
    worker, and the flag it held would keep new submissions quiet until it expired; without
    this, what it had not claimed waited for the dispatch sweeper
    (``GATEWAY_REDELIVER_AFTER``). A restarted worker now claims it at once. A broker that
    is down is logged: the sweeper still sends."""
    import gc

    from gateway import dispatcher

    if app.conf.task_always_eager:
        return
    gc.freeze()  # what the consumer and the pool made since ``_freeze_at_start``
    if not _drains_here():
        return
    if not prefork_pool(sender):
        dispatcher.start_drainers(app.conf.task_default_queue)
    try:
        flag = dispatcher.DueFlag(app.conf.task_default_queue)
        flag.clear()
        flag.announce("worker started")
    except Exception:
        logger.warning("could not ask for a drain at start; the sweeper sends", exc_info=True)


@worker_process_init.connect
def _drainers_in_child(**kwargs) -> None:
    """A prefork child runs drainers of its own (connections born in it, never a parent's)."""
    import gc

    from gateway import dispatcher

    if app.conf.task_always_eager:
        return
    # The parent froze before forking (``_freeze_at_start``): the child inherits that. What
    # it made since joins it; no collection here, whose walk of every inherited object would
    # copy each page it touched and delay the child's start (the pool gives it 4 s).
    gc.freeze()
    if _drains_here():
        dispatcher.start_drainers(app.conf.task_default_queue)


@worker_shutdown.connect
@worker_process_shutdown.connect
def _stop_drainers(**kwargs) -> None:
    """A warm shutdown lets each drain record the calls it has out and hand its flag over
    (a deploy must not strand claims for the reconciler); a killed worker cannot."""
    from gateway import dispatcher

    dispatcher.stop_drainers()


@task_prerun.connect
@task_postrun.connect
def _retire_broken_connections(task=None, **kwargs) -> None:
    """What Django does around every web request, done around every task: close this thread's
    database connection when it broke (an error was seen and it no longer answers) or is
    older than CONN_MAX_AGE, so the next query reconnects. Without it a worker that reuses
    its connection (CELERY_DB_REUSE_MAX) keeps a connection that died with a PostgreSQL
    restart and fails every task with "the connection is closed" until the reuse count runs
    out (1000 tasks): the slow tier's fault run saw a worker stall for 85 s that way. Not in
    eager mode: there the caller (a test's transaction) owns the connection."""
    if task is not None and getattr(task.request, "is_eager", False):
        return
    from django.db import close_old_connections

    close_old_connections()
