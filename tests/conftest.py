"""Fixtures shared by the whole suite: personas, API clients, the real sandbox provider.

The sandbox runs for real, over HTTP, on a free loopback port; its operation log is the
oracle for every exactly-once assertion.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from gateway.celery import app as celery_app
from gateway.models import Principal
from gateway.providers.sandbox import SandboxProvider, SandboxServer

# The conformance kit's plugin, as a team adds it (tests/providers/test_conformance.py).
pytest_plugins = ["gateway.providers.conformance.pytest_plugin"]

PROVIDER_NAMES = ("billing", "inventory", "shipping", "deploy", "tickets", "mail", "verify")

# Tests that hold many database connections at once: twenty racing threads, or real worker
# and beat processes. Under pytest-xdist (`--dist loadgroup`) they all run on one worker, one
# at a time, so a run's connections stay near one such test's plus the other worker's one or
# two, under the embedded server's cap; and real workers never compete with each other for
# the two cores, which keeps their timing (lease, backoff) far from the tests' timeouts.
MANY_CONNECTIONS = (
    "tests/gateway/test_concurrency.py",
    "tests/sagas/test_concurrency.py",
    "tests/reconciliation/test_concurrency.py",
    "tests/gateway/test_security.py::test_concurrent_submissions_never_overspend_a_budget",
    "tests/gateway/test_dispatch_batch.py::test_concurrent_drainers",
)


def pytest_collection_modifyitems(config, items):
    group = pytest.mark.xdist_group("many-connections")
    for item in items:
        if "worker" in item.keywords or item.nodeid.startswith(MANY_CONNECTIONS):
            item.add_marker(group)


# The tests' webhook receivers listen on loopback, which the product refuses by default
# (SSRF): allowed here, for this process and the workers it starts; tests of the refusal turn
# it off again.
os.environ.setdefault("GATEWAY_WEBHOOK_ALLOW_PRIVATE", "true")
# The suite approves by digest alone (``_approvals_by_digest`` below), and so do the workers
# and servers it starts, which would otherwise refuse to send those approvals unsigned.
os.environ.setdefault("GATEWAY_SIGNED_APPROVAL_CLASSES", "none")


@pytest.fixture(autouse=True)
def _loopback_receivers(settings):
    settings.GATEWAY_WEBHOOK_ALLOW_PRIVATE = True


@pytest.fixture(autouse=True)
def _token_cache_off(settings):
    """Tests revoke tokens by writing the table and expect the next request to be refused:
    the per-process token cache (GATEWAY_TOKEN_CACHE_TTL) is off unless a test turns it on
    (tests/gateway/test_token_cache.py)."""
    from gateway import trust

    settings.GATEWAY_TOKEN_CACHE_TTL = 0
    trust.clear()


@pytest.fixture(autouse=True)
def _approvals_by_digest(settings):
    """The product signs approvals of financial and irreversible types by default
    (gateway.signing); the suite approves by digest alone unless a test asks for the policy
    (the ``signed_approvals`` fixture, tests/security/test_signed_approvals.py and the
    browser's passkey flow)."""
    settings.GATEWAY_SIGNED_APPROVAL_CLASSES = []


@pytest.fixture
def signed_approvals(settings):
    """The shipped policy: financial writes and irreversible types need a signed approval."""
    settings.GATEWAY_SIGNED_APPROVAL_CLASSES = ["financial_write", "irreversible"]


@pytest.fixture(autouse=True)
def _login_lockout_off(settings):
    """django-axes writes rows on every login (``force_login`` too): off, so persona logins cost
    nothing, except in the lockout tests, which turn it on (tests/security/test_logins.py)."""
    settings.AXES_ENABLED = False


@pytest.fixture(autouse=True)
def _provider_protection_reset() -> Iterator[None]:
    """Each test starts with every provider's circuit closed and nothing counted: the state
    lives in Redis (gateway.providers.protection), which outlives a test's database. Reset
    before the test, while the settings are the run's own (a test may point the broker
    elsewhere until its ``settings`` are undone)."""
    from gateway.providers import protection

    if protection.touched():
        protection.reset()
    yield


@pytest.fixture(scope="session")
def sandbox_server() -> Iterator[SandboxServer]:
    server = SandboxServer(SandboxProvider(), port=0).start()
    yield server
    server.stop()


@pytest.fixture
def sandbox(sandbox_server: SandboxServer, settings) -> SandboxProvider:
    """A clean sandbox provider, with every contract's provider pointed at it."""
    sandbox_server.provider.reset()
    settings.GATEWAY_PROVIDER_URLS = {
        name: sandbox_server.base_url(name) for name in PROVIDER_NAMES
    }
    settings.GATEWAY_PROVIDER_TIMEOUT = 2
    return sandbox_server.provider


@pytest.fixture
def eager_tasks() -> Iterator[None]:
    """Run Celery tasks in-process when they are sent (after commit), instead of through a
    broker: the real task and service code, minus the queue."""
    previous = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = previous


def issue_token(tenant: str, name: str, role: str, password: str | None = None) -> str:
    out = io.StringIO()
    options = {"tenant": tenant, "principal": name, "role": role, "stdout": out}
    if password:
        options["password"] = password
    call_command("issue_token", **options)
    return out.getvalue().strip().splitlines()[-1]


class Persona:
    """A principal with its token and an API client that sends it."""

    def __init__(self, tenant: str, name: str, role: str) -> None:
        self.token = issue_token(tenant, name, role)
        self.principal = Principal.objects.select_related("tenant").get(
            tenant__slug=tenant, name=name
        )
        self.client = APIClient()
        self.client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.token}")

    def submit(self, body: dict, key: str | None, **extra):
        headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
        return self.client.post("/api/v1/commands", body, format="json", **headers, **extra)


