"""The audit chain sealed after commit: events are inserted without a tenant lock, the
sequencer chains them in batches (one row each, the events never rewritten), the trigger
guards them until (and after) they are sealed."""

from __future__ import annotations

import threading
from itertools import pairwise

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from gateway import audit, ledger, services
from gateway.models import AuditBatch, AuditChainHead, Effect, EffectEvent
from tests.conftest import TICKET


def note(effect: Effect, reason: str) -> EffectEvent:
    return ledger.append_event(effect, kind="note", actor="test", reason=reason)


def submit(agent, key: str) -> Effect:
    response = agent.submit(TICKET, key)
    assert response.status_code == 201, response.content
    return Effect.objects.get(pk=response.json()["effect_id"])


def unsealed(tenant_id: int) -> int:
    return audit.seal_state(tenant_id).unsealed


def row_versions(table: str, ids: list) -> list[str]:
    """PostgreSQL's xmin of each row: an UPDATE, even of nothing, gives the row a new one."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT xmin::text FROM {table} WHERE id = ANY(%s) ORDER BY id", [ids])
        return [xmin for (xmin,) in cursor.fetchall()]


def test_events_are_written_unsealed_and_sealed_in_order_by_the_sequencer(agent, capsys):
    first, second = submit(agent, "t1"), submit(agent, "t2")
    tenant = first.tenant_id
    before = set(audit.chain_event_ids(tenant))
    ours = list(EffectEvent.objects.filter(effect__in=[first, second]).values_list("pk", flat=True))
    assert not before & set(ours)
    assert unsealed(tenant) >= 2
    sealed = audit.seal_pending()
    assert sealed >= 2
    assert unsealed(tenant) == 0
    chain = audit.chain_event_ids(tenant)
    assert set(ours) <= set(chain)
    assert len(chain) == len(set(chain)) == EffectEvent.objects.filter(tenant_id=tenant).count()
    batches = list(AuditBatch.objects.filter(tenant_id=tenant).order_by("last"))
    assert batches[0].first == 1 and batches[0].prev_hash == audit.GENESIS
    assert all(
        (later.first, later.prev_hash) == (earlier.last + 1, earlier.hash)
        for earlier, later in pairwise(batches)
    )
    assert all(batch.sealed_at is not None for batch in batches)
    head = AuditChainHead.objects.get(tenant_id=tenant)
    assert (head.length, head.last_hash) == (len(chain), batches[-1].hash)
    assert audit.verify_tenant(tenant) is None
    assert audit.seal_pending() == 0  # nothing left


def test_sealing_writes_no_event_and_an_idle_pass_writes_nothing(agent):
    effect = submit(agent, "t1")
    note(effect, "a second event")
    ids = list(EffectEvent.objects.filter(effect=effect).values_list("pk", flat=True))
    versions = row_versions("gateway_effectevent", ids)
    assert audit.seal_pending() >= 2
    assert row_versions("gateway_effectevent", ids) == versions  # sealed, not rewritten
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT xmin::text FROM gateway_auditchainhead WHERE tenant_id = %s",
            [effect.tenant_id],
        )
        head = cursor.fetchone()[0]
        batches = AuditBatch.objects.count()
        assert audit.seal_pending() == 0
        cursor.execute(
            "SELECT xmin::text FROM gateway_auditchainhead WHERE tenant_id = %s",
            [effect.tenant_id],
        )
        assert cursor.fetchone()[0] == head
    assert AuditBatch.objects.count() == batches


def test_verify_audit_reports_the_sealed_head_and_the_lag(agent, capsys):
    effect = submit(agent, "t1")
    call_command("verify_audit", "--no-seal")
    out = capsys.readouterr().out
    assert "acme: sealed head at 0" in out and "unsealed, sealing lag" in out
    assert unsealed(effect.tenant_id) > 0  # --no-seal wrote nothing
    call_command("verify_audit")
    call_command("verify_audit")
    out = capsys.readouterr().out
    assert "acme: chain intact" in out and " 0 unsealed, sealing lag 0.000s" in out


def test_what_a_transaction_writes_after_sealing_is_sealed_by_the_next_pass(agent):
    """A pass inside a transaction that also writes events (a script, these tests) seals
    what it sees; what the transaction writes after must stay above the floor."""
    effect = submit(agent, "t1")
    audit.seal_pending()
    later = note(effect, "after the pass, same transaction")
    assert audit.seal_pending() == 1
    assert later.pk in audit.chain_event_ids(effect.tenant_id)


def test_a_batch_limit_seals_in_several_transactions(agent):
    effect = submit(agent, "t1")
    for index in range(5):
        note(effect, f"n{index}")
    assert audit.seal_tenant(effect.tenant_id, batch=2) == 2
    assert audit.seal_pending(batch=2) >= 4
    assert audit.verify_tenant(effect.tenant_id) is None


def test_a_tenant_shard_seals_only_its_tenants(agent, rival_agent):
    ours, theirs = submit(agent, "t1"), submit(rival_agent, "t1")
    shard = ours.tenant_id % 2
    assert ours.tenant_id % 2 != theirs.tenant_id % 2 or pytest.skip("same shard")
    audit.seal_pending(shard=shard, shards=2)
    assert unsealed(ours.tenant_id) == 0
    assert unsealed(theirs.tenant_id) > 0


def test_the_beat_task_seals(agent, eager_tasks):
    from gateway.tasks import seal_audit

    effect = submit(agent, "t1")
    seal_audit.delay()
    assert unsealed(effect.tenant_id) == 0
    assert set(EffectEvent.objects.filter(effect=effect).values_list("pk", flat=True)) <= set(
        audit.chain_event_ids(effect.tenant_id)
    )


def test_removing_a_sealed_event_in_the_middle_is_reported(agent, capsys):
    effect = submit(agent, "t1")
    for index in range(3):
        note(effect, f"n{index}")
    audit.seal_pending()
    ours = set(EffectEvent.objects.filter(effect=effect).values_list("pk", flat=True))
    middle = [pk for pk in audit.chain_event_ids(effect.tenant_id) if pk in ours][1]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET session_replication_role = replica")
        cursor.execute("DELETE FROM gateway_effectevent WHERE id = %s", [middle])
        if connection.vendor == "postgresql":
            cursor.execute("SET session_replication_role = DEFAULT")
    with pytest.raises(CommandError):
        call_command("verify_audit")
    assert "BROKEN" in capsys.readouterr().out


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE gateway_effectevent SET reason = 'nothing happened' WHERE id = %s",
        "UPDATE gateway_effectevent SET txid = txid + 1 WHERE id = %s",
        "UPDATE gateway_effectevent SET created_at = now() WHERE id = %s",
        "DELETE FROM gateway_effectevent WHERE id = %s",
        "UPDATE gateway_auditbatch SET hash = repeat('0', 64) WHERE %s = ANY(event_ids)",
        "UPDATE gateway_auditbatch SET event_ids = '{}' WHERE %s = ANY(event_ids)",
        "DELETE FROM gateway_auditbatch WHERE %s = ANY(event_ids)",
    ],
)
def test_a_sealed_event_and_its_batch_cannot_be_changed_or_resealed(agent, statement):
    effect = submit(agent, "t1")
    audit.seal_pending()
    event = EffectEvent.objects.filter(effect=effect).get()
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(statement, [event.pk])


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE gateway_effectevent SET reason = 'nothing happened' WHERE id = %s",
        "UPDATE gateway_effectevent SET reason = 'x', txid = 1 WHERE id = %s",
        "DELETE FROM gateway_effectevent WHERE id = %s",
    ],
)
def test_an_unsealed_event_is_protected_by_the_trigger(agent, statement):
    event = EffectEvent.objects.filter(effect=submit(agent, "t1")).get()
    assert event.pk not in audit.chain_event_ids(event.tenant_id)
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(statement, [event.pk])


@pytest.mark.django_db(transaction=True)
def test_a_transition_takes_no_tenant_wide_lock(agent, sandbox):
    """While another transaction holds the tenant's chain head (the sequencer sealing, a saga
    write), submissions and transitions of that tenant go on."""
    audit.seal_pending()
    tenant = agent.principal.tenant_id
    holding, release = threading.Event(), threading.Event()

    def hold_the_head():
        try:
            with transaction.atomic():
                audit.lock_chain(tenant)
                holding.set()
                release.wait(10)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_head)
    holder.start()
    try:
        assert holding.wait(5)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '2s'")  # waiting on the head would fail here
        effect = submit(agent, "t1")
        assert services.effect_dispatch(effect_id=effect.pk)
        effect.refresh_from_db()
        assert effect.status == "CONFIRMED"
        assert audit.seal_tenant(tenant) == 0  # the sequencer skips a held head, no wait
    finally:
        release.set()
        holder.join()
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = 0")
    assert audit.seal_tenant(tenant) == 3  # submitted, claimed, dispatched
    assert audit.verify_tenant(tenant) is None


@pytest.mark.django_db(transaction=True)
def test_the_chain_follows_commit_order_not_id_order(agent):
    effect = submit(agent, "t1")
    audit.seal_pending()
    inside, done = threading.Event(), threading.Event()
    early: list[int] = []

    def long_transaction():
        try:
            with transaction.atomic():
                early.append(note(effect, "written first, committed last").pk)
                inside.set()
                done.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=long_transaction)
    thread.start()
    assert inside.wait(5)
    late = note(effect, "written second, committed first")
    assert late.pk > early[0]
    assert audit.seal_pending() == 1  # only what is committed
    done.set()
    thread.join()
    assert audit.seal_pending() == 1
    order = [pk for pk in audit.chain_event_ids(effect.tenant_id) if pk in (late.pk, early[0])]
    assert order == [late.pk, early[0]]
    assert audit.verify_tenant(effect.tenant_id) is None
    sealed_at = audit.seal_times([late.pk])[late.pk]
    assert EffectEvent.objects.get(pk=late.pk).created_at <= sealed_at <= timezone.now()


def test_an_event_slipped_in_below_the_floor_is_reported(agent, capsys):
    """A row written with the triggers off and an old transaction id would never be sealed:
    verify_audit names it instead of passing over it."""
    effect = submit(agent, "t1")
    audit.seal_pending()
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        cursor.execute(
            "INSERT INTO gateway_effectevent (tenant_id, effect_id, subject, kind, from_status,"
            " to_status, actor, reason, data, created_at, txid) SELECT tenant_id, effect_id, "
            "'', 'note', '', '', 'x', 'slipped in', '{}', now(), 1 FROM gateway_effectevent "
            "WHERE effect_id = %s LIMIT 1 RETURNING id",
            [effect.pk],
        )
        (slipped,) = cursor.fetchone()
        cursor.execute("SET session_replication_role = DEFAULT")
    with pytest.raises(CommandError):
        call_command("verify_audit")
    out = capsys.readouterr().out
    assert f"BROKEN at event {slipped}" in out and "never be sealed" in out


def test_after_a_restore_behind_the_floor_the_sequencer_stops_until_audit_rebase(agent, capsys):
    """A logical restore into another cluster keeps the events' transaction ids but not the
    counter: new events would land below the floor. The sequencer stops and says so; the
    rebase moves the ids past the ledger's and seals what waited."""
    effect = submit(agent, "t1")
    audit.seal_pending()
    tenant = effect.tenant_id
    # As after such a restore: the ledger's floor far ahead of the cluster's counter.
    AuditChainHead.objects.filter(tenant_id=tenant).update(floor_txid=10**15)
    waiting = note(effect, "written after the restore")
    assert audit.seal_pending() == 0
    assert audit.seal_state(tenant).halted
    with pytest.raises(CommandError):
        call_command("verify_audit")
    assert "sequencer has stopped" in capsys.readouterr().out
    call_command("audit_rebase")
    assert "sealed 1 event" in capsys.readouterr().out
    assert waiting.pk in audit.chain_event_ids(tenant)
    later = note(effect, "written after the rebase")
    assert later.txid is not None and later.txid >= 10**15
    assert not audit.seal_state(tenant).halted
    assert audit.seal_pending() == 1
    call_command("audit_rebase")  # nothing to move the second time
    assert "nothing to move" in capsys.readouterr().out
    assert audit.verify_tenant(tenant) is None
