"""Every endpoint × every role × two tenants: each call allowed or refused exactly as the
role table in docs/security.md says. A refused call changes nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from gateway import services
from gateway.contracts import CONTRACTS
from gateway.models import Capability, Effect, EffectEvent
from tests.conftest import Persona

pytestmark = pytest.mark.django_db

ROLES = ("agent", "approver", "operator", "admin")
ANY = frozenset(ROLES)
OPERATORS = frozenset({"operator", "admin"})
APPROVERS = frozenset({"approver", "admin"})
RESERVATION = {
    "type": "inventory.reservation.create",
    **CONTRACTS["inventory.reservation.create"].example,
}
BIG_REFUND = {
    "type": "billing.refund.create",
    "resource": {"type": "order", "id": "ord_881", "version": 17},
    "payload": {"amount": 50_000, "currency": "EUR", "reason": "duplicate"},
}
TICKET = {
    "type": "ticket.create",
    "resource": {"type": "queue", "id": "support"},
    "payload": {"title": "x", "priority": "P3"},
}


@dataclass(frozen=True)
class Endpoint:
    name: str
    method: str
    path: str  # {id} is the effect (or object) made by `setup`
    allowed: frozenset[str]
    setup: str = "prepared"  # prepared | awaiting | confirmed | unknown | capability | none
    body: Any = None
    tenant_object: bool = True  # another tenant's caller gets 404


ENDPOINTS = [
    Endpoint(
        "submit",
        "post",
        "/api/v1/commands",
        frozenset({"agent", "operator", "admin"}),
        setup="none",
        body=TICKET,
        tenant_object=False,
    ),
    Endpoint("list", "get", "/api/v1/effects", ANY, tenant_object=False),
    Endpoint("types", "get", "/api/v1/effect-types", ANY, setup="none", tenant_object=False),
    Endpoint("get", "get", "/api/v1/effects/{id}", ANY),
    Endpoint("events", "get", "/api/v1/effects/{id}/events", ANY),
    Endpoint("tool uses", "get", "/api/v1/effects/{id}/tool-uses", ANY),
    Endpoint("attempts", "get", "/api/v1/effects/{id}/attempts", ANY),
    Endpoint("reconciliations", "get", "/api/v1/effects/{id}/reconciliations", ANY),
    Endpoint(
        "approve",
        "post",
        "/api/v1/effects/{id}/approve",
        APPROVERS,
        setup="awaiting",
        body="digest",
    ),
    Endpoint(
        "reject",
        "post",
        "/api/v1/effects/{id}/reject",
        APPROVERS,
        setup="awaiting",
        body={"reason": "no"},
    ),
    # The requester (the agent here) or an operator.
    Endpoint(
        "cancel", "post", "/api/v1/effects/{id}/cancel", frozenset({"agent", "operator", "admin"})
    ),
    Endpoint("freeze", "post", "/api/v1/effects/{id}/freeze", OPERATORS),
    Endpoint("unfreeze", "post", "/api/v1/effects/{id}/unfreeze", OPERATORS),
    Endpoint(
        "compensate",
        "post",
        "/api/v1/effects/{id}/compensate",
        frozenset({"agent", "operator", "admin"}),
        setup="confirmed",
        body={"reason": "order cancelled"},
    ),
    Endpoint("reconcile", "post", "/api/v1/effects/{id}/reconcile", OPERATORS, setup="unknown"),
    Endpoint(
        "resolve",
        "post",
        "/api/v1/effects/{id}/resolve",
        OPERATORS,
        setup="unknown",
        body={"outcome": "confirmed", "evidence": "seen in the provider's dashboard"},
    ),
    Endpoint("cases", "get", "/api/v1/cases", ANY, setup="none", tenant_object=False),
    Endpoint(
        "capabilities", "get", "/api/v1/capabilities", OPERATORS, setup="none", tenant_object=False
    ),
    Endpoint(
        "grant",
        "post",
        "/api/v1/capabilities",
        frozenset({"admin"}),
        setup="none",
        body={"principal": "refund-bot", "effect_types": ["ticket.*"]},
        tenant_object=False,
    ),
    Endpoint("revoke", "post", "/api/v1/capabilities/{id}/revoke", OPERATORS, setup="capability"),
    Endpoint(
        "freeze type",
        "post",
        "/api/v1/effect-types/ticket.create/freeze",
        OPERATORS,
        setup="none",
        tenant_object=False,
    ),
    Endpoint(
        "freeze principal", "post", "/api/v1/principals/refund-bot/freeze", OPERATORS, setup="none"
    ),
    Endpoint(
        "webhook endpoints",
        "get",
        "/api/v1/webhook-endpoints",
        OPERATORS | {"agent"},  # an agent lists its own
        setup="none",
        tenant_object=False,
    ),
]


@pytest.fixture
def personas(db) -> dict[str, Persona]:
    people = {
        "agent": Persona("acme", "refund-bot", "agent"),
        "approver": Persona("acme", "alice", "approver"),
        "operator": Persona("acme", "oscar", "operator"),
        "admin": Persona("acme", "root", "admin"),
    }
    for role in ROLES:
        people[f"rival-{role}"] = Persona("globex", f"rival-{role}", role)
    return people


def make_object(endpoint: Endpoint, personas, sandbox) -> str | None:
    agent = personas["agent"]
    if endpoint.setup == "none":
        return None
    if endpoint.setup == "capability":
        return Capability.objects.filter(principal=agent.principal).first().pk
    body = {"awaiting": BIG_REFUND, "confirmed": RESERVATION}.get(endpoint.setup, TICKET)
    effect_id = agent.submit(body, f"matrix-{endpoint.name}").json()["effect_id"]
    if endpoint.setup == "unknown":
        sandbox.add_fault("commit_then_drop", times=1)
    if endpoint.setup in {"confirmed", "unknown"}:
        services.effect_dispatch(effect_id=effect_id, worker="matrix")
    return effect_id


def call(persona: Persona, endpoint: Endpoint, object_id: str | None):
    path = endpoint.path.replace("{id}", object_id or "")
    if endpoint.method == "get":
        return persona.client.get(path)
    body = endpoint.body
    if body == "digest":
        body = {"payload_digest": Effect.objects.get(pk=object_id).command.payload_digest}
    if path == "/api/v1/commands":
        return persona.submit(body, f"matrix-submit-{persona.principal.name}")
    return persona.client.post(path, body or {}, format="json")


def snapshot() -> tuple:
    return (
        list(Effect.objects.order_by("pk").values_list("pk", "status", "frozen")),
        EffectEvent.objects.count(),
        list(Capability.objects.order_by("pk").values_list("pk", "revoked_at")),
    )


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: e.name)
def test_role_matrix(endpoint, role, personas, sandbox):
    object_id = make_object(endpoint, personas, sandbox)
    before = snapshot()
    response = call(personas[role], endpoint, object_id)
    if role in endpoint.allowed:
        assert 200 <= response.status_code < 300, (response.status_code, response.content)
    else:
        assert response.status_code == 403, (response.status_code, response.content)
        assert response.headers["Content-Type"] == "application/problem+json"
        assert snapshot() == before


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(
    "endpoint", [e for e in ENDPOINTS if e.tenant_object], ids=lambda e: e.name
)
def test_another_tenant_sees_nothing(endpoint, role, personas, sandbox):
    object_id = make_object(endpoint, personas, sandbox)
    before = snapshot()
    response = call(personas[f"rival-{role}"], endpoint, object_id)
    # Another tenant's object does not exist for the caller; a role refusal may come first.
    assert response.status_code in {403, 404}, (response.status_code, response.content)
    if role in endpoint.allowed:
        assert response.status_code == 404
    assert snapshot() == before
