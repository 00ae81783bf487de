"""A real ``celery worker`` process runs whole sagas: dispatches, advances (found by
autodiscovery in sagas/tasks.py) and compensations, on the real broker, against the sandbox,
with duplicate advance messages thrown in."""

from __future__ import annotations

import pytest
from django.db import connection

from sagas.models import SagaRun, SagaStep
from sagas.tasks import advance_saga
from tests.sagas.conftest import op_types, order_inputs, sends
from tests.support.processes import Celery, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def state(saga_id: str) -> str | None:
    connection.close()  # read what the worker committed, not a cached view
    return SagaRun.objects.filter(pk=saga_id).values_list("state", flat=True).first()


def start(agent, key: str, **changes) -> str:
    response = agent.client.post(
        "/api/v1/sagas",
        {"definition": "order.fulfillment", "inputs": order_inputs(**changes)},
        format="json",
        HTTP_IDEMPOTENCY_KEY=key,
    )
    assert response.status_code == 201, response.json()
    return response.json()["saga_id"]


def test_a_worker_runs_sagas_to_the_end_despite_duplicate_messages(
    sandbox, agent, saga_queue, tmp_path
):
    sandbox.add_fault("reject", type="email.message.send")
    happy = start(agent, "o1", order_id="ord_1")
    failing = start(agent, "o2", order_id="ord_2", email="grace@example.com")
    # The sandbox rejects the first email only: the happy run's or the failing run's, whichever
    # comes first. Two copies of every advance message, from the start.
    for saga_id in (happy, failing):
        advance_saga.delay(saga_id)
        advance_saga.delay(saga_id)
    worker = Celery("worker", saga_queue, tmp_path / "worker.log")
    try:
        wait_until(
            lambda: {state(happy), state(failing)} == {"COMPLETED", "COMPENSATED"},
            timeout=90,
            what="one run COMPLETED and one COMPENSATED",
        )
        # A sentinel run after the duplicates: once it completes, they were consumed too.
        sentinel = start(agent, "o3", order_id="ord_3")
        wait_until(lambda: state(sentinel) == "COMPLETED", timeout=60, what="the sentinel")
    finally:
        worker.stop()
    output = worker.output()
    assert "Traceback" not in output, output[-4000:]
    assert "sagas.tasks.advance_saga" in output

    ops = sandbox.operations()
    # Every operation committed once: no key twice, no second send of any key.
    keys = [op["idempotency_key"] for op in ops]
    assert len(keys) == len(set(keys))
    for key in keys:
        assert len(sends(sandbox, key)) == 1, key
    compensated = happy if state(happy) == "COMPENSATED" else failing
    assert SagaStep.objects.filter(run_id=compensated).count() == 4
    undo = [
        op["type"]
        for op in ops
        if op["resource"].get("id")
        == SagaRun.objects.get(pk=compensated).inputs_redacted["order_id"]
    ]
    assert undo == [
        "inventory.reservation.create",
        "billing.charge.create",
        "shipment.create",
        "shipment.cancel",
        "billing.refund.create",
        "inventory.reservation.release",
    ]
    assert op_types(sandbox).count("email.message.send") == 2  # the two completed runs
    for saga_id in (happy, failing, sentinel):
        assert SagaStep.objects.filter(run_id=saga_id).values("name").distinct().count() == 4
        assert SagaStep.objects.filter(run_id=saga_id, revision__gt=1).count() == 0
