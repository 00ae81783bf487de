"""The audit log as a Merkle tree with an outside witness: the sequencer writes the leaves,
the gateway signs tree heads and answers inclusion and consistency proofs, verify_audit checks
them offline, and the witness cosigns heads and raises the alarm on a rewritten log."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from gateway import audit, audit_tree, checkpoints
from gateway.lib import merkle, treehead
from gateway.models import AuditLeaf, EffectEvent, Tenant
from tests.security.test_checkpoints import (  # noqa: F401 (checkpoint_dir is a fixture)
    checkpoint_dir,
    ledger_with_history,
    raw_sql,
    rehash_chain,
)

pytestmark = pytest.mark.django_db


def command(name: str, *args: str) -> tuple[bool, str]:
    out = io.StringIO()
    try:
        call_command(name, *args, stdout=out, stderr=out)
    except CommandError as exc:
        return False, out.getvalue() + str(exc)
    return True, out.getvalue()


def rewrite_event(tenant_id: int, event_id: int, *, leaves: bool = True) -> None:
    """A database writer edits a sealed event, re-hashes the chain and (``leaves``) the
    stored leaf hashes too, so that chain and tree agree with the edit."""
    raw_sql(("UPDATE gateway_effectevent SET reason = 'nothing' WHERE id = %s", [event_id]))
    rehash_chain(tenant_id)
    if leaves:
        event = EffectEvent.objects.get(pk=event_id)
        raw_sql(
            (
                "UPDATE gateway_auditleaf SET leaf_hash = %s WHERE event_id = %s",
                [merkle.leaf_hash(audit.leaf_bytes(event)), event_id],
            )
        )


def test_the_sequencer_writes_one_leaf_per_sealed_event(agent, sandbox):
    ledger_with_history(agent, 2)
    tenant = Tenant.objects.get(slug="acme")
    order = audit.chain_event_ids(tenant.pk)
    leaves = list(AuditLeaf.objects.filter(tenant=tenant).order_by("index"))
    assert [leaf.event_id for leaf in leaves] == order
    assert [leaf.index for leaf in leaves] == list(range(len(order)))
    events = EffectEvent.objects.in_bulk(order)
    assert [bytes(leaf.leaf_hash) for leaf in leaves] == [
        merkle.leaf_hash(audit.leaf_bytes(events[pk])) for pk in order
    ]
    assert audit_tree.leaf_problems(tenant.pk) == []


def test_inclusion_proofs_verify_for_real_events_and_not_for_a_forged_one(agent, operator, sandbox):
    ledger_with_history(agent, 2)
    head = operator.client.get("/api/v1/audit/tree-head").json()
    key = checkpoints.public_key_b64()
    assert treehead.check_head(head, key)[0] == head["tree_size"] > 3
    for event_id in audit.chain_event_ids(Tenant.objects.get(slug="acme").pk):
        answer = operator.client.get(
            "/api/v1/audit/proof/inclusion",
            {"event_id": event_id, "tree_size": head["tree_size"]},
        )
        assert answer.status_code == 200, answer.content
        treehead.check_inclusion(head, answer.json(), key)
    forged = {**answer.json(), "leaf_hash": merkle.leaf_hash(b'{"forged":true}').hex()}
    with pytest.raises(treehead.Invalid, match="is not in the tree of size"):
        treehead.check_inclusion(head, forged, key)
    with pytest.raises(treehead.Invalid, match="signature"):
        treehead.check_inclusion({**head, "tree_size": head["tree_size"] + 1}, answer.json(), key)


def test_the_endpoints_are_tenant_scoped_and_refuse_bad_input(
    agent, other_agent, operator, approver, rival_operator, sandbox
):
    ids = ledger_with_history(agent, 1)
    event_id = EffectEvent.objects.filter(effect_id=ids[0]).order_by("id").first().pk
    url = "/api/v1/audit/proof/inclusion"
    for persona in (operator, approver, agent):  # the agent requested that effect
        assert persona.client.get(url, {"event_id": event_id}).status_code == 200
    for persona in (other_agent, rival_operator):
        answer = persona.client.get(url, {"event_id": event_id})
        assert answer.status_code == 404
        assert answer["Content-Type"].startswith("application/problem+json")
    for params in ({}, {"event_id": "x"}, {"event_id": event_id, "tree_size": 10**6}):
        answer = operator.client.get(url, params)
        assert answer.status_code == 400, params
        assert answer["Content-Type"].startswith("application/problem+json")
    consistency = "/api/v1/audit/proof/consistency"
    assert operator.client.get(consistency, {"first": 5, "second": 2}).status_code == 400
    assert operator.client.get(consistency, {"first": "-1"}).status_code == 400
    assert operator.client.get(consistency, {"first": 1}).status_code == 200
    theirs = rival_operator.client.get("/api/v1/audit/tree-head").json()
    globex = Tenant.objects.get(slug="globex").pk
    assert (theirs["tenant"], theirs["tree_size"]) == ("globex", audit_tree.size(globex))
    assert (
        theirs["root_hash"]
        == merkle.root(audit_tree.leaf_hashes(globex, audit_tree.size(globex))).hex()
    )
    assert theirs["root_hash"] != operator.client.get("/api/v1/audit/tree-head").json()["root_hash"]
    cosign = agent.client.post("/api/v1/audit/cosignatures", {}, format="json")
    assert cosign.status_code == 403


def _save(tmp_path, name: str, value) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(value))
    return str(path)


def test_verify_audit_checks_saved_heads_and_proofs_offline(agent, operator, sandbox, tmp_path):
    ledger_with_history(agent, 1)
    old = operator.client.get("/api/v1/audit/tree-head").json()
    ledger_with_history(agent, 1)
    head = operator.client.get("/api/v1/audit/tree-head").json()
    event_id = audit.chain_event_ids(Tenant.objects.get(slug="acme").pk)[2]
    inclusion = operator.client.get(
        "/api/v1/audit/proof/inclusion", {"event_id": event_id, "tree_size": head["tree_size"]}
    ).json()
    proof = operator.client.get(
        "/api/v1/audit/proof/consistency",
        {"first": old["tree_size"], "second": head["tree_size"]},
    ).json()
    key = checkpoints.public_key_b64()
    files = [
        "--offline",
        "--public-key",
        key,
        "--tree-head",
        _save(tmp_path, "head.json", head),
        "--old-head",
        _save(tmp_path, "old.json", old),
        "--consistency",
        _save(tmp_path, "proof.json", proof),
    ]
    ok, out = command("verify_audit", *files, "--inclusion", _save(tmp_path, "inc.json", inclusion))
    assert ok, out
    assert "tree inclusion: verified" in out and "tree consistency: verified" in out
    bad = {**inclusion, "audit_path": [h[:-2] + "00" for h in inclusion["audit_path"]]}
    ok, out = command("verify_audit", *files, "--inclusion", _save(tmp_path, "bad.json", bad))
    assert not ok and "tree inclusion: BROKEN" in out
    ok, out = command(
        "verify_audit",
        *files[3:],
        "--offline",
        "--public-key",
        treehead.public_b64(treehead.Ed25519PrivateKey.generate()),
    )
    assert not ok and "not by the trusted" in out
    ok, out = command("verify_audit", *files[:5], "--witness-key", key)
    assert not ok and "no cosignature" in out


@pytest.mark.django_db(transaction=True)
def test_the_witness_cosigns_and_raises_the_alarm_on_a_rewritten_log(
    agent,
    operator,
    sandbox,
    live_server,
    tmp_path,
    checkpoint_dir,  # noqa: F811
):
    ids = ledger_with_history(agent, 1)
    witness = ["--url", live_server.url, "--token", operator.token, "--dir", str(tmp_path / "w")]
    ok, out = command("audit_witness", *witness, "--once", "--publish")
    assert ok and "cosigned the tree of size" in out and "published" in out, out
    ledger_with_history(agent, 1)
    ok, out = command("audit_witness", *witness, "--once", "--publish")
    assert ok and "cosigned" in out, out
    witness_key = json.loads((tmp_path / "w" / "cosigned.jsonl").read_text().splitlines()[-1])[
        "cosignature"
    ]["witness_key"]
    ok, out = command(
        "verify_audit",
        "--url",
        live_server.url,
        "--token",
        operator.token,
        "--witness-key",
        witness_key,
        "--no-seal",
    )
    assert ok and "tree witness: verified" in out, out
    tenant = Tenant.objects.get(slug="acme")
    first = EffectEvent.objects.filter(effect_id=ids[0]).order_by("id").first()
    # Chain re-hashed, leaves not: verify_audit sees the leaf that no longer matches.
    rewrite_event(tenant.pk, first.pk, leaves=False)
    ok, out = command("verify_audit", "--no-seal")
    assert not ok and "does not match the event" in out
    # Leaves re-hashed too: the database agrees with itself; the witness does not.
    rewrite_event(tenant.pk, first.pk)
    assert command("verify_audit", "--no-seal")[0]
    ledger_with_history(agent, 1)
    ok, out = command("audit_witness", *witness, "--once")
    assert not ok and "ALARM: the log was rewritten" in out, out
    assert "does not extend the tree of size" in out


def test_the_migration_gives_leaves_to_events_sealed_before_the_tree(agent, sandbox):
    import importlib

    from django.apps import apps

    ledger_with_history(agent, 2)
    written = list(
        AuditLeaf.objects.order_by("tenant_id", "index").values_list(
            "tenant_id", "index", "event_id", "leaf_hash"
        )
    )
    raw_sql(("DELETE FROM gateway_auditleaf", []))
    migration = importlib.import_module("gateway.migrations.0019_audit_leaf")
    migration.leaves_for_sealed_events(apps, None)
    again = list(
        AuditLeaf.objects.order_by("tenant_id", "index").values_list(
            "tenant_id", "index", "event_id", "leaf_hash"
        )
    )
    assert [(t, i, e, bytes(h)) for t, i, e, h in again] == [
        (t, i, e, bytes(h)) for t, i, e, h in written
    ]
    assert len(written) > 5


def test_the_leaves_are_append_only(agent, sandbox):
    from django.db import DatabaseError, transaction

    ledger_with_history(agent, 1)
    with pytest.raises(DatabaseError), transaction.atomic():
        AuditLeaf.objects.filter(index=0).update(leaf_hash=b"x" * 32)
    with pytest.raises(DatabaseError), transaction.atomic():
        AuditLeaf.objects.filter(index=0).delete()


def test_principals_grants_tokens_and_freezes_are_links_of_the_chain(agent, operator):
    from gateway import capabilities

    capabilities.principal_set_frozen(
        target=agent.principal, principal=operator.principal, frozen=True, reason="test"
    )
    audit.seal_pending()
    kinds = set(
        EffectEvent.objects.filter(
            pk__in=audit.chain_event_ids(agent.principal.tenant_id)
        ).values_list("kind", flat=True)
    )
    assert {"principal_created", "token_issued", "capability_granted", "principal_frozen"} <= kinds
    created = EffectEvent.objects.get(kind="principal_created", subject="principal:oscar")
    assert created.data == {"role": "operator"}
