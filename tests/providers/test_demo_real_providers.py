"""``make demo DEMO_ARGS="--providers real"``: the demo's Stripe and SMTP servers and their
configuration, with a real worker. A charge and then its refund submitted through the API go
to Stripe through the Stripe adapter, and the refund shows up in the Stripe server's own API;
an email goes to the SMTP server through the SMTP adapter and lands in its Maildir."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from email import message_from_bytes
from pathlib import Path

import pytest
import stripe
from django.db import connection

from gateway.contracts import CONTRACTS
from gateway.management import demo_mail
from gateway.management.commands import demo
from gateway.models import Attempt, Effect
from gateway.providers import registry
from gateway.providers.base import LookupStatus
from gateway.providers.config import fingerprint
from gateway.providers.smtp import message_id_for
from tests.support.processes import Celery, free_port, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]
NEEDS_NODE = pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")


@pytest.fixture
def stripe_url():
    """The demo's Stripe child, started and stopped by the demo's own functions."""
    demo.ensure_stripe_server()
    port = free_port()
    child = demo.stripe_child(port, verbose=False)
    lines: list[str] = []
    demo.start_child(child, dict(os.environ), lambda name, colour, line: lines.append(line))
    url = f"http://127.0.0.1:{port}"
    try:
        demo.wait_until_healthy([child], [demo.stripe_health(url)], demo.StopSignal())
        yield url
    finally:
        demo.stop_children([child], demo.StopSignal())


def settled(effect_id: str) -> Effect:
    def done() -> bool:
        connection.close()  # read what the worker committed
        return Effect.objects.get(pk=effect_id).status not in {"PREPARED", "DISPATCHING"}

    wait_until(done, timeout=60, what=f"{effect_id} dispatched")
    return Effect.objects.get(pk=effect_id)


@NEEDS_NODE
def test_a_refund_made_in_the_demo_shows_up_in_stripes_own_api(
    stripe_url, sandbox, agent, queue, tmp_path, monkeypatch
):
    monkeypatch.delenv("GATEWAY_PROVIDERS", raising=False)
    monkeypatch.delenv(demo.STRIPE_KEY_ENV, raising=False)
    environment = demo.real_providers_environment(stripe_url)
    worker = Celery("worker", queue, tmp_path / "worker.log", **environment)
    try:
        charge = agent.submit(
            {
                "type": "billing.charge.create",
                "resource": {"type": "order", "id": "ord_demo_1"},
                "payload": {"amount": 4999, "currency": "EUR", "customer_id": "cus_42"},
                "intent": {"summary": "charge order ord_demo_1"},
            },
            "demo-charge-1",
        )
        assert charge.status_code == 201, charge.content
        charged = settled(charge.json()["effect_id"])
        assert charged.status == "CONFIRMED", worker.output()[-3000:]
        charge_id = charged.provider_operation_id
        assert charge_id.startswith("ch_")
        refund = agent.submit(
            {
                "type": "billing.refund.create",
                "resource": {"type": "order", "id": "ord_demo_1"},
                "payload": {
                    "amount": 500,
                    "currency": "EUR",
                    "reason": "damaged in transit",
                    "charge_id": charge_id,
                },
                "intent": {"summary": "refund part of ord_demo_1"},
            },
            "demo-refund-1",
        )
        assert refund.status_code == 201, refund.content
        refunded = settled(refund.json()["effect_id"])
        assert refunded.status == "CONFIRMED", worker.output()[-3000:]
    finally:
        worker.stop()
    oracle = stripe.StripeClient(demo.STRIPE_TEST_KEY, base_addresses={"api": stripe_url})
    refunds = oracle.v1.refunds.list(params={"charge": charge_id}).data
    assert [(r.id, r.amount, r.status) for r in refunds] == [
        (refunded.provider_operation_id, 500, "succeeded")
    ]
    assert refunds[0].metadata["effect_id"] == refunded.pk
    assert oracle.v1.charges.retrieve(charge_id).amount_refunded == 500
    for effect in (charged, refunded):
        attempt = Attempt.objects.get(effect=effect)
        assert attempt.adapter == "stripe"
        assert attempt.credential_fingerprint == fingerprint(demo.STRIPE_TEST_KEY)
    assert demo.STRIPE_TEST_KEY not in worker.output()
    assert "Traceback" not in worker.output()


@pytest.fixture
def smtp_server(tmp_path):
    """The demo's SMTP child (aiosmtpd into a Maildir), started and stopped by the demo's own
    functions; its port and its Maildir."""
    port, maildir = free_port(), tmp_path / "demo-mail"
    child = demo.smtp_child(port, maildir)
    demo.start_child(child, dict(os.environ), lambda name, colour, line: None)
    try:
        demo.wait_until_healthy([child], [demo.smtp_health(port)], demo.StopSignal())
        yield port, maildir
    finally:
        demo.stop_children([child], demo.StopSignal())


def test_an_email_sent_in_the_demo_lands_in_the_smtp_servers_own_maildir(
    smtp_server, sandbox, agent, queue, tmp_path, monkeypatch
):
    port, maildir = smtp_server
    monkeypatch.delenv("GATEWAY_PROVIDERS", raising=False)
    environment = demo.real_providers_environment("http://127.0.0.1:9", smtp_port=port)
    worker = Celery("worker", queue, tmp_path / "worker.log", **environment)
    try:
        sent = agent.submit(
            {
                "type": "email.message.send",
                "resource": {"type": "customer", "id": "cus_42"},
                "payload": {
                    "to": "ada@example.com",
                    "subject": "Your order has shipped",
                    "body": "Your order ord_881 is on its way.",
                },
                "intent": {"summary": "tell ada her order shipped"},
            },
            "demo-email-1",
        )
        assert sent.status_code == 201, sent.content
        effect = settled(sent.json()["effect_id"])
        assert effect.status == "CONFIRMED", worker.output()[-3000:]
    finally:
        worker.stop()
    stored = [message_from_bytes(p.read_bytes()) for p in (maildir / "new").iterdir()]
    domain = demo.SMTP_FROM.rpartition("@")[2]
    assert [(m["Message-ID"], m["X-Effect-Id"], m["To"]) for m in stored] == [
        (message_id_for(effect.command.provider_key, domain), effect.pk, "ada@example.com")
    ]
    assert effect.provider_operation_id == stored[0]["Message-ID"]
    assert Attempt.objects.get(effect=effect).adapter == "smtp"


@pytest.fixture
def demo_mail_servers(settings):
    """The demo's SMTP server and its IMAP archive (Dovecot), as ``mail_servers`` starts them,
    under a var dir Dovecot's unprivileged user can traverse."""
    if demo_mail.dovecot_missing(Path("/")):
        pytest.skip(demo_mail.dovecot_missing(Path("/")))
    root = Path(tempfile.mkdtemp(prefix="effect-gateway-demo-var-"))
    root.chmod(0o755)
    settings.VAR_DIR = root
    smtp_port = free_port()
    servers = demo.mail_servers(smtp_port, free_port())
    assert servers.imap_port, "Dovecot is installed: the demo runs its archive"
    for child in servers.children:
        demo.start_child(child, dict(os.environ), lambda name, colour, line: None)
    try:
        demo.wait_until_healthy(servers.children, servers.health, demo.StopSignal())
        yield servers, smtp_port
    finally:
        demo.stop_children(servers.children, demo.StopSignal())
        shutil.rmtree(root, ignore_errors=True)


