"""Deadlines in Redis: how a writer wakes the reconciler's waker when it sets a due time
earlier than the one the waker sleeps until.

The ledger holds the due times: an UNKNOWN or IN_PROGRESS effect's ``next_check_at`` (its
next lookup on the backoff schedule), a DISPATCHING claim's ``lease_expires_at``, and the
``expires_at`` of a command waiting for an approver (reconciliation.services.expiry). A waker
(``reconciliation.waker``, threads of the worker processes) sleeps until the earliest of them,
at most ``GATEWAY_WAKER_MAX_SLEEP`` seconds, on a list of wake-ups in the broker's Redis
(``BLPOP``: each wake-up wakes one waker). Before it sleeps it writes its target (the time it
will wake) to a key that expires at that time, so the key stands exactly while a waker is
asleep with that target.

**A writer** that commits a due time ``at`` earlier than ``now + GATEWAY_WAKER_MAX_SLEEP``
(anything later is seen by the waker's next look anyway) runs one script after its commit
(``soon``): if no target stands, or the target is later than ``at``, it sets the target to
``at`` and pushes one wake-up. A burst of writes before the same target pushes one wake-up.

**Why no deadline is missed for longer than the cap.** A waker reads the earliest due time,
then writes its target, then blocks. A write committed before the read is in the read. A
write committed after it finds either no target (the previous one expired when that waker
woke), or the new target: if the write is earlier it pushes a wake-up, which the waker pops at
once (before or during its block); if not, the waker wakes at its target, before the write is
due, and reads it. Only a lost wake-up (Redis down or restarted) or a target left by a waker
that died is not covered: the cap bounds both, and the sweeps (beat) stay as a safety net.

A writer never fails for Redis: a failed script is logged once a minute, and for ``REST``
seconds after a failure nothing is tried (a broker that does not answer must not hold every
commit of the process).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from datetime import datetime, timedelta
from functools import cache
from typing import Any

import redis
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from gateway.lib import broker

logger = logging.getLogger(__name__)

# Set the target to ARGV[1] (epoch ms) for ARGV[2] ms, and push a wake-up, unless a target at
# or before ARGV[1] stands. The list keeps a few wake-ups (more than wakers mean nothing) and
# expires when nobody pops it.
_EARLIER = """
local target = redis.call('GET', KEYS[1])
if target and tonumber(target) <= tonumber(ARGV[1]) then
    return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('LTRIM', KEYS[2], -16, -1)
redis.call('PEXPIRE', KEYS[2], 60000)
return 1
"""
REST = 5.0  # seconds without a try after the script failed
WARN_EVERY = 60.0


def key() -> str:
    """The waker's target, one per ledger (database): gateways sharing a Redis stay apart."""
    return f"gateway:deadlines:{settings.DATABASES['default']['NAME']}"


def wake_key() -> str:
    return f"{key()}:wake"


@cache
def _script_of(client: redis.Redis) -> Any:
    return client.register_script(_EARLIER)


def _script() -> Any:
    """The script on this process's broker client (a new one after a fork, or when a test
    points the broker elsewhere)."""
    return _script_of(broker.client())


class _Failures:
    """When the script last failed (monotonic), and when that was last logged."""

    failed_at = -REST
    warned_at = -WARN_EVERY


_failures = _Failures()


def _epoch_ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def announce(at: datetime) -> bool:
    """Wake a waker if ``at`` is earlier than the target it sleeps until (or none sleeps).
    True if a wake-up was pushed. Never raises."""
    if time.monotonic() - _failures.failed_at < REST:
        return False
    target = _epoch_ms(at)
    ttl = max(1, target - int(time.time() * 1000))
    try:
        return bool(_script()(keys=[key(), wake_key()], args=[target, ttl]))
    except redis.RedisError as exc:
        now = time.monotonic()
        _failures.failed_at = now
        if now - _failures.warned_at >= WARN_EVERY:
            _failures.warned_at = now
            logger.warning(
                "cannot wake the reconciler's waker: it looks within GATEWAY_WAKER_MAX_SLEEP",
                extra={"error": str(exc)},
            )
        return False


def soon(at: datetime | None) -> None:
    """After the current transaction commits (at once in autocommit), ``announce`` a due
    time the writer set, if it falls before the waker's next look at the latest; a later one
    costs nothing."""
    if at is None:
        return
    if (at - timezone.now()).total_seconds() >= settings.GATEWAY_WAKER_MAX_SLEEP:
        return
    transaction.on_commit(lambda: announce(at))


def soonest(times: Iterable[Any]) -> None:
    """``soon`` for the earliest of several due times (a batch's records; None and
    expressions are no due time)."""
    due = [at for at in times if isinstance(at, datetime)]
    if due:
        soon(min(due))


def lease_soon(now: datetime) -> None:
    """``soon`` for a claim's lease, when leases are shorter than the waker's longest sleep
    (a test's, or a very short ``GATEWAY_DISPATCH_LEASE``): for the default lease, nothing."""
    lease = settings.GATEWAY_DISPATCH_LEASE
    if lease < settings.GATEWAY_WAKER_MAX_SLEEP:
        soon(now + timedelta(seconds=lease))


def arm(client: redis.Redis, target: float) -> None:
    """Say that a waker sleeps until ``target`` (epoch seconds): the key stands until then."""
    ttl = max(1, int((target - time.time()) * 1000))
    client.set(key(), int(target * 1000), px=ttl)


def wait(client: redis.Redis, seconds: float) -> bool:
    """Block on ``client`` (a connection of the waker's own) until a wake-up is popped or
    ``seconds`` pass; True if woken."""
    # BLPOP takes fractions of a second; 0 would block for ever.
    return client.blpop([wake_key()], timeout=max(seconds, 0.01)) is not None
