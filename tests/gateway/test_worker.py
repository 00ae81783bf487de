"""A real ``celery worker`` process, on the real broker (Redis in CI), against the sandbox."""

from __future__ import annotations

import pytest
from django.db import connection

from gateway.models import Attempt, Effect, EffectEvent
from gateway.tasks import dispatch_effect
from tests.support.processes import Celery, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def statuses(ids: list[str]) -> dict[str, str]:
    connection.close()  # read what the worker committed, not a cached view
    return dict(Effect.objects.filter(pk__in=ids).values_list("pk", "status"))


def test_worker_dispatches_each_effect_once_despite_duplicate_messages(
    sandbox, agent, ticket_body, queue, tmp_path
):
    ids = []
    for index in range(6):
        body = {**ticket_body, "payload": {**ticket_body["payload"], "title": f"t{index}"}}
        response = agent.submit(body, f"ticket-{index}")
        assert response.status_code == 201
        ids.append(response.json()["effect_id"])
    # Every message delivered three times: the submission's, and two duplicates.
    for effect_id in ids:
        dispatch_effect.delay(effect_id)
        dispatch_effect.delay(effect_id)
    worker = Celery("worker", queue, tmp_path / "worker.log")
    try:
        wait_until(
            lambda: set(statuses(ids).values()) == {"CONFIRMED"},
            timeout=60,
            what="all effects CONFIRMED",
        )
        # A sentinel sent after the duplicates: once it is done, they were consumed too.
        sentinel = agent.submit(
            {**ticket_body, "payload": {**ticket_body["payload"], "title": "last"}}, "sentinel"
        )
        sentinel_id = sentinel.json()["effect_id"]
        wait_until(
            lambda: statuses([sentinel_id]) == {sentinel_id: "CONFIRMED"},
            timeout=30,
            what="the sentinel",
        )
    finally:
        worker.stop()
    for effect_id in ids:
        effect = Effect.objects.select_related("command").get(pk=effect_id)
        ops = sandbox.operations(idempotency_key=effect.command.provider_key)
        assert len(ops) == 1, f"{effect_id}: {len(ops)} provider operations"
        assert Attempt.objects.filter(effect_id=effect_id).count() == 1
        assert EffectEvent.objects.filter(effect_id=effect_id, kind="claimed").count() == 1
    assert len(sandbox.operations()) == len(ids) + 1
    assert "Traceback" not in worker.output()
