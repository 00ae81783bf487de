"""The Celery application: ``celery -A gateway worker`` and ``celery -A gateway beat``."""

import os

from celery import Celery
from celery.signals import celeryd_after_setup

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
