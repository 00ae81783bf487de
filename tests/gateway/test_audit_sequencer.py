"""The audit chain sealed after commit: events are inserted without a tenant lock, the
sequencer chains them in batches, the trigger guards them until (and after) they are sealed."""

from __future__ import annotations

import threading
from itertools import pairwise

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from gateway import audit, ledger, services
from gateway.models import AuditChainHead, Effect, EffectEvent
from tests.conftest import TICKET


def note(effect: Effect, reason: str) -> EffectEvent:
    return ledger.append_event(effect, kind="note", actor="test", reason=reason)


def submit(agent, key: str) -> Effect:
    response = agent.submit(TICKET, key)
    assert response.status_code == 201, response.content
    return Effect.objects.get(pk=response.json()["effect_id"])


def test_events_are_written_unsealed_and_sealed_in_order_by_the_sequencer(agent, capsys):
    first, second = submit(agent, "t1"), submit(agent, "t2")
    tenant = first.tenant_id
    unsealed = EffectEvent.objects.filter(tenant_id=tenant, position__isnull=True)
    assert unsealed.filter(effect__in=[first, second]).count() == 2
    assert set(unsealed.values_list("hash", flat=True)) == {""}
    sealed = audit.seal_pending()
    assert sealed >= 2
    assert not EffectEvent.objects.filter(position__isnull=True).exists()
    rows = list(
        EffectEvent.objects.filter(tenant_id=tenant)
        .order_by("position")
        .values_list("position", "prev_hash", "hash", "sealed_at")
    )
    assert [row[0] for row in rows] == list(range(1, len(rows) + 1))
    assert rows[0][1] == audit.GENESIS
    assert all(later[1] == earlier[2] for earlier, later in pairwise(rows))
    assert all(row[3] is not None for row in rows)
    head = AuditChainHead.objects.get(tenant_id=tenant)
    assert (head.length, head.last_hash) == (len(rows), rows[-1][2])
    assert audit.verify_tenant(tenant) is None
    assert audit.seal_pending() == 0  # nothing left


def test_verify_audit_reports_the_sealed_head_and_the_lag(agent, capsys):
    submit(agent, "t1")
    call_command("verify_audit", "--no-seal")
    out = capsys.readouterr().out
    assert "acme: sealed head at 0" in out and "unsealed, sealing lag" in out
    assert EffectEvent.objects.filter(position__isnull=True).exists()  # --no-seal wrote nothing
    call_command("verify_audit")
    call_command("verify_audit")
    out = capsys.readouterr().out
    assert "acme: chain intact" in out and " 0 unsealed, sealing lag 0.000s" in out


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
    assert not EffectEvent.objects.filter(tenant_id=ours.tenant_id, position=None).exists()
    assert EffectEvent.objects.filter(tenant_id=theirs.tenant_id, position=None).exists()


def test_the_beat_task_seals(agent, eager_tasks):
    from gateway.tasks import seal_audit

    effect = submit(agent, "t1")
    seal_audit.delay()
    assert not EffectEvent.objects.filter(effect=effect, position=None).exists()


def test_removing_a_sealed_event_in_the_middle_is_reported(agent, capsys):
    effect = submit(agent, "t1")
    for index in range(3):
        note(effect, f"n{index}")
    audit.seal_pending()
    middle = EffectEvent.objects.filter(effect=effect).order_by("position")[1]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET session_replication_role = replica")
        cursor.execute("DELETE FROM gateway_effectevent WHERE id = %s", [middle.pk])
        if connection.vendor == "postgresql":
            cursor.execute("SET session_replication_role = DEFAULT")
    with pytest.raises(CommandError):
        call_command("verify_audit")
    assert "BROKEN" in capsys.readouterr().out


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE gateway_effectevent SET reason = 'nothing happened' WHERE id = %s",
        "UPDATE gateway_effectevent SET hash = repeat('0', 64) WHERE id = %s",
        "UPDATE gateway_effectevent SET position = position + 100 WHERE id = %s",
        "UPDATE gateway_effectevent SET sealed_at = now() WHERE id = %s",
        "DELETE FROM gateway_effectevent WHERE id = %s",
    ],
)
def test_a_sealed_event_cannot_be_changed_or_resealed(agent, statement):
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
        "UPDATE gateway_effectevent SET reason = 'x', position = 999 WHERE id = %s",
        "DELETE FROM gateway_effectevent WHERE id = %s",
    ],
)
def test_an_unsealed_event_is_protected_by_the_trigger(agent, statement):
    event = EffectEvent.objects.filter(effect=submit(agent, "t1")).get()
    assert event.position is None
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
    order = list(
        EffectEvent.objects.filter(pk__in=[late.pk, early[0]])
        .order_by("position")
        .values_list("pk", flat=True)
    )
    assert order == [late.pk, early[0]]
    assert audit.verify_tenant(effect.tenant_id) is None
    lag = EffectEvent.objects.get(pk=late.pk)
    assert lag.sealed_at >= lag.created_at
    assert lag.sealed_at <= timezone.now()
