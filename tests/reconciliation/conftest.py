"""Fixtures of the reconciliation tests: a real sandbox provider over HTTP, personas of two
tenants, and a recorder in place of the broker.

Names start with ``recon_`` so that they never shadow the suite-wide fixtures of
``tests/conftest.py``. Dispatch is driven by hand (``recon_dispatch``) so that each test says
exactly when the executor runs; the recorder shows what the services asked to enqueue.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.utils import timezone
from rest_framework.test import APIClient

from gateway import deadlines
from gateway import services as ledger
from gateway.api.auth import token_create
from gateway.capabilities import capability_grant
from gateway.choices import Role
from gateway.lib import broker
from gateway.models import Effect, Principal, Tenant
from gateway.providers.sandbox import SandboxProvider, SandboxServer

RECON_PROVIDERS = ("billing", "inventory", "shipping", "deploy", "tickets", "mail", "verify")
WEBHOOK_SECRETS = {"tickets": "whsec_tickets_test", "billing": "whsec_billing_test"}
# Sandbox log actions that are a POST of an operation (a send), as opposed to a lookup.
SEND_ACTIONS = frozenset({"commit", "replay", "key_reused", "conflict", "reject"})

TICKET = {
    "type": "ticket.create",
    "resource": {"type": "queue", "id": "support"},
    "payload": {"title": "Printer on fire", "priority": "P2"},
}


@pytest.fixture
def recon_signal() -> Iterator[redis.Redis]:
    """The deadline keys of this ledger in the broker's Redis, empty before and after the test
    (gateway.deadlines)."""
    client = redis.Redis.from_url(broker.url(), socket_timeout=5)
    client.delete(deadlines.key(), deadlines.wake_key())
    deadlines._failures.failed_at = -deadlines.REST
    yield client
    client.delete(deadlines.key(), deadlines.wake_key())
    client.close()


@pytest.fixture
def recon_server() -> Iterator[SandboxServer]:
    with SandboxServer(SandboxProvider(), port=0) as server:
        yield server


@pytest.fixture
def recon_sandbox(recon_server: SandboxServer, settings) -> SandboxProvider:
    """The sandbox provider, with every contract's provider pointed at it."""
    settings.GATEWAY_PROVIDER_URLS = {name: recon_server.base_url(name) for name in RECON_PROVIDERS}
    settings.GATEWAY_PROVIDER_TIMEOUT = 3
    settings.CELERY_TASK_ALWAYS_EAGER = False
    settings.GATEWAY_WEBHOOK_SECRETS = dict(WEBHOOK_SECRETS)
    return recon_server.provider


@pytest.fixture(autouse=True)
def recon_enqueued(monkeypatch) -> list[str]:
    """Effect ids the services asked to dispatch (instead of a broker message)."""
    sent: list[str] = []
    monkeypatch.setattr("gateway.ledger.enqueue_dispatch", sent.append)
    return sent


@dataclass
class ReconPersona:
    principal: Principal
    token: str

    @property
    def client(self) -> APIClient:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.token}")
        return client


def _persona(tenant_slug: str, name: str, role: str) -> ReconPersona:
    tenant, _ = Tenant.objects.get_or_create(slug=tenant_slug)
    principal = Principal.objects.create(tenant=tenant, name=name, role=role)
    return ReconPersona(principal, token_create(principal=principal))


@pytest.fixture
def recon_agent(db) -> ReconPersona:
    return _persona("initech", "ticket-bot", Role.AGENT)


@pytest.fixture
def recon_operator(db) -> ReconPersona:
    return _persona("initech", "peter", Role.OPERATOR)


@pytest.fixture
def recon_rival_operator(db) -> ReconPersona:
    """An operator of another tenant."""
    return _persona("umbrella", "alice", Role.OPERATOR)


@pytest.fixture
def recon_requester(db) -> ReconPersona:
    """Who submits the commands of these tests: an operator under an unlimited grant, so
    nothing waits for an approver (grants are the ledger's concern, tested there)."""
    persona = _persona("initech", "runbook", Role.OPERATOR)
    capability_grant(granted_by="test", principal=persona.principal, effect_types=["*"])
    return persona


@pytest.fixture
def recon_submit(recon_requester: ReconPersona, recon_sandbox):
    """Submit a ticket command; returns its effect (PREPARED, not yet sent)."""
    counter = iter(range(1, 10_000))

    def submit(key: str | None = None, **overrides: Any) -> Effect:
        body = {**TICKET, **overrides}
        submission = ledger.command_submit(
            principal=recon_requester.principal,
            idempotency_key=key or f"ticket:{next(counter)}",
            **body,
        )
        assert submission.created
        return submission.effect

    return submit


@pytest.fixture
def recon_dispatch():
    """Run the executor once for an effect, as a worker would; returns the fresh effect."""

    def dispatch(effect: Effect, worker: str = "test-worker") -> Effect:
        ledger.effect_dispatch(effect_id=effect.pk, worker=worker)
        return fresh(effect)

    return dispatch


@pytest.fixture
def recon_unknown(recon_submit, recon_dispatch, recon_sandbox):
    """An effect the provider committed but whose answer was lost: UNKNOWN, one operation."""

    def make(key: str | None = None, **faults: dict[str, Any]) -> Effect:
        recon_sandbox.add_fault("commit_then_drop", times=1)
        for name, params in faults.items():
            recon_sandbox.add_fault(name, times=1, **params)
        effect = recon_dispatch(recon_submit(key))
        assert effect.status == "UNKNOWN", effect.status
        return effect

    return make


def fresh(effect: Effect) -> Effect:
    return Effect.objects.select_related("command").get(pk=effect.pk)


def make_due(effect: Effect) -> None:
    """Time travel: the effect's next lookup is due now."""
    Effect.objects.filter(pk=effect.pk).update(next_check_at=timezone.now() - timedelta(seconds=1))


def sends(sandbox: SandboxProvider, effect: Effect) -> list[dict[str, Any]]:
    """Every POST of this effect's key the sandbox handled (commits, replays, refusals)."""
    key = effect.command.provider_key
    return [
        entry
        for entry in sandbox.log()
        if entry["idempotency_key"] == key
        and (
            entry["action"] in SEND_ACTIONS
            or (entry["action"] == "fault" and entry["fault"] != "lookup_unreachable")
        )
    ]


def lookups(sandbox: SandboxProvider, effect: Effect) -> list[dict[str, Any]]:
    """Every lookup of this effect the sandbox handled (answered, missed or dropped)."""
    key = effect.command.provider_key
    return [
        entry
        for entry in sandbox.log()
        if entry["idempotency_key"] == key
        and (
            entry["action"] in ("lookup", "lookup_miss")
            or (entry["action"] == "fault" and entry["fault"] == "lookup_unreachable")
        )
    ]


def operations(sandbox: SandboxProvider, effect: Effect) -> list[dict[str, Any]]:
    return sandbox.operations(idempotency_key=effect.command.provider_key)
