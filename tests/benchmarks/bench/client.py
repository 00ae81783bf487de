"""The product's client in the bench: ``count`` submissions over HTTP from ``concurrency``
threads, each with its own kept-alive connection.

It runs in a process of its own (``python -m tests.benchmarks.bench.client``, arguments and
result as JSON), as the floor does (tests.benchmarks.bench.floor): in the bench's process it
would share an interpreter lock with the sandbox provider, so the product's submissions and
the provider's answers to its workers would wait for each other there, and the floor's would
not.

It speaks HTTP/1.1 with the standard library's ``http.client``, not httpx: it stands for the
agents, which run on machines of their own in a deployment, and on the bench's two cores every
millisecond it spends is one the product does not get (the floor has no such client: its
threads are its own callers). httpx cost 1.3 ms of CPU per request here against 0.4 ms for
this; the process's CPU per submission is returned and printed beside the product's. The strict
floor calls the provider with the same client. No Django here.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit


class Connection:
    """One kept-alive connection to one base URL (``path`` is relative to it); reopened when
    the server closed it."""

    def __init__(self, base: str, timeout: float = 30) -> None:
        url = urlsplit(base)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 80
        self.prefix = url.path.rstrip("/")
        self.timeout = timeout
        self.conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: bytes, headers: dict) -> tuple[int, bytes]:
        for attempt in (1, 2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                self.conn.request(method, self.prefix + path, body=body, headers=headers)
                response = self.conn.getresponse()
                content = response.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                # A kept-alive connection the server closed while idle. Sending again is what
                # an agent does: the Idempotency-Key makes it one effect (a 200 replay).
                self.conn.close()
                self.conn = None
                if attempt == 2:
                    raise
                continue
            if response.will_close:
                self.conn.close()
                self.conn = None
            return response.status, content
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


class Oracle:
    """What tells a thread of the effect loop (``loop="effect"``) that its effect is CONFIRMED:
    one thread that reads the ledger for every effect waited on, every ``interval`` seconds, on
    a connection of its own.

    It stands for an agent's wait (``GET /api/v1/effects/{id}?wait=``) without that wait's cost
    or its pauses, as the floor's threads know their outcome when their UPDATE returns: the
    loop then compares what the product and the floor do with ``c`` effects in flight, not what
    the API's long poll costs. Its connection closes before the pass ends, so the benchmark does
    not count its backend as the product's."""

    QUERY = (
        "SELECT effect_id FROM gateway_effect WHERE effect_id = ANY(%s) AND status = 'CONFIRMED'"
    )

    def __init__(self, dsn: str, interval: float = 0.002) -> None:
        self.dsn = dsn
        self.interval = interval
        self.polls = 0
        self._waiting: set[str] = set()
        self._confirmed: set[str] = set()
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="oracle", daemon=True)

    def start(self) -> Oracle:
        self._thread.start()
        return self

    def wait(self, effect_id: str, timeout: float = 60) -> bool:
        """Until ``effect_id`` is CONFIRMED in the ledger (True) or ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        with self._changed:
            self._waiting.add(effect_id)
            while effect_id not in self._confirmed:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._waiting.discard(effect_id)
                    return False
                if not self._thread.is_alive():  # its connection failed: nobody will say
                    raise RuntimeError("the oracle stopped; see the client's stderr")
                self._changed.wait(min(left, 1))
            self._confirmed.discard(effect_id)
            return True

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        import psycopg  # the submission loop's client needs no database driver

        with psycopg.connect(self.dsn, autocommit=True, application_name="bench-oracle") as db:
            while not self._stop.is_set():
                with self._changed:
                    waited = list(self._waiting)
                if waited:
                    found = [row[0] for row in db.execute(self.QUERY, (waited,)).fetchall()]
                    self.polls += 1
                    if found:
                        with self._changed:
                            self._waiting.difference_update(found)
                            self._confirmed.update(found)
                            self._changed.notify_all()
                self._stop.wait(self.interval)


# The statuses that are not settled (gateway.choices.SETTLED, which this process does not
# import: it runs without Django); a wait ends at any other.
OPEN = frozenset(
    {
        "PREPARED", "AWAITING_APPROVAL", "NOT_STARTED", "DISPATCHING", "UNKNOWN", "IN_PROGRESS",
        "COMPENSATING",
    }
)  # fmt: skip


# What the clients send as ``until`` by default (GatewayClient.wait): the settled statuses.
SETTLED = "CANCELLED,COMPENSATED,COMPENSATION_FAILED,CONFIRMED,EXPIRED,REJECTED"


def wait_through_api(conn: Connection, token: str, effect_id: str, seen: str = "") -> str:
    """Until the effect has settled, as an agent waits with effect_gateway_client: long polls
    (``?wait=``) until settled that name the status seen, from ``seen`` (the submission's answer, as
    ``GatewayClient.wait(effect)`` starts), or after a first look when it is not given; a 429
    (too many long polls open) waits a second, as the client's retries do. Returns the status
    it settled in."""
    auth = {"Authorization": f"Bearer {token}"}
    path = f"/api/v1/effects/{effect_id}"
    query = f"?wait=5&seen={seen}&until={SETTLED}" if seen else ""
    if seen and seen not in OPEN:
        return seen
    while True:
        status, content = conn.request("GET", path + query, b"", auth)
        if status == 429:
            time.sleep(1)
            continue
        if status != 200:
            raise RuntimeError(f"GET {path}{query} answered {status}: {content[:200]!r}")
        seen = json.loads(content)["status"]
        if seen not in OPEN:
            return seen
        query = f"?wait=5&seen={seen}&until={SETTLED}"


def submit(conn: Connection, token: str, key: str, body: dict) -> tuple[int, bytes]:
    return conn.request(
        "POST",
        "/api/v1/commands",
        json.dumps(body).encode(),
        {
            "Authorization": f"Bearer {token}",
            "Idempotency-Key": key,
            "Content-Type": "application/json",
        },
    )


class _Pass:
    """One client pass: what :func:`run` sends, and what it notes of each submission."""

    def __init__(
        self, bases: list[str], tokens: list[str], body: dict, prefix: str, count: int,
        rate: float, loop: str, oracle: Oracle | None,
    ) -> None:  # fmt: skip
        self.bases, self.tokens, self.body, self.prefix = bases, tokens, body, prefix
        self.rate, self.loop, self.oracle = rate, loop, oracle
        self.local = threading.local()
        # (when it was due or sent, on this process's perf_counter; how long it took; the web
        # node it went to): one list, so that the three stay together whichever thread appends.
        self.timed: list[tuple[float, float, int]] = []
        self.wrong: list[int] = []
        self.late: list[int] = []
        self.ids: list[str | None] = [None] * count
        self.start = time.perf_counter() + 0.05  # every thread started before the first is due

    def _due(self, index: int) -> float:
        """When submission ``index`` counts from: its due time in an open loop (waiting for
        it, or noting it late), now in a closed one."""
        if self.rate <= 0:
            return time.perf_counter()
        due = self.start + index / self.rate
        wait = due - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        elif wait < -0.001:
            self.late.append(index)
        return due

    def one(self, index: int) -> None:
        conns = getattr(self.local, "conns", None)
        if conns is None:
            conns = self.local.conns = {base: Connection(base) for base in self.bases}
        started = self._due(index)
        node = index % len(self.bases)
        conn = conns[self.bases[node]]
        token = self.tokens[index % len(self.tokens)]
        status, content = submit(
            conn,
            token,
            f"{self.prefix}:{index}",
            {**self.body, "payload": {"title": f"bench {index}", "priority": "P4"}},
        )
        self.timed.append((started, time.perf_counter() - started, node))
        if status != 201:
            self.wrong.append(status)
            return
        answer = json.loads(content)
        self.ids[index] = effect_id = answer["effect_id"]
        if self.oracle is not None:
            self.oracle.wait(effect_id)
        if self.loop == "api":
            wait_through_api(conn, token, effect_id, answer["status"])

    def result(self, started_at: float, wall: float, cpu: float, count: int) -> dict:
        """What the bench reads: ids, latencies, their spans on the wall clock, CPU per
        submission; ``wall`` turns this process's perf_counter into the wall clock."""
        return {
            "polls": self.oracle.polls if self.oracle is not None else 0,
            "started_at": started_at,
            "ids": [effect_id for effect_id in self.ids if effect_id],
            "submit": [latency for _, latency, _ in self.timed],
            "nodes": [node for _, _, node in self.timed],  # the web node each went to, in order
            # Each submission's span on the wall clock: what the bench sets beside what else
            # ran on the machine at the time (the autovacuum stand-in's passes).
            "spans": [(wall + sent, wall + sent + latency) for sent, latency, _ in self.timed],
            "wrong": self.wrong,
            "late": len(self.late),
            "cpu": cpu / count,
        }


