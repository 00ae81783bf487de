"""The floor of the bench: the least a ledger-before-call gateway can do per effect.

``INSERT … ON CONFLICT DO NOTHING`` (the claim) → ``POST /operations`` to the provider →
``UPDATE`` (the record), on a fixed pool of autocommit psycopg connections, keep-alive HTTP,
no ORM, no broker. Two clients for the provider call:

- ``httpx``: the httpx floor, the one the targets (tests.benchmarks.bench.targets) were set
  against;
- ``stdlib``: the standard library's ``http.client`` (tests.benchmarks.bench.client.Connection),
  the strict floor: cheaper per call than the product's adapter (gateway.providers.http, on
  urllib3) and than httpx. This floor's own process spent 0.9 ms CPU per effect where the
  httpx one's spent 1.6 ms, and it ran 1.45× as many effects per second. The bench runs both
  and prints both ratios.

It runs in a process of its own (``python -m tests.benchmarks.bench.floor``, arguments and
result as JSON) so that it does not share an interpreter lock with the bench's client and
sandbox provider: the comparison is process against processes. No Django here.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psycopg

from gateway.lib.digest import payload_digest
from tests.benchmarks.bench.client import Connection
from tests.benchmarks.bench.machine import cpu_seconds

TYPE = "ticket.create"
RESOURCE = {"type": "queue", "id": "bench"}
DDL = """
CREATE TABLE IF NOT EXISTS bench_floor (
    key text PRIMARY KEY,
    digest text NOT NULL,
    status text NOT NULL,
    operation_id text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz
)
"""


def _post_httpx(local, url: str, body: dict, key: str) -> dict:
    client = getattr(local, "client", None)
    if client is None:
        client = local.client = httpx.Client(timeout=10)
    return client.post(f"{url}/operations", json=body, headers={"Idempotency-Key": key}).json()


def _post_stdlib(local, url: str, body: dict, key: str) -> dict:
    conn = getattr(local, "conn", None)
    if conn is None:
        conn = local.conn = Connection(url, timeout=10)
    headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
    _, content = conn.request("POST", "/operations", json.dumps(body).encode(), headers)
    return json.loads(content)


def run(
    dsn: str,
    pool_size: int,
    url: str,
    concurrency: int,
    count: int,
    prefix: str,
    client: str,
) -> dict:
    post = {"stdlib": _post_stdlib, "httpx": _post_httpx}[client]
    pool: queue.Queue[psycopg.Connection] = queue.Queue()
    connections = [psycopg.connect(dsn, autocommit=True) for _ in range(pool_size)]
    for conn in connections:
        pool.put(conn)
    connections[0].execute(DDL)
    local = threading.local()

    def one(key: str, payload: dict) -> float:
        started = time.perf_counter()
        digest = payload_digest(type=TYPE, resource=RESOURCE, payload=payload)
        conn = pool.get()
        try:
            conn.execute(
                "INSERT INTO bench_floor (key, digest, status) VALUES (%s, %s, 'DISPATCHING') "
                "ON CONFLICT (key) DO NOTHING",
                (key, digest),
            )
        finally:
            pool.put(conn)
        body = post(
            local,
            url,
            {"type": TYPE, "resource": RESOURCE, "payload": payload, "payload_digest": digest},
            key,
        )
        conn = pool.get()
        try:
            conn.execute(
                "UPDATE bench_floor SET status = %s, operation_id = %s, updated_at = now() "
                "WHERE key = %s",
                ("CONFIRMED" if body.get("status") == "succeeded" else "UNKNOWN", body["id"], key),
            )
        finally:
            pool.put(conn)
        return time.perf_counter() - started

    def task(index: int) -> float:
        return one(f"{prefix}:{index}", {"title": f"floor {index}", "priority": "P4"})

    with ThreadPoolExecutor(concurrency) as executor:  # warm: connections, clients, imports
        list(executor.map(lambda i: one(f"{prefix}:warm:{i}", {"title": "w"}), range(concurrency)))
        backends = [conn.info.backend_pid for conn in connections]
        pg_before = sum(cpu_seconds(pid) for pid in backends)
        own_before = os.times()
        started = time.perf_counter()
        latencies = list(executor.map(task, range(count)))
        elapsed = time.perf_counter() - started
    own_after = os.times()
    pg = sum(cpu_seconds(pid) for pid in backends) - pg_before
    own = (own_after.user + own_after.system) - (own_before.user + own_before.system)
    for conn in connections:
        conn.close()
    return {
        "n": count,
        "rate": count / elapsed,
        "e2e": latencies,
        "cpu": {"pg": pg * 1000 / count, "client": own * 1000 / count},
    }


if __name__ == "__main__":
    arguments = json.loads(sys.argv[1])
    json.dump(run(**arguments), sys.stdout)