@pytest.fixture
def queue() -> Iterator[str]:
    """A broker queue of the test's own, the default one while it runs, so no message of
    another test reaches the worker it starts."""
    from tests.support.processes import new_queue

    name = new_queue()
    previous = celery_app.conf.task_default_queue
    celery_app.conf.task_default_queue = name
    yield name
    celery_app.conf.task_default_queue = previous


@pytest.fixture
def agent(db) -> Persona:
    return Persona("acme", "refund-bot", "agent")


@pytest.fixture
def other_agent(db) -> Persona:
    return Persona("acme", "deploy-bot", "agent")


@pytest.fixture
def approver(db) -> Persona:
    return Persona("acme", "alice", "approver")


@pytest.fixture
def operator(db) -> Persona:
    return Persona("acme", "oscar", "operator")


@pytest.fixture
def admin(db) -> Persona:
    return Persona("acme", "root", "admin")


@pytest.fixture
def rival_agent(db) -> Persona:
    """An agent of another tenant."""
    return Persona("globex", "refund-bot", "agent")


@pytest.fixture
def rival_operator(db) -> Persona:
    return Persona("globex", "olga", "operator")


REFUND = {
    "type": "billing.refund.create",
    "resource": {"type": "order", "id": "ord_881", "version": 17},
    "payload": {"amount": 500, "currency": "EUR", "reason": "duplicate charge"},
    "intent": {
        "summary": "refund the duplicate charge of incident 120",
        "task_id": "task_incident_120",
        "plan_revision": 1,
    },
    "expires_in": 300,
}

TICKET = {
    "type": "ticket.create",
    "resource": {"type": "queue", "id": "support"},
    "payload": {"title": "Printer on fire", "priority": "P2"},
    "intent": {"summary": "open a ticket"},
}


@pytest.fixture
def refund_body() -> dict:
    return {**REFUND, "payload": dict(REFUND["payload"]), "resource": dict(REFUND["resource"])}


@pytest.fixture
def ticket_body() -> dict:
    return {**TICKET, "payload": dict(TICKET["payload"])}
