"""The Celery application: ``celery -A gateway worker`` and ``celery -A gateway beat``."""

import logging
import os

from celery import Celery
from celery.signals import celeryd_after_setup, task_postrun, task_prerun, worker_ready

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


@worker_ready.connect
def _drain_on_start(sender, **kwargs) -> None:
    """A worker that starts asks for a drain of its queue: clear the due flag, then announce
    as a submission does (set the flag, publish ``dispatch_due``). The one ``dispatch_due``
    of many submissions may have died with a killed worker (a thread or solo pool: the
    message stays unacknowledged until the broker's visibility timeout, 1 h), and the flag
    its drainer held would keep new submissions quiet until it expired; without this, what
    it had not claimed waited for the dispatch sweeper (``GATEWAY_REDELIVER_AFTER``). A
    restarted worker now claims it at once. A broker that is down is logged: the sweeper
    still sends."""
    from gateway import dispatcher
    from gateway.tasks import dispatch_due

    if app.conf.task_always_eager:
        return
    try:
        dispatcher.DueFlag(app.conf.task_default_queue).clear()
        dispatcher.announce_due(dispatch_due)
    except Exception:
        logger.warning("could not ask for a drain at start; the sweeper sends", exc_info=True)


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
