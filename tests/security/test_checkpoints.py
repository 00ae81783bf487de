"""Issue 13 item 4: tamper evidence without gaps. Signed checkpoints of each chain head live
outside the database; verify_audit --against proves the ledger extends them; effect statuses
and receipts are checked against the chain; TRUNCATE is refused to the app's role."""

from __future__ import annotations

import json
import uuid

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from gateway import audit, checkpoints, services
from gateway.audit import link_hash
from gateway.lib import merkle
from gateway.models import AuditBatch, AuditChainHead, Effect, EffectEvent, Receipt, Tenant

pytestmark = pytest.mark.django_db

TICKET = {
    "type": "ticket.create",
    "resource": {"type": "queue", "id": "support"},
    "payload": {"title": "x", "priority": "P3"},
}


@pytest.fixture
def checkpoint_dir(settings, tmp_path):
    settings.GATEWAY_CHECKPOINT_DIR = str(tmp_path / "checkpoints")
    return tmp_path / "checkpoints"


def run(*args: str) -> tuple[bool, str]:
    import io

    out = io.StringIO()
    try:
        call_command("verify_audit", *args, stdout=out)
    except CommandError:
        return False, out.getvalue()
    return True, out.getvalue()


def ledger_with_history(agent, count: int = 3) -> list[str]:
    ids = []
    for index in range(count):
        effect_id = agent.submit(TICKET, f"t{index}").json()["effect_id"]
        services.effect_dispatch(effect_id=effect_id, worker="test")
        ids.append(effect_id)
    audit.seal_pending()  # the sequencer's pass: the events become links of the chain
    return ids


