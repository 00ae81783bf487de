"""The waker: lease recovery, the reconciler's lookups and the expiry of commands waiting for
an approver (an approval's deadline, a saga step's) at their deadlines, not at the next sweep.

Each worker process runs ``GATEWAY_WAKERS`` waker threads, started as the drainers are (in
the worker's process for the thread and solo pools, in each child for prefork; the signal
receivers below). A waker reads the earliest due time of its three queues in one statement
(``selectors.effects_next_due``: the first entries of the partial indexes effect_reconcile_due
and effect_lease_due, and the first command waiting for an approver to expire). When one is
due it acts — ``effects_recover_expired_leases`` for a lease, ``reconcile_next_batch`` for a
lookup, ``effects_expire_awaiting_approval`` for an expiry, each taking due rows with
``SKIP LOCKED`` or a compare-and-set — and reads again, until nothing is due. Then it sleeps
until the earliest due time, at most ``GATEWAY_WAKER_MAX_SLEEP`` seconds, blocked on the
wake-up list of ``gateway.deadlines``: a writer that sets a due time earlier than the waker's
target pushes a wake-up, and ``BLPOP`` hands each wake-up to one waker.

Why threads and not a task that re-arms itself: a task per due time would be an ETA message
(the broker holds it in the worker's memory, unacknowledged, for as long as it waits, and a
lost one stops the chain), and a pool slot would be held or the timing left to the broker's
delivery. A thread blocks on Redis for free, needs no message, and dies and restarts with its
process; the beat sweeps (``reconcile_due``, ``recover_leases``) stay as the safety net.

Several wakers (threads, processes, hosts) share the work as the sweeps did: the claim skips
locked rows and pushes the claimed ones' ``next_check_at`` forward, and lease recovery is a
compare-and-set on status and fence. A waker that finds due rows but takes none (another
waker is claiming them) pauses a moment instead of asking again at once; a poison row is
pushed ``POISON_DELAY`` forward by the reconciler, so it is no longer due.
"""

from __future__ import annotations

import logging
import os
import random
import time
from datetime import datetime

import redis
from celery.signals import (
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)
from django.conf import settings
from django.utils import timezone

from gateway import deadlines
from gateway.lib import broker
from gateway.lib.service_threads import ServiceThreads
from reconciliation import selectors
from reconciliation.services import effects_recover_expired_leases, reconcile_next_batch
from reconciliation.services.expiry import effects_expire_awaiting_approval

logger = logging.getLogger(__name__)

BATCH = 8  # lookups claimed at a time: other wakers take the next due rows meanwhile
CONTENDED = (0.05, 0.25)  # the pause (s) after finding due rows and taking none
WAIT_SECONDS = 1.0  # the longest BLPOP before looking at ``stopping`` again
FAILURE_PAUSE_MAX = 5.0


class Wakers(ServiceThreads):
    """The waker threads of one process."""

    name = "waker"

    def _serve(self) -> None:
        from django.db import close_old_connections, connection

        client = redis.Redis.from_url(
            broker.url(), socket_timeout=WAIT_SECONDS + 5, socket_connect_timeout=2
        )
        failures = 0
        while not self.stopping.is_set():
            close_old_connections()
            try:
                seconds = act_on_due()
                failures = 0
            except Exception:
                # The database is down or a pass failed: no hot loop, and no connection
                # kept that may be broken.
                failures += 1
                logger.exception("the waker's pass failed", extra={"failures": failures})
                connection.close()
                self.stopping.wait(min(FAILURE_PAUSE_MAX, 0.5 * 2 ** (failures - 1)))
                continue
            if seconds <= 0:
                continue
            if seconds >= WAIT_SECONDS:
                # Idle for a while: give the database connection back, as the drainers do.
                connection.close()
            self._sleep(client, seconds)
        connection.close()
        client.close()

    def _sleep(self, client: redis.Redis, seconds: float) -> None:
        """Until ``seconds`` pass or a writer pushes a wake-up (``gateway.deadlines``). With
        Redis down, the whole time: the due times are read again after it."""
        target = time.time() + seconds
        try:
            deadlines.arm(client, target)
            while not self.stopping.is_set():
                left = target - time.time()
                if left <= 0 or deadlines.wait(client, min(left, WAIT_SECONDS)):
                    return
        except redis.RedisError:
            self.stopping.wait(max(0.0, target - time.time()))


def act_on_due() -> float:
    """One look at the due times: recover what leases ran out, look up what is due. Returns
    how long to sleep before the next look (0: at once, work was done)."""
    now = timezone.now()
    due = selectors.effects_next_due()
    idle = True
    if _is_due(due.lease, now):
        idle = effects_recover_expired_leases() == 0 and idle
    if _is_due(due.check, now):
        idle = reconcile_next_batch(limit=BATCH) == 0 and idle
    if _is_due(due.expiry, now):
        idle = effects_expire_awaiting_approval(limit=BATCH) == 0 and idle
    if not idle:
        return 0.0
    if any(_is_due(at, now) for at in due):
        # Due rows, none taken: another waker holds them, and its commit moves them on.
        return random.uniform(*CONTENDED)
    cap = settings.GATEWAY_WAKER_MAX_SLEEP
    times = [at for at in due if at is not None]
    if not times:
        return cap
    return max(0.0, min(cap, (min(times) - now).total_seconds()))


def _is_due(at: datetime | None, now: datetime) -> bool:
    return at is not None and at <= now


_wakers: tuple[int, Wakers] | None = None


# Started as the drainers are (gateway.celery): in the worker's own process for the thread and
# solo pools, in each child for prefork; in every worker, whatever its -Q, as every worker
# consumes the recovery queue. Connected when the app is ready (reconciliation.apps).
@worker_ready.connect
def _start_in_worker(sender, **kwargs) -> None:
    from gateway.celery import app, prefork_pool

    if not app.conf.task_always_eager and not prefork_pool(sender):
        start_wakers()


@worker_process_init.connect
def _start_in_child(**kwargs) -> None:
    from gateway.celery import app

    if not app.conf.task_always_eager:
        start_wakers()


@worker_shutdown.connect
@worker_process_shutdown.connect
def _stop_in_worker(**kwargs) -> None:
    stop_wakers()


def start_wakers() -> Wakers | None:
    """This process's waker threads (``GATEWAY_WAKERS``; 0: none). A forked child starts its
    own: a parent's threads do not exist in it."""
    global _wakers
    count = settings.GATEWAY_WAKERS
    if count <= 0:
        return None
    if _wakers is None or _wakers[0] != os.getpid():
        _wakers = (os.getpid(), Wakers(count).start())
        logger.info("wakers started", extra={"count": count, "pid": os.getpid()})
    return _wakers[1]


def stop_wakers() -> None:
    """Let this process's wakers finish the lookup they are in (up to the provider timeout
    and a little more), then return."""
    global _wakers
    if _wakers is not None and _wakers[0] == os.getpid():
        _wakers[1].stop(timeout=settings.GATEWAY_PROVIDER_TIMEOUT + 5)
    _wakers = None
