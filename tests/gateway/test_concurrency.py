"""Races on PostgreSQL with real threads: one key, one effect, one provider operation."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from gateway import services
from gateway.models import Attempt, Command, Effect

pytestmark = pytest.mark.django_db(transaction=True)


def run_in_threads(count: int, target) -> list:
    barrier = threading.Barrier(count)

    def worker(index: int):
        try:
            barrier.wait()
            return target(index)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(worker, range(count)))


def test_twenty_threads_submitting_one_key_make_one_effect_and_one_operation(
    sandbox, agent, refund_body, eager_tasks
):
    results = run_in_threads(20, lambda _: agent.submit(refund_body, "refund:ord_881:v1"))
    codes = sorted(response.status_code for response in results)
    assert codes == [200] * 19 + [201]
    effect_ids = {response.json()["effect_id"] for response in results}
    assert len(effect_ids) == 1
    assert Command.objects.count() == 1 and Effect.objects.count() == 1
    # The one submission that created the effect dispatched it after commit (eager worker).
    effect = Effect.objects.select_related("command").get()
    assert effect.status == "CONFIRMED"
    ops = sandbox.operations(idempotency_key=effect.command.provider_key)
    assert len(ops) == 1
    assert len(sandbox.operations()) == 1


def test_twenty_threads_with_other_payloads_get_422_and_change_nothing(agent, refund_body):
    first = agent.submit(refund_body, "k")
    assert first.status_code == 201

    def other_amount(index: int):
        body = {**refund_body, "payload": {**refund_body["payload"], "amount": 1000 + index}}
        return agent.submit(body, "k").status_code

    assert run_in_threads(20, other_amount) == [422] * 20
    assert Command.objects.count() == 1


def test_concurrent_deliveries_of_one_task_send_once(sandbox, agent, ticket_body, settings):
    # Make the provider slow so that all deliveries overlap the first one's call.
    sandbox.add_fault("slow", times=None, seconds=0.5)
    settings.GATEWAY_PROVIDER_TIMEOUT = 5
    effect_id = agent.submit(ticket_body, "t1").json()["effect_id"]
    sent = run_in_threads(
        8, lambda i: services.effect_dispatch(effect_id=effect_id, worker=f"w{i}")
    )
    assert sent.count(True) == 1
    effect = Effect.objects.select_related("command").get(pk=effect_id)
    assert effect.status == "CONFIRMED"
    assert len(sandbox.operations(idempotency_key=effect.command.provider_key)) == 1
    assert Attempt.objects.filter(effect_id=effect_id).count() == 1
