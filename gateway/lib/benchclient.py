"""The product's client in ``manage.py bench``: ``count`` submissions over HTTP from
``concurrency`` threads, each with its own kept-alive connection.

It runs in a process of its own (``python -m gateway.lib.benchclient``, arguments and result
as JSON), as the floor does (gateway.lib.benchfloor): in the benchmark's process it would share
an interpreter lock with the sandbox provider, so the product's submissions and the provider's
answers to its workers would wait for each other there, and the floor's would not.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx


def run(
    bases: list[str], tokens: list[str], body: dict, prefix: str, concurrency: int, count: int
) -> dict:
    local = threading.local()
    submit: list[float] = []
    wrong: list[int] = []
    ids: list[str | None] = [None] * count

    def one(index: int) -> None:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = httpx.Client(timeout=30)
        token = tokens[index % len(tokens)]
        started = time.perf_counter()
        response = client.post(
            f"{bases[index % len(bases)]}/api/v1/commands",
            headers={"Authorization": f"Bearer {token}", "Idempotency-Key": f"{prefix}:{index}"},
            json={**body, "payload": {"title": f"bench {index}", "priority": "P4"}},
        )
        submit.append(time.perf_counter() - started)
        if response.status_code != 201:
            wrong.append(response.status_code)
            return
        ids[index] = response.json()["effect_id"]

    with ThreadPoolExecutor(concurrency) as executor:
        started_at = time.time()  # the wall clock: the ledger's timestamps are compared with it
        list(executor.map(one, range(count)))
    return {
        "started_at": started_at,
        "ids": [effect_id for effect_id in ids if effect_id],
        "submit": submit,
        "wrong": wrong,
    }


if __name__ == "__main__":
    arguments = json.loads(sys.argv[1])
    json.dump(run(**arguments), sys.stdout)
