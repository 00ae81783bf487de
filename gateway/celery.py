"""The Celery application: ``celery -A gateway worker`` and ``celery -A gateway beat``."""

import os

from celery import Celery
from celery.signals import celeryd_after_setup, task_postrun, task_prerun

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")

app = Celery("gateway")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@celeryd_after_setup.connect
def _consume_recovery(sender, instance, **kwargs) -> None:
    """Every worker also consumes the recovery queue, whatever its -Q: lease recovery and
    reconciliation must never wait behind a dispatch backlog, nor for a dedicated worker."""
    from django.conf import settings

    instance.app.amqp.queues.select_add(settings.GATEWAY_RECOVERY_QUEUE)


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
