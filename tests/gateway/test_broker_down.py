"""A broker that is down at submission: the command is committed, so the answer says so (201,
then 200 on replay), and the sweeper sends it once the broker is back. /readyz tells."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from kombu.exceptions import OperationalError

from gateway import hooks, services
from gateway.models import Effect
from tests.conftest import TICKET


@pytest.fixture
def broker_down(monkeypatch):
    def refuse(*args, **kwargs):
        raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    # The ledger hands effects to the broker through these senders (bound to the tasks at
    # start): one by one, and the coalesced "due" signal of submissions.
    monkeypatch.setattr(hooks.dispatch_sender, "send", refuse)
    monkeypatch.setattr(hooks.due_sender, "send", refuse)
    return monkeypatch


@pytest.mark.django_db(transaction=True)
def test_a_committed_command_is_answered_201_when_publishing_fails(
    agent, sandbox, broker_down, eager_tasks
):
    created = agent.submit(TICKET, "t1")
    assert created.status_code == 201, created.content
    effect = Effect.objects.get(pk=created.json()["effect_id"])
    assert effect.status == "PREPARED" and effect.next_dispatch_at is not None
    replay = agent.submit(TICKET, "t1")
    assert replay.status_code == 200
    assert replay.json()["effect_id"] == effect.pk
    assert sandbox.operations() == []

    broker_down.undo()  # the broker is back; the sweeper finds the effect when it is due
    Effect.objects.filter(pk=effect.pk).update(next_dispatch_at=timezone.now() - timedelta(1))
    assert services.dispatch_sweep() == 1
    effect.refresh_from_db()
    assert effect.status == "CONFIRMED"
    assert len(sandbox.operations(idempotency_key=effect.command.provider_key)) == 1


def test_readyz_stays_ready_and_reports_a_broker_that_is_down(db, client, settings):
    from gateway.lib import broker

    settings.CELERY_BROKER_URL = "unix:///nonexistent/valkey.sock"
    broker.client.cache_clear()
    try:
        ready = client.get("/readyz")
    finally:
        broker.client.cache_clear()
    # Still ready: submissions need the database alone (a broker outage is reported).
    assert ready.status_code == 200
    assert ready.json()["status"] == "degraded"
    assert ready.json()["checks"]["broker"] == "error: ConnectionError"
    assert ready.json()["checks"]["database"] == "ok"


def test_readyz_is_not_ready_without_the_database(client, monkeypatch):
    from django.db import connection

    def refuse(*args, **kwargs):
        raise OSError("connection refused")

    monkeypatch.setattr(connection, "cursor", refuse)
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["status"] == "not ready"
