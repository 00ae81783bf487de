"""What a process trusts for a few seconds without asking the database again.

Two per-process caches with one time-to-live, ``GATEWAY_TOKEN_CACHE_TTL`` (5 s; 0 turns both
off): API tokens by their SHA-256 (with the principal and tenant), and an agent's live grants.
A revocation or a freeze is published (gateway.moves.distrust_everywhere) and forgotten by
every process that listens at once; one that misses the message (Redis down, the listener
reconnecting) forgets it within the TTL (docs/security.md). Dispatch re-reads the principal and
the grant at every claim, so nothing submitted in that window is sent by a frozen principal or
under a revoked grant.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

from django.conf import settings


class ShortTrust:
    """A small dict with a deadline per entry; cleared whole when it grows past its bound."""

    def __init__(self, name: str, *, max_entries: int = 10_000) -> None:
        self.name = name
        self.max_entries = max_entries
        self._entries: dict[Hashable, tuple[float, Any]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def ttl() -> float:
        return float(settings.GATEWAY_TOKEN_CACHE_TTL)

    def get(self, key: Hashable) -> Any | None:
        if self.ttl() <= 0:
            return None
        entry = self._entries.get(key)
        if entry is None or entry[0] <= time.monotonic():
            return None
        return entry[1]

    def put(self, key: Hashable, value: Any) -> None:
        ttl = self.ttl()
        if ttl <= 0:
            return
        # What this process trusts, it must hear revocations of: the listener (one thread
        # per process, gateway.moves) forgets them when they are published.
        from gateway import moves

        moves.listener.start()
        with self._lock:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[key] = (time.monotonic() + ttl, value)

    def forget(self, key: Hashable) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def forget_where(self, predicate: Callable[[Any], bool]) -> None:
        with self._lock:
            for key in [k for k, (_, value) in self._entries.items() if predicate(value)]:
                del self._entries[key]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


# token hash -> ApiToken (with principal and tenant loaded)
tokens = ShortTrust("tokens")
# principal id -> the principal's live grants, oldest first
grants = ShortTrust("grants")


def forget_principal(principal_id: int) -> None:
    """A principal was frozen (or its grants changed) through this process."""
    tokens.forget_where(lambda token: token.principal_id == principal_id)
    grants.forget(principal_id)


def clear() -> None:
    tokens.clear()
    grants.clear()