def run(
    bases: list[str],
    tokens: list[str],
    body: dict,
    prefix: str,
    concurrency: int,
    count: int,
    rate: float = 0,
    loop: str = "submission",
    dsn: str = "",
) -> dict:
    """``count`` submissions from ``concurrency`` threads.

    With ``loop`` "submission" a thread is done with a submission when it is answered; with
    "effect" only once its effect is CONFIRMED in the ledger (read by an :class:`Oracle` on
    ``dsn``), so that at most ``concurrency`` effects are in flight, as in the floor; with
    "api" likewise, but learning of it as an agent does, through the API's long poll
    (:func:`wait_through_api`), which the product then pays for.

    With ``rate`` 0 each thread sends its next submission as soon as the last is answered (a
    closed loop: the product's throughput). With ``rate`` > 0 the submissions are offered at
    that many a second in all, submission ``i`` due at ``i / rate`` seconds after the start
    (an open loop: latency under a given load). Its latency then counts from when it was due,
    not from when a thread was free to send it, so that a server that falls behind shows it
    (no coordinated omission); ``late`` counts the submissions no thread was free to send on
    time."""
    oracle = Oracle(dsn).start() if loop == "effect" else None
    submissions = _Pass(bases, tokens, body, prefix, count, rate, loop, oracle)
    with ThreadPoolExecutor(concurrency) as executor:
        before = os.times()
        started_at = time.time()  # the wall clock: the ledger's timestamps are compared with it
        wall = started_at - time.perf_counter()  # perf_counter → wall clock
        list(executor.map(submissions.one, range(count)))
        after = os.times()
    if oracle is not None:
        oracle.stop()
    cpu = (after.user + after.system) - (before.user + before.system)
    return submissions.result(started_at, wall, cpu, count)


if __name__ == "__main__":
    arguments = json.loads(sys.argv[1])
    json.dump(run(**arguments), sys.stdout)
