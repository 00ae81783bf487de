"""Fixtures of the saga tests: the real sandbox provider over HTTP, the real tasks run
in-process, and helpers that read the sandbox's operation log (the exactly-once oracle).

``settle(fn, ...)`` calls ``fn`` (an API request, a service) and then runs everything it
scheduled after commit — dispatches, saga advances, and what those schedule in turn — until
nothing is left: the whole saga, driven by the production code paths, in one test transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gateway.celery import app as celery_app
from gateway.models import Effect
from gateway.providers.sandbox import SandboxProvider
from sagas.definitions import ORDER_FULFILLMENT, RELEASE_PRODUCTION
from sagas.models import SagaStep
from tests.support.processes import new_queue

ORDER_STEPS = [step.name for step in ORDER_FULFILLMENT.steps]
RELEASE_STEPS = [step.name for step in RELEASE_PRODUCTION.steps]


def order_inputs(**changes: Any) -> dict[str, Any]:
    return {**ORDER_FULFILLMENT.example, **changes}


def release_inputs(**changes: Any) -> dict[str, Any]:
    return {**RELEASE_PRODUCTION.example, **changes}


@pytest.fixture
def propagating_tasks(eager_tasks) -> Iterator[None]:
    """Eager tasks whose exceptions reach the test instead of an unread EagerResult."""
    previous = celery_app.conf.task_eager_propagates
    celery_app.conf.task_eager_propagates = True
    yield
    celery_app.conf.task_eager_propagates = previous


@pytest.fixture
def settle(django_capture_on_commit_callbacks, propagating_tasks, sandbox) -> Callable:
    def run(fn: Callable, *args: Any, **kwargs: Any) -> Any:
        with django_capture_on_commit_callbacks(execute=True):
            return fn(*args, **kwargs)

    return run


@pytest.fixture
def start(settle, agent) -> Callable:
    """Start a saga through the API and let it run as far as it goes; the run's JSON."""

    def go(definition: str, inputs: dict[str, Any], key: str = "saga-1", persona=None) -> dict:
        persona = persona or agent
        response = settle(
            persona.client.post,
            "/api/v1/sagas",
            {"definition": definition, "inputs": inputs},
            format="json",
            HTTP_IDEMPOTENCY_KEY=key,
        )
        assert response.status_code == 201, response.json()
        return saga(persona, response.json()["saga_id"])

    return go


@pytest.fixture
def saga_queue() -> Iterator[str]:
    """Tasks sent to the broker go to a queue of the test's own (nobody else reads it);
    what is left in it is purged afterwards."""
    name = new_queue()
    previous = celery_app.conf.task_default_queue
    celery_app.conf.task_default_queue = name
    yield name
    celery_app.conf.task_default_queue = previous
    with celery_app.connection_for_write() as connection:
        connection.default_channel.queue_purge(name)


def saga(persona, saga_id: str) -> dict:
    response = persona.client.get(f"/api/v1/sagas/{saga_id}")
    assert response.status_code == 200, response.json()
    return response.json()


def steps(body: dict) -> dict[str, dict]:
    return {step["name"]: step for step in body["steps"]}


def step_effect(saga_id: str, name: str, revision: int | None = None) -> Effect:
    records = SagaStep.objects.filter(run_id=saga_id, name=name).order_by("-revision")
    if revision is not None:
        records = records.filter(revision=revision)
    record = records.select_related("effect__command").first()
    assert record is not None and record.effect is not None, f"{name} was not issued"
    return record.effect


def op_types(sandbox: SandboxProvider) -> list[str]:
    """The types of the operations the sandbox committed, in commit order."""
    return [op["type"] for op in sandbox.operations()]


def sends(sandbox: SandboxProvider, key: str) -> list[dict]:
    """Every POST the sandbox received with this provider key (commits, replays, refusals)."""
    return [
        entry
        for entry in sandbox.log()
        if entry["idempotency_key"] == key
        and entry["action"] in {"commit", "replay", "key_reused", "conflict", "reject", "fault"}
    ]
