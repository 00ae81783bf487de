"""News that effects changed status, for the long polls waiting on them (``?wait=``).

A long poll learnt of a change only by reading the status again: after 5, 15, 35 … ms, then
every half second. An agent waiting for an effect that its provider answers at once heard of
it up to twice as late as it happened, and every look cost the web a query.

Now whoever commits a status change publishes the effects' ids, comma-separated, on one
Redis channel of the broker (``channel()``): one message per statement, so a drainer's batch of
claims or of records is one message. In each web process one thread (``Listener``, started by
the first wait) is subscribed to it and wakes the requests waiting on those ids. Publishing
costs the writer one command of about 30 µs of CPU; nobody listening costs nothing more.

What publishes: every ``ledger.transition`` (after commit, ``hooks.after_transition``), and
the fast paths' statements that change a status without it (the claims and the records of
gateway.fastpath and gateway.fastpath_batch, at their call sites).

The database stays the only answer. A message only makes a wait read the status again; a
message that never arrives (Redis restarted, the listener reconnecting, a writer that could
not publish) costs a wait its fallback pause (``FALLBACK_PAUSE``), after which it reads the
status anyway. While the listener is not subscribed, waits poll as they did.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import redis
from django.conf import settings
from django.db import transaction

from gateway.hooks import fast_path_idle
from gateway.lib import broker

logger = logging.getLogger(__name__)

# While the listener is subscribed, a wait still reads the status this often: a change whose
# message was lost is seen this late at worst.
FALLBACK_PAUSE = 0.5
WARN_EVERY = 60.0  # seconds between two warnings that the listener cannot subscribe


def channel() -> str:
    """One channel per ledger (database): gateways that share a Redis do not wake each
    other's waits (which would cost a query, not a wrong answer)."""
    return f"gateway:moved:{settings.DATABASES['default']['NAME']}"


def trust_channel() -> str:
    """The channel of revocations and freezes: each message names what every process must
    stop trusting from its short cache (gateway.trust) now rather than at the end of its TTL."""
    return f"gateway:trust:{settings.DATABASES['default']['NAME']}"


def distrust_everywhere(*, token_hash: str = "", principal_id: int | None = None) -> None:
    """After commit, tell every listening process to forget a revoked token or a principal
    whose standing changed (frozen, grants changed). Never raises: a process that misses the
    message forgets at the end of ``GATEWAY_TOKEN_CACHE_TTL``."""
    message = f"token:{token_hash}" if token_hash else f"principal:{principal_id}"

    def send() -> None:
        try:
            broker.run(broker.pack("PUBLISH", trust_channel(), message))
        except redis.RedisError as exc:
            logger.warning(
                "cannot publish a revocation: other processes forget it within the token "
                "cache's TTL",
                extra={"error": str(exc)},
            )

    transaction.on_commit(send)


def _distrust(payload: bytes | str) -> None:
    """A message of ``trust_channel()``: forget what it names in this process."""
    from gateway import trust

    if isinstance(payload, bytes):
        payload = payload.decode()
    kind, _, key = payload.partition(":")
    if kind == "token":
        trust.tokens.forget(key)
    elif kind == "principal" and key.isdigit():
        trust.forget_principal(int(key))


# --- publishing -------------------------------------------------------------------------------


def published(effect_ids: Iterable[str]) -> None:
    """Tell the listening web processes that these effects changed status (committed).
    Never raises: a wait that misses the news reads the status after its fallback pause."""
    ids = ",".join(effect_ids)
    if not ids:
        return
    if _unpublished.resting():
        _unpublished.lost += 1
        return
    try:
        broker.run(broker.pack("PUBLISH", channel(), ids))
    except redis.RedisError as exc:
        _unpublished.failed(exc)
    else:
        _unpublished.worked()


class _Unpublished:
    """After a publish failed, the next ``REST`` seconds publish nothing: a broker that does
    not answer (a partition: every try waits out the socket's timeouts, twice) must not hold
    each claim and record of this process, and the waits meanwhile look for themselves. A
    line when publishing starts failing, one a minute while it fails (not one per status
    change), and one when it works again."""

    REST = 5.0

    def __init__(self) -> None:
        self.failing_since = 0.0
        self.failed_at = 0.0
        self.warned = 0.0
        self.lost = 0

    def resting(self) -> bool:
        return bool(self.failed_at) and time.monotonic() - self.failed_at < self.REST

    def failed(self, exc: Exception) -> None:
        now = time.monotonic()
        self.lost += 1
        self.failed_at = now
        if not self.failing_since:
            self.failing_since = now
        if now - self.warned >= WARN_EVERY:
            self.warned = now
            logger.warning(
                "cannot publish status changes: long polls hear of them by looking",
                extra={"error": str(exc), "lost": self.lost},
            )

    def worked(self) -> None:
        if self.failing_since:
            logger.warning("status changes are published again", extra={"lost": self.lost})
            self.failing_since, self.failed_at, self.warned, self.lost = 0.0, 0.0, 0.0, 0


