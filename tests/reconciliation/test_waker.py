"""The waker's parts in this process: the deadline signal in the broker's real Redis
(gateway.deadlines), one look at the due times (``act_on_due``) against the real sandbox, and
waker threads facing a poison row. The end-to-end timing, with real worker processes, is in
test_waker_worker.py."""

from __future__ import annotations

import logging
import resource
import time
from datetime import timedelta

import pytest
import redis
from django.utils import timezone

from gateway import deadlines, ledger
from gateway.lib import broker
from gateway.models import Effect
from reconciliation import waker
from reconciliation.models import ReconciliationRecord

pytestmark = pytest.mark.django_db(transaction=True)


def wake_ups(client: redis.Redis) -> int:
    return client.llen(deadlines.wake_key())


def test_a_due_time_before_the_wakers_target_wakes_exactly_one_waker(recon_signal):
    deadlines.arm(recon_signal, time.time() + 10)
    assert deadlines.announce(timezone.now() + timedelta(seconds=1))
    # The target is now that due time: a burst of later ones pushes nothing more.
    assert not deadlines.announce(timezone.now() + timedelta(seconds=2))
    assert wake_ups(recon_signal) == 1
    other = redis.Redis.from_url(broker.url(), socket_timeout=5)
    try:
        # Two wakers block: the one wake-up goes to one of them.
        assert deadlines.wait(recon_signal, 0.5)
        assert not deadlines.wait(other, 0.3)
    finally:
        other.close()


def test_a_due_time_after_the_wakers_target_costs_no_wake_up(recon_signal):
    deadlines.arm(recon_signal, time.time() + 2)
    assert not deadlines.announce(timezone.now() + timedelta(seconds=3))
    assert wake_ups(recon_signal) == 0


def test_a_target_that_passed_no_longer_stands(recon_signal):
    """The key expires when its waker wakes: a write then always pushes a wake-up, which the
    waker pops at its next block (the race between its read and its sleep)."""
    deadlines.arm(recon_signal, time.time() + 0.05)
    time.sleep(0.15)
    assert deadlines.announce(timezone.now() + timedelta(seconds=4))
    assert wake_ups(recon_signal) == 1


def test_a_write_through_the_ledger_wakes_the_waker_after_commit(
    recon_signal, recon_unknown, settings
):
    settings.GATEWAY_WAKER_MAX_SLEEP = 5
    effect = recon_unknown()
    recon_signal.delete(deadlines.key(), deadlines.wake_key())  # what the dispatch record pushed
    deadlines.arm(recon_signal, time.time() + 5)
    ledger.schedule_checks([effect.pk], timezone.now() + timedelta(seconds=10))
    assert wake_ups(recon_signal) == 0, "later than the waker's next look: nothing to say"
    ledger.schedule_checks([effect.pk], timezone.now() + timedelta(seconds=1))
    assert wake_ups(recon_signal) == 1


def test_a_broker_that_is_down_never_fails_the_writer(recon_signal, settings, recon_unknown):
    effect = recon_unknown()
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:9/0"  # nothing listens there
    broker.client.cache_clear()
    try:
        started = time.monotonic()
        assert ledger.schedule_checks([effect.pk], timezone.now()) == 1
        assert not deadlines.announce(timezone.now())  # resting after the failure
        assert time.monotonic() - started < 5
    finally:
        broker.client.cache_clear()
        deadlines._failures.failed_at = -deadlines.REST


def test_the_waker_sleeps_until_the_earliest_due_time_capped(recon_unknown, settings):
    settings.GATEWAY_WAKER_MAX_SLEEP = 5
    effect = recon_unknown()
    Effect.objects.filter(pk=effect.pk).update(next_check_at=timezone.now() + timedelta(seconds=2))
    sleep = waker.act_on_due()
    assert sleep > 1.0 and sleep <= 2.0, sleep  # until the due time, not the 5 s cap
    Effect.objects.filter(pk=effect.pk).update(next_check_at=timezone.now() + timedelta(hours=1))
    assert waker.act_on_due() == 5


def test_a_due_lookup_is_made_at_once_and_the_waker_then_sleeps(recon_unknown, recon_sandbox):
    effect = recon_unknown()
    Effect.objects.filter(pk=effect.pk).update(next_check_at=timezone.now())
    assert waker.act_on_due() == 0.0  # work done: look again at once
    assert Effect.objects.get(pk=effect.pk).status == "CONFIRMED"
    assert waker.act_on_due() > 0
    assert len(recon_sandbox.operations()) == 1


def test_an_expired_lease_is_recovered_then_looked_up(recon_submit, recon_sandbox):
    effect = recon_submit()
    past = timezone.now() - timedelta(seconds=1)
    Effect.objects.filter(pk=effect.pk).update(status="DISPATCHING", fence=1, lease_expires_at=past)
    assert waker.act_on_due() == 0.0
    assert Effect.objects.get(pk=effect.pk).status == "UNKNOWN"
    assert waker.act_on_due() == 0.0  # its lookup, due at once: never sent, so NOT_STARTED
    assert Effect.objects.get(pk=effect.pk).status == "NOT_STARTED"
    assert recon_sandbox.operations() == []


def test_a_poison_row_does_not_make_the_waker_spin(recon_unknown, caplog, settings):
    """A row the reconciler cannot handle (here: its contract is gone) is pushed forward once;
    the waker threads then sleep, they do not retry it in a loop."""
    settings.GATEWAY_WAKER_MAX_SLEEP = 0.5
    effect = recon_unknown()
    Effect.objects.filter(pk=effect.pk).update(type="gone.contract", next_check_at=timezone.now())
    caplog.set_level(logging.ERROR, logger="reconciliation.services")
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    threads = waker.Wakers(2).start()
    try:
        time.sleep(3)
    finally:
        threads.stop(timeout=5)
    used = resource.getrusage(resource.RUSAGE_SELF)
    seconds = used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime
    print(f"two wakers for 3 s with a poison row: {seconds:.2f} s of CPU")
    failures = [r for r in caplog.records if r.getMessage() == "reconcile failed"]
    assert len(failures) == 1
    pushed = Effect.objects.get(pk=effect.pk).next_check_at
    assert pushed is not None and pushed > timezone.now() + timedelta(minutes=4)
    assert seconds < 1.5, f"{seconds:.2f} s of CPU in 3 s: the wakers spin"
    assert not ReconciliationRecord.objects.filter(effect_id=effect.pk).exists()
