"""Console fixtures: people of two tenants with console logins, and effects in the states the
console shows. Commands go through ``command_submit`` (the real service); states that take a
provider to reach are set with direct updates of the ledger row."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from gateway import services
from gateway.lib.digest import sha256_digest
from gateway.models import Attempt, Effect, EffectEvent, Principal, Receipt, Tenant

PASSWORD = "correct-horse-battery"
_keys = itertools.count(1)

REFUND = {
    "type": "billing.refund.create",
    "resource": {"type": "order", "id": "ord_881", "version": 17},
    "payload": {"amount": 500, "currency": "EUR", "reason": "duplicate charge"},
    "intent": {
        "summary": "refund the duplicate charge of incident 120",
        "task_id": "task_incident_120",
        "plan_revision": 1,
    },
}
BIG_REFUND = {**REFUND, "payload": {**REFUND["payload"], "amount": 25_000}}
TICKET = {
    "type": "ticket.create",
    "resource": {"type": "queue", "id": "support"},
    "payload": {"title": "Printer on fire", "priority": "P2"},
    "intent": {"summary": "open a ticket"},
}
EMAIL = {
    "type": "email.message.send",
    "resource": {"type": "customer", "id": "cus_42"},
    "payload": {"to": "ada@example.com", "subject": "Your order", "body": "It shipped."},
    "intent": {"summary": "tell Ada her order shipped"},
}
SHIPMENT = {
    "type": "shipment.create",
    "resource": {"type": "order", "id": "ord_881"},
    "payload": {
        "address": {
            "name": "Ada Lovelace",
            "line1": "12 St James's Square",
            "city": "London",
            "postal_code": "SW1Y 4JH",
            "country": "GB",
        },
        "items": [{"sku": "SKU-RED-MUG", "quantity": 2}],
    },
}


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    """Logins are made per test: a deliberately slow hasher would dominate the suite."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def no_broker(monkeypatch):
    """Submissions and approvals enqueue a dispatch after commit: no broker in these tests."""
    monkeypatch.setattr("gateway.ledger.enqueue_dispatch", lambda effect_id: None)


@dataclass
class Person:
    """A principal with a console login and a logged-in test client."""

    principal: Principal
    client: Client

    def htmx(self, method: str, path: str, data: dict | None = None, **extra: Any):
        call = getattr(self.client, method)
        return call(path, data or {}, HTTP_HX_REQUEST="true", **extra)


def person(tenant: str, name: str, role: str) -> Person:
    """What ``issue_token --password`` makes (test_login.py runs the command itself)."""
    tenant_obj, _ = Tenant.objects.get_or_create(slug=tenant, defaults={"name": tenant})
    user = get_user_model().objects.create_user(f"{name}@{tenant}", password=PASSWORD)
    Principal.objects.create(tenant=tenant_obj, name=name, role=role, user=user)
    principal = Principal.objects.select_related("tenant", "user").get(
        tenant__slug=tenant, name=name
    )
    client = Client()
    client.force_login(principal.user)
    return Person(principal, client)


@pytest.fixture
def oscar(db) -> Person:
    """An operator of acme."""
    return person("acme", "oscar", "operator")


@pytest.fixture
def alice(db) -> Person:
    """An approver of acme."""
    return person("acme", "alice", "approver")


@pytest.fixture
def root(db) -> Person:
    """An admin of acme (may submit, approve and operate)."""
    return person("acme", "root", "admin")


@pytest.fixture
def bot(db) -> Person:
    """An agent of acme that submits the commands (and, here, can log in), with a grant for
    every type where the gateway has capabilities."""
    agent = person("acme", "refund-bot", "agent")
    try:
        from gateway.capabilities import capability_grant
    except ImportError:
        return agent
    capability_grant(granted_by="test", principal=agent.principal, effect_types=["*"])
    return agent


@pytest.fixture
def olga(db) -> Person:
    """An operator of another tenant, globex."""
    return person("globex", "olga", "operator")


def submit(principal: Principal, body: dict = REFUND, **changes: Any) -> Effect:
    data = {**body, **changes}
    submission = services.command_submit(
        principal=principal,
        idempotency_key=f"console-test-{next(_keys)}",
        type=data["type"],
        resource=data["resource"],
        payload=data["payload"],
        intent=data.get("intent"),
        context=data.get("context"),
    )
    return Effect.objects.select_related("command").get(pk=submission.effect.pk)


def open_case(effect: Effect, reason: str = "escalated", text: str = "8 lookups", **evidence):
    """A human-queue case for ``effect``, opened as the reconciler opens one."""
    from reconciliation.services import case_open

    return case_open(
        effect=effect,
        reason=reason,
        text=text,
        actor="reconciler",
        evidence=evidence or {"status": effect.status, "check_count": 8},
    )


def start_saga(principal: Principal, definition: str = "order.fulfillment", **inputs: Any):
    """A saga run started through the sagas service (its first step issued), re-read."""
    from sagas.definitions import get_definition
    from sagas.models import SagaRun
    from sagas.services import saga_start

    example = get_definition(definition).example
    start = saga_start(
        principal=principal,
        idempotency_key=f"console-saga-{next(_keys)}",
        definition=definition,
        inputs={**example, **inputs},
    )
    return SagaRun.objects.select_related("requested_by").get(pk=start.run.pk)


