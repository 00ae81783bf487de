"""The broker's Redis (``CELERY_BROKER_URL``), for the small commands that run on the hot path:
the dispatch due flag (gateway.dispatcher) and the news that an effect moved (gateway.moves).

``run`` sends one command packed once (``pack``) on a connection of the calling thread's own:
redis-py's client spends about 75 µs of CPU on a command (its pool, retries and events), a
connection of one's own with the command packed once about 30 (the round trip's system calls).
"""

from __future__ import annotations

import os
import threading
from functools import cache
from typing import Any

import redis
from django.conf import settings


@cache
def client() -> redis.Redis:
    """This process's client of the broker's Redis (its connection pool starts over after a
    fork). Short timeouts: a submission must not hang on a broker that is down."""
    return redis.Redis.from_url(url(), socket_timeout=2, socket_connect_timeout=2)


def url() -> str:
    url = settings.CELERY_BROKER_URL
    if url.startswith("redis+socket://"):  # kombu's spelling of a unix socket
        url = "unix://" + url.removeprefix("redis+socket://")
    return url


def pack(*args: Any) -> list[bytes]:
    """``args`` as the wire has them, for ``run``: pack once what is sent often."""
    return _packer().pack_command(*args)


@cache
def _packer() -> Any:
    """A connection object that never connects, for its encoder: the pool makes at most 100
    (redis-py 8), so one per packed command would run out."""
    return redis.Connection()


class _Connection(threading.local):
    """This thread's own connection to the broker's Redis."""

    owner: tuple[int, int] = (0, 0)  # (process, client) it was made for
    connection: Any = None


_connection = _Connection()


def run(packed: list[bytes], retry: bool = True) -> Any:
    """One packed command on this thread's connection; its reply (an error reply raised). A
    connection that broke (Redis restarted) is replaced once, then the error is raised: the
    callers' answer to a broker that is down (the sweeper sends what is due)."""
    redis_client = client()
    owner = (os.getpid(), id(redis_client))  # a forked child, or a client swapped by a test
    if _connection.owner != owner or _connection.connection is None:
        _connection.owner = owner
        _connection.connection = redis_client.connection_pool.make_connection()
    connection = _connection.connection
    try:
        connection.send_packed_command(packed, check_health=False)
        return connection.read_response()
    except (redis.ConnectionError, redis.TimeoutError):
        connection.disconnect()
        if not retry:
            raise
        return run(packed, retry=False)
    except redis.ResponseError:
        raise  # an error reply, read in full: the connection is still in step
    except BaseException:
        # Anything else may leave a reply unread on the socket, to be read later as the
        # answer to another command: start the next one on a new connection.
        connection.disconnect()
        raise