def test_the_demos_imap_archive_finds_what_its_smtp_server_accepted(
    demo_mail_servers, sandbox, agent, queue, tmp_path, monkeypatch, settings
):
    servers, smtp_port = demo_mail_servers
    monkeypatch.delenv("GATEWAY_PROVIDERS", raising=False)
    environment = servers.environment("http://127.0.0.1:9", smtp_port)
    worker = Celery("worker", queue, tmp_path / "worker.log", **environment)
    try:
        sent = agent.submit(
            {
                "type": "email.message.send",
                "resource": {"type": "customer", "id": "cus_7"},
                "payload": {"to": "bob@example.com", "subject": "Hello", "body": "Hi Bob."},
                "intent": {"summary": "greet bob"},
            },
            "demo-email-imap",
        )
        assert sent.status_code == 201, sent.content
        effect = settled(sent.json()["effect_id"])
        assert effect.status == "CONFIRMED", worker.output()[-3000:]
    finally:
        worker.stop()
    # The adapter the demo configures, built here from the same entry, finds it by key.
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    settings.GATEWAY_PROVIDERS = json.loads(environment["GATEWAY_PROVIDERS"])
    registry.forget_adapters()
    try:
        adapter = registry.adapter_for(CONTRACTS["email.message.send"])
        found = adapter.lookup(idempotency_key=effect.command.provider_key, timeout=5.0)
    finally:
        registry.forget_adapters()
    assert found.status == LookupStatus.FOUND, found
    assert found.operation is not None
    assert found.operation.payload_digest == effect.command.payload_digest
    assert demo_mail.IMAP_PASSWORD_ENV in environment
    assert environment[demo_mail.IMAP_PASSWORD_ENV] not in environment["GATEWAY_PROVIDERS"]
