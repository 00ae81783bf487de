"""A worker outlives a PostgreSQL restart: its connection, cut under it, is replaced at the
next task instead of failing every task until the reuse count runs out (found by the slow
tier's fault run, tests/slow/test_fault_run.py, where a worker stalled for 85 s)."""

from __future__ import annotations

import pytest
from django.db import connection

from gateway.models import Effect
from tests.support.crash import Supervisor
from tests.support.processes import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def submit(agent, key: str) -> str:
    body = {
        "type": "ticket.create",
        "resource": {"type": "queue", "id": "support"},
        "payload": {"title": key, "priority": "P3"},
    }
    response = agent.submit(body, key)
    assert response.status_code == 201, response.content
    return response.json()["effect_id"]


def status(effect_id: str) -> str:
    connection.close()
    return Effect.objects.get(pk=effect_id).status


def test_a_worker_reconnects_after_its_connection_is_cut(sandbox, agent, queue, tmp_path):
    # A worker and a beat on the recovery test clocks (sweeps every second): without the
    # repair every one of those tasks fails too, until the reuse count (1000) runs out.
    worker = Supervisor(queue=queue, logs=tmp_path, failpoints="", failpoint_dir=tmp_path)
    try:
        first = submit(agent, "before the cut")
        wait_until(lambda: status(first) == "CONFIRMED", timeout=60, what="the first effect")
        # What a PostgreSQL restart does to the worker: its backend goes away.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            assert cursor.fetchone()[0] >= 1
        # The first task after the cut meets the dead connection and fails (the sweeper
        # would send it again); the task after it must run on a new connection.
        submit(agent, "meets the dead connection")
        after = submit(agent, "after the cut")
        wait_until(
            lambda: status(after) == "CONFIRMED",
            timeout=60,
            what=f"an effect after the cut; worker log: {tmp_path / 'worker.log'}",
        )
    finally:
        worker.stop()