def raw_sql(*statements: tuple[str, list]) -> None:
    """What an attacker with the table owner's rights does: triggers off, then write."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET session_replication_role = replica")
        for sql, params in statements:
            cursor.execute(sql, params)
        if connection.vendor == "postgresql":
            cursor.execute("SET session_replication_role = DEFAULT")


def rehash_chain(tenant_id: int, *, keep: set[int] | None = None) -> None:
    """Recompute every link, batch and the head after an edit (keeping only the events in
    ``keep``, if given), so the chain alone looks intact."""
    previous, position, last = "0" * 64, 0, None
    for batch in AuditBatch.objects.filter(tenant_id=tenant_id).order_by("last"):
        ids = [pk for pk in batch.event_ids if keep is None or pk in keep]
        if not ids:
            raw_sql(("DELETE FROM gateway_auditbatch WHERE id = %s", [batch.pk]))
            continue
        events = EffectEvent.objects.in_bulk(ids)
        start, links = previous, []
        for pk in ids:
            previous = link_hash(previous, events[pk])
            links.append(bytes.fromhex(previous))
        raw_sql(
            (
                "UPDATE gateway_auditbatch SET first = %s, last = %s, event_ids = %s, "
                "links = %s, prev_hash = %s, hash = %s WHERE id = %s",
                [
                    position + 1,
                    position + len(ids),
                    ids,
                    b"".join(links),
                    start,
                    previous,
                    batch.pk,
                ],
            )
        )
        position, last = position + len(ids), ids[-1]
    AuditChainHead.objects.filter(tenant_id=tenant_id).update(
        last_hash=previous, length=position, last_event_id=last
    )


def rehash_leaf(event_id: int) -> None:
    """Recompute the Merkle leaf (gateway.audit_tree) of an edited event."""
    event = EffectEvent.objects.get(pk=event_id)
    raw_sql(
        (
            "UPDATE gateway_auditleaf SET leaf_hash = %s WHERE event_id = %s",
            [merkle.leaf_hash(audit.leaf_bytes(event)), event_id],
        )
    )


def test_checkpoints_are_signed_appended_outside_and_listed(
    agent, rival_agent, sandbox, checkpoint_dir
):
    ledger_with_history(agent, 2)
    rival_agent.submit(TICKET, "rival")
    assert checkpoints.checkpoints_write_all() == 2
    assert checkpoints.checkpoints_write_all() == 0  # nothing moved: nothing new
    lines = (checkpoint_dir / "acme.jsonl").read_text().splitlines()
    assert len(lines) == 1
    written = json.loads(lines[0])
    head = AuditChainHead.objects.get(tenant__slug="acme")
    assert (written["length"], written["head"]) == (head.length, head.last_hash)
    listed = agent.client.get("/api/v1/audit/checkpoints").json()
    assert [c["head"] for c in listed["results"]] == [head.last_hash]
    assert listed["public_key"] == written["key"]
    # Another tenant sees its own checkpoints only.
    theirs = rival_agent.client.get("/api/v1/audit/checkpoints").json()["results"]
    assert {c["tenant"] for c in theirs} == {"globex"}
    ok, out = run("--against", str(checkpoint_dir / "acme.jsonl"))
    assert ok and "acme: checkpoint at" in out and "extended" in out


def test_a_rewritten_and_rehashed_history_fails_against_the_checkpoint(
    agent, sandbox, checkpoint_dir
):
    ids = ledger_with_history(agent)
    checkpoints.checkpoints_write_all()
    tenant = Tenant.objects.get(slug="acme")
    first = EffectEvent.objects.filter(effect_id=ids[0]).order_by("id").first()
    raw_sql(("UPDATE gateway_effectevent SET reason = 'nothing' WHERE id = %s", [first.pk]))
    rehash_chain(tenant.pk)
    ok, out = run()
    assert not ok and "does not match the event" in out  # the Merkle leaf still names it
    rehash_leaf(first.pk)
    ok, out = run()
    assert ok, out  # chain and leaves re-hashed: the database alone cannot tell
    ok, out = run("--against", str(checkpoint_dir / "acme.jsonl"))
    assert not ok and "history before the checkpoint was rewritten" in out


def test_a_cut_tail_with_a_fixed_head_fails_against_the_checkpoint(agent, sandbox, checkpoint_dir):
    ledger_with_history(agent)
    checkpoints.checkpoints_write_all()
    tenant = Tenant.objects.get(slug="acme")
    keep = audit.chain_event_ids(tenant.pk)[:3]
    raw_sql(
        (
            "DELETE FROM gateway_effectevent WHERE tenant_id = %s AND NOT (id = ANY(%s))",
            [tenant.pk, keep],
        )
    )
    rehash_chain(tenant.pk, keep=set(keep))
    ok, out = run("--against", str(checkpoint_dir / "acme.jsonl"))
    assert not ok and "events were removed" in out


@pytest.mark.django_db(transaction=True)
def test_truncating_events_and_heads_fails_against_the_checkpoint(agent, sandbox, checkpoint_dir):
    ledger_with_history(agent)
    checkpoints.checkpoints_write_all()
    # As the owner (here: the superuser the tests run as) TRUNCATE goes through...
    raw_sql(
        ("TRUNCATE gateway_effectevent, gateway_auditchainhead CASCADE", []),
    )
    ok, out = run("--against", str(checkpoint_dir / "acme.jsonl"))
    assert not ok and "events were removed" in out


@pytest.mark.django_db(transaction=True)
def test_the_apps_role_cannot_truncate_the_history(agent, sandbox):
    ledger_with_history(agent, 1)
    role = f"eg_app_{uuid.uuid4().hex[:8]}"
    events = EffectEvent.objects.count()
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {role} NOLOGIN")
        try:
            tables = (
                "gateway_effectevent",
                "gateway_receipt",
                "gateway_auditchainhead",
                "gateway_auditbatch",
            )
            for table in tables:
                cursor.execute(f"GRANT SELECT, INSERT, UPDATE, TRUNCATE ON {table} TO {role}")
            for table in tables:
                with pytest.raises(DatabaseError, match="TRUNCATE refused"), transaction.atomic():
                    cursor.execute(f"SET LOCAL ROLE {role}")
                    cursor.execute(f"TRUNCATE {table}")
        finally:
            cursor.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}")
            cursor.execute(f"DROP ROLE {role}")
    assert EffectEvent.objects.count() == events


def test_a_forged_checkpoint_is_refused(agent, sandbox, checkpoint_dir):
    ledger_with_history(agent, 1)
    checkpoint = checkpoints.checkpoint_make(Tenant.objects.get(slug="acme"))
    forged = {**checkpoint, "length": 1, "head": "f" * 64}
    ok, out = run("--against", json.dumps(forged))
    assert not ok and "signature does not verify" in out
    assert run("--against", json.dumps(checkpoint))[0]


def test_an_edited_status_is_reported(agent, sandbox):
    (effect_id,) = ledger_with_history(agent, 1)
    assert run()[0]
    Effect.objects.filter(pk=effect_id).update(status="REJECTED")
    ok, out = run()
    assert not ok and f"effect {effect_id} is REJECTED, its events say CONFIRMED" in out


def test_an_edited_receipt_is_reported(agent, sandbox):
    (effect_id,) = ledger_with_history(agent, 1)
    receipt = Receipt.objects.get(effect_id=effect_id)
    assert receipt.seal
    raw_sql(("UPDATE gateway_receipt SET provider_status = 'failed' WHERE id = %s", [receipt.pk]))
    ok, out = run()
    assert not ok and f"receipt {receipt.pk} of {effect_id} was altered" in out


def test_check_deploy_warns_when_the_app_role_can_disable_triggers(capsys):
    call_command("check", "--deploy")
    assert "gateway.W001" in capsys.readouterr().err


def test_check_deploy_warns_when_nothing_analyzes_the_ledger(capsys):
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('autovacuum')")
        (autovacuum,) = cursor.fetchone()
    call_command("check", "--deploy", "--database", "default")
    err = capsys.readouterr().err
    # The machine's shared server runs without it, the embedded test server with it.
    assert ("gateway.W002" in err) == (autovacuum == "off"), (autovacuum, err)
