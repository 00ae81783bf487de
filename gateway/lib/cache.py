"""The shared cache (``GATEWAY_CACHE_URL``), which never fails a request because Redis is down.

What the cache holds on the request path is advisory: per-token throttle state, long-poll slot
counts, login failure counts. Losing it for a while lets a token through at up to its rate per
web node instead of its rate in all; failing the request would turn a broker outage into
refused submissions, although the ledger (PostgreSQL) that decides them is up. So when Redis
does not answer, each web process counts on its own (a local-memory cache) and says so
(``degraded_since``, shown by ``/readyz``); it asks Redis again after ``RETRY_SECONDS``, and
goes back to the shared counts when Redis answers.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import redis
from django.core.cache.backends.base import DEFAULT_TIMEOUT
from django.core.cache.backends.locmem import LocMemCache
from django.core.cache.backends.redis import RedisCache

logger = logging.getLogger(__name__)


class DegradingRedisCache(RedisCache):
    """Django's Redis cache that falls back to per-process memory while Redis is down."""

    RETRY_SECONDS = 2.0

    def __init__(self, server: str, params: dict[str, Any]) -> None:
        options = dict(params.get("OPTIONS") or {})
        # A Redis host that drops packets must not hold a request for redis-py's default
        # (no timeout): a second at most, then the local counts answer.
        options.setdefault("socket_connect_timeout", 1)
        options.setdefault("socket_timeout", 1)
        super().__init__(server, {**params, "OPTIONS": options})
        self._local = LocMemCache(f"degraded-{id(self)}", {})
        self._lock = threading.Lock()
        self._down_since: float | None = None  # wall-clock time of the first failure
        self._failed_at = 0.0  # monotonic time of the last failure: Redis rests after it

    @property
    def degraded_since(self) -> float | None:
        """When this process stopped reaching Redis (epoch seconds), or None."""
        return self._down_since

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self._down_since is not None and time.monotonic() < self._failed_at + self.RETRY_SECONDS:
            return getattr(self._local, name)(*args, **kwargs)
        try:
            result = getattr(super(), name)(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._went_down(exc)
            return getattr(self._local, name)(*args, **kwargs)
        if self._down_since is not None:
            self._came_back()
        return result

    def _went_down(self, exc: Exception) -> None:
        with self._lock:
            self._failed_at = time.monotonic()
            if self._down_since is None:
                self._down_since = time.time()
                logger.warning(
                    "the shared cache is unreachable; counting in this process meanwhile",
                    extra={"error": f"{type(exc).__name__}: {exc}"},
                )

    def _came_back(self) -> None:
        with self._lock:
            if self._down_since is None:
                return
            seconds = round(time.time() - self._down_since)
            self._down_since = None
            self._local.clear()
        logger.warning("the shared cache answers again", extra={"seconds": seconds})

    def get(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        return self._call("get", key, default, version)

    def set(
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> None:
        self._call("set", key, value, timeout, version)

    def add(
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> bool:
        return bool(self._call("add", key, value, timeout, version))

    def incr(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        return int(self._call("incr", key, delta, version))

    def decr(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        return int(self._call("decr", key, delta, version))

    def delete(self, key: Any, version: int | None = None) -> bool:
        return bool(self._call("delete", key, version))

    def touch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        return bool(self._call("touch", key, timeout, version))

    def has_key(self, key: Any, version: int | None = None) -> bool:
        return bool(self._call("has_key", key, version))

    def get_many(self, keys: Any, version: int | None = None) -> dict[Any, Any]:
        return dict(self._call("get_many", keys, version))

    def set_many(
        self, data: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> list[Any]:
        return list(self._call("set_many", data, timeout, version) or [])

    def delete_many(self, keys: Any, version: int | None = None) -> None:
        self._call("delete_many", keys, version)

    def clear(self) -> None:
        self._call("clear")


def cache_state(cache: Any) -> str:
    """What ``/readyz`` says of a cache: shared and answering, degraded since when, or local."""
    if not isinstance(cache, RedisCache):
        return "local: per-process counters (GATEWAY_CACHE_URL unset)"
    since = getattr(cache, "degraded_since", None)
    if since is None:
        return "ok"
    stamp = time.strftime("%H:%M:%S", time.gmtime(since))
    return f"degraded: per-process counters since {stamp} UTC (Redis unreachable)"