_unpublished = _Unpublished()


def after_commit(effect_ids: Iterable[str]) -> None:
    """``published`` once the current transaction commits (at once in autocommit)."""
    ids = list(effect_ids)
    if ids:
        transaction.on_commit(lambda: published(ids))


@fast_path_idle(
    "the fast path's callers publish what its statements change (services._dispatch_fast, "
    "the drainer's claim and record)"
)
def after_transition(effect, *, from_status: str, to: str) -> None:
    """``hooks.after_transition``: every ``ledger.transition``, after its commit."""
    after_commit([effect.pk])


# --- listening ----------------------------------------------------------------------------------


class Listener:
    """One thread per process subscribed to ``channel()``; waits register the effect they wait
    on and block on an event that the thread sets when a message names it."""

    RETRY_SECONDS = 1.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[str, set[threading.Event]] = {}
        self._subscribed = threading.Event()
        self._started_in = 0  # the process that started the thread (a fork starts its own)

    @property
    def subscribed(self) -> bool:
        """Whether messages can arrive now: only then may a wait rely on them."""
        return self._subscribed.is_set() and self._started_in == os.getpid()

    def start(self) -> None:
        with self._lock:
            if self._started_in == os.getpid():
                return
            self._started_in = os.getpid()
            self._subscribed = threading.Event()
            self._waiting = {}
        threading.Thread(target=self._serve, name="moves-listener", daemon=True).start()

    @contextmanager
    def watching(self, effect_id: str) -> Iterator[threading.Event]:
        """An event set whenever a message names ``effect_id``, for the life of the block."""
        self.start()
        moved = threading.Event()
        with self._lock:
            self._waiting.setdefault(effect_id, set()).add(moved)
        try:
            yield moved
        finally:
            with self._lock:
                events = self._waiting.get(effect_id)
                if events is not None:
                    events.discard(moved)
                    if not events:
                        del self._waiting[effect_id]

    def wake(self, payload: bytes | str) -> int:
        """Set the events of the effects a message names; how many were waited on."""
        if isinstance(payload, bytes):
            payload = payload.decode()
        woken = 0
        with self._lock:
            for effect_id in payload.split(","):
                for moved in self._waiting.get(effect_id, ()):
                    moved.set()
                    woken += 1
        return woken

    def _serve(self) -> None:
        warned = -WARN_EVERY
        while True:
            try:
                self._listen()
            except Exception as exc:
                # A line when it happens and then one a minute, not one per retry.
                if time.monotonic() - warned >= WARN_EVERY:
                    warned = time.monotonic()
                    logger.warning(
                        "no news of status changes (Redis unreachable?): long polls poll",
                        extra={"error": str(exc)},
                    )
            self._subscribed.clear()
            self._wake_everyone()  # they read the status, and poll until it is back
            time.sleep(self.RETRY_SECONDS)

    def _listen(self) -> None:
        # A connection of its own that blocks for a message (a minute at most, so that a
        # connection that died quietly is noticed).
        client = redis.Redis.from_url(broker.url(), socket_timeout=60, socket_connect_timeout=2)
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            moved, distrusted = channel(), trust_channel()
            pubsub.subscribe(moved, distrusted)
            while True:
                message = pubsub.get_message(timeout=30)
                if pubsub.subscribed:
                    self._subscribed.set()
                if message is None or message["type"] != "message":
                    continue
                name = message["channel"]
                if (name.decode() if isinstance(name, bytes) else name) == distrusted:
                    _distrust(message["data"])
                else:
                    self.wake(message["data"])
        finally:
            pubsub.close()
            client.close()

    def _wake_everyone(self) -> None:
        with self._lock:
            for events in self._waiting.values():
                for moved in events:
                    moved.set()


listener = Listener()


@contextmanager
def news_of(effect_id: str | None) -> Iterator[threading.Event | None]:
    """``listener.watching(effect_id)``, or nothing (None) for a request that will not wait."""
    if effect_id is None:
        yield None
        return
    with listener.watching(effect_id) as moved:
        yield moved
