"""The reconciler against the real sandbox provider: every uncertain outcome is settled by a
lookup first, and the sandbox's operation log proves nothing was sent twice."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import timedelta

import pytest
from django.utils import timezone

from gateway import hooks
from gateway.contracts import CONTRACTS
from gateway.models import Effect, EffectEvent, Receipt
from reconciliation import services
from reconciliation.choices import CaseReason, CaseState, LookupBy, RecordOutcome
from reconciliation.models import Case, ReconciliationRecord
from tests.reconciliation.conftest import fresh, lookups, make_due, operations, sends

pytestmark = pytest.mark.django_db


def spy_on_mismatch(monkeypatch, hooked: list[str]) -> None:
    """Replace the listeners of hooks.mismatch_found (sagas' freeze) by a spy."""
    spy: hooks.Registry[hooks.MismatchFound] = hooks.Registry("mismatch_found")
    spy.register(lambda effect, *, actor, reason: hooked.append(effect.pk))
    monkeypatch.setattr(hooks, "mismatch_found", spy)


def records(effect: Effect) -> list[ReconciliationRecord]:
    return list(ReconciliationRecord.objects.filter(effect_id=effect.pk).order_by("id"))


def test_commit_then_drop_is_confirmed_by_lookup_without_a_resend(recon_unknown, recon_sandbox):
    effect = recon_unknown()
    assert effect.next_check_at is not None
    make_due(effect)

    assert services.reconcile_next_batch() == 1

    effect = fresh(effect)
    assert effect.status == "CONFIRMED"
    assert effect.confirmed_at is not None
    assert effect.next_check_at is None
    ops = operations(recon_sandbox, effect)
    assert len(ops) == 1
    assert len(sends(recon_sandbox, effect)) == 1
    assert effect.provider_operation_id == ops[0]["id"]
    receipt = Receipt.objects.get(effect=effect)
    assert receipt.source == Receipt.Source.RECONCILER
    assert receipt.digest_matches is True
    assert receipt.provider_operation_id == ops[0]["id"]
    [record] = records(effect)
    assert record.lookup_by == LookupBy.IDEMPOTENCY_KEY
    assert record.lookup_status == "found"
    assert record.outcome == RecordOutcome.CONFIRMED
    assert record.provider_digest == effect.command.payload_digest
    event = EffectEvent.objects.filter(effect=effect).latest("id")
    assert (event.from_status, event.to_status, event.actor) == (
        "UNKNOWN",
        "CONFIRMED",
        "reconciler",
    )


def test_an_effect_not_yet_due_is_not_looked_up(recon_unknown, recon_sandbox):
    effect = recon_unknown()
    Effect.objects.filter(pk=effect.pk).update(next_check_at=timezone.now() + timedelta(minutes=1))

    assert services.reconcile_next_batch() == 0
    assert fresh(effect).status == "UNKNOWN"
    assert lookups(recon_sandbox, effect) == []


def test_not_found_by_key_redispatches_with_the_original_key(
    recon_submit, recon_dispatch, recon_sandbox, recon_enqueued
):
    # The provider refuses before committing and the dispatcher's own lookup cannot reach
    # it: UNKNOWN, although the provider never received the command.
    recon_sandbox.add_fault("fail_before_commit", times=1)
    recon_sandbox.add_fault("lookup_unreachable", times=1)
    effect = recon_dispatch(recon_submit())
    assert effect.status == "UNKNOWN"
    assert operations(recon_sandbox, effect) == []
    make_due(effect)
    recon_enqueued.clear()

    services.reconcile_next_batch()

    effect = fresh(effect)
    assert effect.status == "NOT_STARTED"
    assert effect.next_dispatch_at is not None and effect.next_dispatch_at <= timezone.now()
    assert effect.next_check_at is None
    assert recon_enqueued == [effect.pk]
    assert records(effect)[-1].outcome == RecordOutcome.NOT_STARTED
    assert operations(recon_sandbox, effect) == []  # the lookup itself sent nothing

    effect = recon_dispatch(effect)

    assert effect.status == "CONFIRMED"
    assert effect.attempt_count == 2
    ops = operations(recon_sandbox, effect)
    assert len(ops) == 1
    assert ops[0]["idempotency_key"] == effect.command.provider_key
    # One refused POST, one committed POST, nothing else.
    assert [entry["action"] for entry in sends(recon_sandbox, effect)] == ["fault", "commit"]


def test_unreachable_lookups_back_off_then_escalate_without_a_resend(
    recon_unknown, recon_sandbox, recon_enqueued
):
    effect = recon_unknown()
    recon_sandbox.add_fault("lookup_unreachable", times=None)
    recon_enqueued.clear()
    budget = 8  # RecoveryPolicy.reconcile_budget of ticket.create

    for number in range(1, budget):
        make_due(effect)
        before = timezone.now()
        assert services.reconcile_next_batch() == 1
        effect = fresh(effect)
        assert effect.status == "UNKNOWN"
        assert effect.check_count == number
        assert not effect.escalated
        ceiling = min(300.0, 5 * 2 ** (number - 1))
        wait = (effect.next_check_at - before).total_seconds()
        assert ceiling / 2 - 1 <= wait <= ceiling + 1, (number, wait)

    make_due(effect)
    services.reconcile_next_batch()

    effect = fresh(effect)
    assert effect.status == "UNKNOWN"
    assert effect.escalated is True
    assert effect.next_check_at is None
    assert effect.check_count == budget
    case = Case.objects.get(effect=effect)
    assert case.reason == CaseReason.LOOKUP_BUDGET_EXHAUSTED
    assert case.state == CaseState.OPEN
    assert case.owner == "support-tools"
    outcomes = [record.outcome for record in records(effect)]
    assert outcomes == [RecordOutcome.INCONCLUSIVE] * (budget - 1) + [RecordOutcome.ESCALATED]
    assert len(lookups(recon_sandbox, effect)) == budget
    # Escalated means nobody asks or sends again by itself.
    assert services.reconcile_next_batch() == 0
    assert len(sends(recon_sandbox, effect)) == 1
    assert len(operations(recon_sandbox, effect)) == 1
    assert recon_enqueued == []


def test_digest_mismatch_found_by_lookup_opens_a_case_and_never_confirms(
    recon_unknown, recon_sandbox, recon_enqueued, monkeypatch
):
    hooked: list[str] = []
    spy_on_mismatch(monkeypatch, hooked)
    effect = recon_unknown(digest_mismatch={})
    assert effect.mismatch is False  # the answer was lost: nobody has seen the digest yet
    make_due(effect)
    recon_enqueued.clear()

    services.reconcile_next_batch()

    effect = fresh(effect)
    assert effect.status == "UNKNOWN"
    assert effect.mismatch is True
    assert effect.next_check_at is None
    assert effect.confirmed_at is None
    assert hooked == [effect.pk]
    case = Case.objects.get(effect=effect)
    assert case.reason == CaseReason.MISMATCH
    receipt = Receipt.objects.get(effect=effect)
    assert receipt.digest_matches is False
    assert records(effect)[-1].outcome == RecordOutcome.MISMATCH
    assert recon_enqueued == []
    assert len(sends(recon_sandbox, effect)) == 1
    # Not due any more: the reconciler does not keep asking, and never re-sends.
    assert services.reconcile_next_batch() == 0
    assert len(lookups(recon_sandbox, effect)) == 1


def test_mismatch_found_at_dispatch_is_queued_for_the_owner_by_the_sweep(
    recon_submit, recon_dispatch, recon_sandbox, monkeypatch
):
    hooked: list[str] = []
    spy_on_mismatch(monkeypatch, hooked)
    recon_sandbox.add_fault("digest_mismatch", times=1)
    effect = recon_dispatch(recon_submit())
    assert (effect.status, effect.mismatch) == ("UNKNOWN", True)
    assert not Case.objects.filter(effect=effect).exists()

    services.reconcile_due(time_budget=5)
    services.reconcile_due(time_budget=5)  # a second sweep opens no second case

    [case] = Case.objects.filter(effect=effect)
    assert case.reason == CaseReason.MISMATCH
    assert hooked == [effect.pk]
    assert fresh(effect).status == "UNKNOWN"
    assert len(sends(recon_sandbox, effect)) == 1


@pytest.mark.parametrize("lost_answer", [False, True], ids=["accepted", "answer-lost"])
def test_processing_for_n_lookups_then_confirmed(
    lost_answer, recon_submit, recon_dispatch, recon_sandbox
):
    n = 3
    recon_sandbox.add_fault("processing", times=1, lookups=n)
    if lost_answer:
        recon_sandbox.add_fault("commit_then_drop", times=1)
    effect = recon_dispatch(recon_submit())
    assert effect.status == ("UNKNOWN" if lost_answer else "IN_PROGRESS")

    for number in range(1, n + 1):
        make_due(effect)
        services.reconcile_next_batch()
        effect = fresh(effect)
        assert effect.status == "IN_PROGRESS", number
        assert effect.check_count == number
        assert effect.next_check_at > timezone.now()

    make_due(effect)
    services.reconcile_next_batch()

    effect = fresh(effect)
    assert effect.status == "CONFIRMED"
    assert [r.outcome for r in records(effect)] == [RecordOutcome.IN_PROGRESS] * n + [
        RecordOutcome.CONFIRMED
    ]
    # Once the provider gave an operation id, later lookups use it.
    by = [r.lookup_by for r in records(effect)]
    assert by[-1] == LookupBy.PROVIDER_OPERATION_ID
    assert len(operations(recon_sandbox, effect)) == 1
    assert len(sends(recon_sandbox, effect)) == 1


def test_provider_failure_found_by_lookup_is_rejected(recon_unknown, recon_sandbox):
    effect = recon_unknown(fail={})
    make_due(effect)

    services.reconcile_next_batch()

    effect = fresh(effect)
    assert effect.status == "REJECTED"
    assert Receipt.objects.get(effect=effect).provider_status == "failed"
    assert records(effect)[-1].outcome == RecordOutcome.REJECTED


def test_not_found_past_the_key_retention_escalates(
    recon_submit, recon_dispatch, recon_sandbox, recon_enqueued, monkeypatch
):
    recon_sandbox.add_fault("fail_before_commit", times=1)
    recon_sandbox.add_fault("lookup_unreachable", times=1)
    effect = recon_dispatch(recon_submit())
    assert effect.status == "UNKNOWN"
    # A provider that forgets keys at once: "not found" can no longer prove anything.
    # (Commands are frozen, so the command cannot be aged instead.)
    contract = CONTRACTS[effect.type]
    forgetful = replace(contract.recovery, key_retention=timedelta(0))
    monkeypatch.setitem(CONTRACTS, effect.type, replace(contract, recovery=forgetful))
    make_due(effect)
    recon_enqueued.clear()

    services.reconcile_next_batch()

    effect = fresh(effect)
    assert effect.status == "UNKNOWN"
    assert effect.escalated is True
    assert Case.objects.get(effect=effect).reason == CaseReason.NOT_FOUND_PAST_RETENTION
    assert recon_enqueued == []
    assert len(sends(recon_sandbox, effect)) == 1


@pytest.mark.parametrize(
    "lookup", [LookupBy.PROVIDER_OPERATION_ID, LookupBy.IDEMPOTENCY_KEY], ids=["by-id", "by-key"]
)
def test_operation_missing_for_an_in_progress_effect_is_a_contradiction(
    lookup, recon_submit, recon_dispatch, recon_sandbox, recon_enqueued, monkeypatch
):
    recon_sandbox.add_fault("processing", times=1, lookups=5)
    effect = recon_dispatch(recon_submit())
    assert effect.status == "IN_PROGRESS" and effect.provider_operation_id
    if lookup == LookupBy.IDEMPOTENCY_KEY:  # a provider that can only be asked by key
        contract = CONTRACTS[effect.type]
        monkeypatch.setitem(CONTRACTS, effect.type, replace(contract, lookup=(lookup,)))
    recon_sandbox.reset()  # the provider loses its record
    make_due(effect)
    recon_enqueued.clear()

    services.reconcile_next_batch()

    effect = fresh(effect)
    assert effect.status == "IN_PROGRESS"
    assert effect.escalated is True
    assert Case.objects.get(effect=effect).reason == CaseReason.CONTRADICTION
    assert records(effect)[-1].lookup_by == lookup
    assert records(effect)[-1].lookup_status == "not_found"
    assert recon_enqueued == []  # never re-sent on a "not found" that contradicts the ledger


def test_a_poison_row_is_pushed_forward_and_does_not_stop_the_batch(recon_unknown, recon_sandbox):
    poison = recon_unknown()
    healthy = recon_unknown()
    # An effect whose type has no contract any more (a bad deploy): the lookup cannot run.
    Effect.objects.filter(pk=poison.pk).update(type="ghost.type")
    make_due(poison)
    make_due(healthy)

    assert services.reconcile_next_batch() == 2

    poison = fresh(poison)
    assert poison.status == "UNKNOWN"
    assert poison.next_check_at >= timezone.now() + timedelta(minutes=4)
    assert fresh(healthy).status == "CONFIRMED"
    assert services.reconcile_next_batch() == 0


def test_an_effect_settled_while_being_looked_up_is_not_overwritten(recon_unknown, recon_sandbox):
    effect = recon_unknown()
    read = fresh(effect)
    Effect.objects.filter(pk=effect.pk).update(check_count=read.check_count + 1)

    record = services._apply(
        read,
        services.Verdict(RecordOutcome.INCONCLUSIVE, "test", fields={"check_count": 1}),
        lookup_by=LookupBy.IDEMPOTENCY_KEY,
        lookup=services.LookupResult("unreachable"),
        actor="reconciler",
        who=None,
    )

    assert record.outcome == RecordOutcome.SUPERSEDED
    assert fresh(effect).check_count == read.check_count + 1


def test_reconcile_due_runs_lease_recovery_and_lookups_in_one_sweep(recon_submit, recon_sandbox):
    from gateway import services as ledger

    effect = recon_submit()
    claim = ledger.effect_claim(effect_id=effect.pk, worker="ghost")
    assert claim is not None
    Effect.objects.filter(pk=effect.pk).update(lease_expires_at=timezone.now() - timedelta(1))

    work = services.reconcile_due(time_budget=10)

    effect = fresh(effect)
    # The worker died before sending: the lookup finds nothing, so it is sent again.
    assert effect.status == "NOT_STARTED"
    assert work >= 2
    assert operations(recon_sandbox, effect) == []


def test_a_batch_past_its_deadline_hands_its_claims_back(recon_unknown, recon_sandbox):
    effects = [recon_unknown(), recon_unknown()]
    for effect in effects:
        make_due(effect)

    assert services.reconcile_next_batch(limit=10, deadline=time.monotonic() - 1) == 2

    for effect in effects:
        effect = fresh(effect)
        assert effect.status == "UNKNOWN"
        assert effect.next_check_at <= timezone.now()  # due again, not hidden for the hold
        assert lookups(recon_sandbox, effect) == []
