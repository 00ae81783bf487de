"""Races on PostgreSQL with real threads: concurrent orchestrators issue each step once,
concurrent starts with one key make one run."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from gateway import services as ledger
from gateway.models import Command
from sagas import services
from sagas.models import SagaEvent, SagaRun, SagaStep
from tests.sagas.conftest import ORDER_STEPS, op_types, order_inputs, step_effect

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


def test_concurrent_advancers_issue_each_step_once(agent, sandbox, saga_queue):
    response = agent.client.post(
        "/api/v1/sagas",
        {"definition": "order.fulfillment", "inputs": order_inputs()},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k1",
    )
    assert response.status_code == 201, response.json()
    saga_id = response.json()["saga_id"]
    for name in ORDER_STEPS:
        effect = step_effect(saga_id, name)
        assert ledger.effect_dispatch(effect_id=effect.pk, worker="test") is True
        # Eight orchestrators at once: the message of the status change, its redeliveries,
        # the sweeper's copy, on as many workers.
        results = run_in_threads(8, lambda _: services.saga_advance(saga_id=saga_id))
        assert results.count(True) == 1, (name, results)
    assert SagaRun.objects.get(pk=saga_id).state == "COMPLETED"
    for name in ORDER_STEPS:
        assert SagaStep.objects.filter(run_id=saga_id, name=name).count() == 1
    assert Command.objects.filter(saga_id=saga_id).count() == 4
    assert op_types(sandbox) == [
        "inventory.reservation.create",
        "billing.charge.create",
        "shipment.create",
        "email.message.send",
    ]
    assert SagaEvent.objects.filter(run_id=saga_id, kind="step_issued").count() == 4


def test_concurrent_starts_with_one_key_make_one_run(agent, sandbox, saga_queue):
    body = {"definition": "order.fulfillment", "inputs": order_inputs()}
    responses = run_in_threads(
        10,
        lambda _: agent.client.post(
            "/api/v1/sagas", body, format="json", HTTP_IDEMPOTENCY_KEY="fulfil:ord_881"
        ),
    )
    assert sorted(r.status_code for r in responses) == [200] * 9 + [201]
    assert len({r.json()["saga_id"] for r in responses}) == 1
    assert SagaRun.objects.count() == 1
    assert SagaStep.objects.count() == 1
    assert Command.objects.count() == 1


def test_an_operator_cancel_racing_the_orchestrator_leaves_one_outcome(
    agent, operator, sandbox, saga_queue
):
    response = agent.client.post(
        "/api/v1/sagas",
        {"definition": "order.fulfillment", "inputs": order_inputs()},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k1",
    )
    saga_id = response.json()["saga_id"]
    ledger.effect_dispatch(effect_id=step_effect(saga_id, "reserve_inventory").pk, worker="t")

    def act(index: int):
        if index == 0:
            return operator.client.post(f"/api/v1/sagas/{saga_id}/cancel").status_code
        return services.saga_advance(saga_id=saga_id)

    results = run_in_threads(6, act)
    assert results[0] == 200
    run = SagaRun.objects.get(pk=saga_id)
    assert run.state == "CANCELLED"
    charges = SagaStep.objects.filter(run_id=saga_id, name="charge_payment")
    # Either the cancel came first (no charge) or an advance did (the charge, cancelled
    # before it was sent): never a charge that can still go out.
    assert charges.count() <= 1
    for record in charges:
        assert record.effect.status == "CANCELLED"
    assert op_types(sandbox) == ["inventory.reservation.create"]