def saga_step_effect(run, step: str) -> Effect:
    from sagas.models import SagaStep

    record = SagaStep.objects.filter(run_id=run.pk, name=step).order_by("-revision").first()
    assert record is not None and record.effect_id, f"{step} was not issued"
    return Effect.objects.select_related("command").get(pk=record.effect_id)


def set_state(effect: Effect, **fields: Any) -> Effect:
    """Put an effect where a provider would have put it (a direct update of the ledger row)."""
    fields.setdefault("updated_at", timezone.now())
    Effect.objects.filter(pk=effect.pk).update(**fields)
    return Effect.objects.select_related("command").get(pk=effect.pk)


def add_attempt(effect: Effect, **fields: Any) -> Attempt:
    now = timezone.now()
    values = {
        "number": 1,
        "fence": 1,
        "worker": "worker-1:42",
        "state": "finished",
        "outcome": "unknown",
        "http_status": 504,
        "error": "read timeout after 10 s",
        "started_at": now - timedelta(seconds=12),
        "finished_at": now - timedelta(seconds=2),
        **fields,
    }
    return Attempt.objects.create(effect=effect, **values)


def add_receipt(effect: Effect, **fields: Any) -> Receipt:
    result = fields.pop("result", {"refund_id": "re_1", "amount": 500, "currency": "EUR"})
    values = {
        "source": "reconciler",
        "provider": effect.command.provider,
        "provider_operation_id": "op_01TEST",
        "provider_status": "succeeded",
        "payload_digest": effect.command.payload_digest,
        "digest_matches": True,
        "result": result,
        "result_digest": sha256_digest(result),
        "received_at": timezone.now(),
        **fields,
    }
    return Receipt.objects.create(effect=effect, **values)


def add_orphan(tenant: Tenant | None, operation: str, **fields: Any):
    """A provider receipt that names no command of ours, kept as the webhook keeps it."""
    from reconciliation.models import OrphanReceipt, WebhookDelivery

    now = timezone.now()
    delivery = WebhookDelivery.objects.create(
        provider="billing",
        event_id=f"evt_{operation}",
        provider_operation_id=operation,
        outcome="orphan",
        signed_at=now,
        received_at=now,
    )
    values = {
        "provider": "billing",
        "idempotency_key": f"{tenant.slug if tenant else 'nobody'}:refund-99",
        "provider_operation_id": operation,
        "provider_status": "succeeded",
        "payload_digest": "sha256:" + "a" * 64,
        "result": {"refund_id": "re_orphan", "amount": 900, "currency": "EUR"},
        "received_at": now,
        **fields,
    }
    return OrphanReceipt.objects.create(delivery=delivery, tenant=tenant, **values)


def add_failed_lookups(effect: Effect, count: int = 8, *, first_minutes_ago: int = 30):
    """``count`` lookups that got no answer from the provider, a minute apart, the way the
    reconciler records them (reconciliation.services._apply)."""
    from reconciliation.models import ReconciliationRecord

    start = timezone.now() - timedelta(minutes=first_minutes_ago)
    return [
        ReconciliationRecord.objects.create(
            tenant_id=effect.tenant_id,
            effect=effect,
            kind="lookup",
            lookup_by="idempotency_key",
            lookup_status="unreachable",
            effect_status=effect.status,
            outcome="inconclusive" if number < count else "escalated",
            check_number=number,
            actor="reconciler",
            evidence=f"lookup by idempotency_key failed (connection refused); check {number}",
            created_at=start + timedelta(minutes=number),
        )
        for number in range(1, count + 1)
    ]


def add_notes(effect: Effect, count: int, *, created_at=None) -> None:
    """``count`` note events by oscar on ``effect`` (created now unless ``created_at``)."""
    EffectEvent.objects.bulk_create(
        EffectEvent(
            tenant_id=effect.tenant_id,
            effect=effect,
            kind="note",
            actor="operator:oscar",
            reason=f"note {n}",
            created_at=created_at or timezone.now(),
        )
        for n in range(count)
    )


def captured_at_provider(sandbox, effect: Effect) -> dict:
    """The operation the provider made for ``effect`` (the gateway's request got lost on the
    way back): created at the sandbox under the key the gateway sends."""
    import json

    command = effect.command
    body = {
        "type": command.type,
        "resource": command.resource,
        "payload": services.command_payload(command),
        "payload_digest": command.payload_digest,
    }
    reply = sandbox.handle_create(
        provider=command.provider,
        idempotency_key=command.provider_key,
        body=json.dumps(body).encode(),
    )
    assert reply.status in (200, 201, 202), reply.body
    return reply.body


def escalated_unknown(principal: Principal, body: dict = REFUND, **changes: Any) -> Effect:
    """An UNKNOWN effect whose lookups were used up while the provider did not answer: what a
    provider outage leaves (escalated, a lookup_budget_exhausted case, 8 failed lookups)."""
    effect = set_state(
        submit(principal, body, **changes),
        status="UNKNOWN",
        escalated=True,
        attempt_count=1,
        check_count=8,
        next_check_at=None,
    )
    add_failed_lookups(effect, 8)
    open_case(effect, reason="lookup_budget_exhausted", text="8 inconclusive lookups")
    return effect


@pytest.fixture
def job_queue():
    """A broker queue of this test's own, which the live server sends its tasks to (and a
    real worker of the test consumes: the bulk jobs)."""
    from gateway.celery import app as celery_app
    from tests.support.processes import new_queue

    name = new_queue()
    previous = celery_app.conf.task_default_queue
    celery_app.conf.task_default_queue = name
    yield name
    celery_app.conf.task_default_queue = previous
