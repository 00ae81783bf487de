"""Time to certainty: how long an UNKNOWN waits before a lookup settles it.

    .venv/bin/python -m tests.benchmarks.settle_time --effects 200 --concurrency 8

Submits N ticket effects from C client threads (each waits for its effect to be settled
before it submits the next, as an agent does; ``--burst``: all at once) while a real worker
(prefork, its drainers and wakers; no beat, and the reconciler's sweep an hour apart, so no
sweep settles anything) sends them to the sandbox provider, which commits every one and
drops its answer (``commit_then_drop``): each becomes UNKNOWN, with its first lookup due on
the contract's backoff schedule (``GATEWAY_RECONCILE_BACKOFF``). The provider answers
lookups at once, so the first lookup would succeed at that due time. Prints, over the
effects, how long after that due time each was settled (p50, p99, max), and how long after
it became UNKNOWN; checks that each key is one operation at the provider. Runs on throwaway
embedded servers unless DATABASE_URL and CELERY_BROKER_URL are set (then it migrates that
database).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path


def main() -> int:
    args = _arguments()
    servers = None
    if not (os.environ.get("DATABASE_URL") and os.environ.get("CELERY_BROKER_URL")):
        from gateway import embedded

        servers = embedded.TestServers(max_connections=60)
        os.environ.update(servers.start())
    try:
        return _run(args)
    finally:
        if servers is not None:
            servers.stop()


def _run(args: argparse.Namespace) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")
    import django

    django.setup()
    from django.core.management import call_command

    from gateway.celery import app as celery_app
    from gateway.providers.sandbox import SandboxProvider, SandboxServer
    from tests.support.processes import Celery

    call_command("migrate", interactive=False, verbosity=0)
    run = uuid.uuid4().hex[:8]
    celery_app.conf.task_default_queue = queue = f"settle-{run}"
    sandbox = SandboxServer(SandboxProvider(), port=0).start()
    logs = Path(tempfile.mkdtemp(prefix="settle-time-"))
    worker = None
    try:
        _point_at(sandbox)
        sandbox.provider.add_fault("commit_then_drop", times=args.effects)
        worker = Celery(
            "worker",
            queue,
            logs / "worker.log",
            GATEWAY_RECONCILE_INTERVAL="3600",
            GATEWAY_RECONCILE_BACKOFF=str(args.backoff),
        )
        time.sleep(args.warmup)  # the pool's children start
        watcher = _DueTimes()
        watcher.start()
        effect_ids = _submit(run, args.effects, args.concurrency, args.burst)
        settled = _wait_settled(effect_ids, args.timeout)
        watcher.stop()
        return _report(effect_ids, watcher.first_due, settled, sandbox.provider, args, logs)
    finally:
        if worker is not None:
            worker.stop()
        sandbox.stop()


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--effects", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8, help="submitting threads")
    parser.add_argument("--backoff", type=float, default=5, help="GATEWAY_RECONCILE_BACKOFF")
    parser.add_argument("--warmup", type=float, default=6, help="seconds for the worker to start")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument(
        "--burst", action="store_true", help="submit all at once, without waiting for each"
    )
    return parser.parse_args()


def _point_at(sandbox) -> None:
    from django.conf import settings

    names = ("billing", "inventory", "shipping", "deploy", "tickets", "mail", "verify")
    settings.GATEWAY_PROVIDER_URLS = {name: sandbox.base_url(name) for name in names}


def _submit(run: str, effects: int, concurrency: int, burst: bool) -> list[str]:
    """``effects`` ticket commands of one agent from ``concurrency`` threads, each of which
    (as an agent that waits for its effect) waits for its effect to be settled before it
    submits the next; with ``burst``, without waiting (all UNKNOWN within seconds)."""
    from django.db import connection

    from gateway import services
    from gateway.models import Effect, Principal

    call = {"tenant": "settle", "principal": f"settle-{run}", "role": "agent"}
    from django.core.management import call_command

    call_command("issue_token", **call, stdout=io.StringIO())
    agent = Principal.objects.get(tenant__slug="settle", name=f"settle-{run}")

    def submit(index: int) -> str:
        try:
            effect_id = services.command_submit(
                principal=agent,
                idempotency_key=f"settle:{run}:{index}",
                type="ticket.create",
                resource={"type": "queue", "id": "settle"},
                payload={"title": f"settle {index}", "priority": "P3"},
                expires_in=3600,
            ).effect.pk
            while (
                not burst
                and not Effect.objects.filter(pk=effect_id, confirmed_at__isnull=False).exists()
            ):
                time.sleep(0.1)
            return effect_id
        finally:
            connection.close()

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(submit, range(effects)))


class _DueTimes(threading.Thread):
    """Reads the UNKNOWN effects' first due time every 50 ms (a claim pushes it on, so the
    earliest value seen is the schedule's)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.first_due: dict[str, datetime] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        from django.db import connection

        from gateway.models import Effect

        while not self.stopping.wait(0.05):
            rows = Effect.objects.filter(
                status="UNKNOWN", check_count=0, next_check_at__isnull=False
            ).values_list("pk", "next_check_at")
            for effect_id, due in rows:
                known = self.first_due.get(effect_id)
                self.first_due[effect_id] = due if known is None else min(known, due)
        connection.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(5)


def _wait_settled(effect_ids: list[str], timeout: float) -> dict[str, datetime]:
    from django.db import connection

    from gateway.models import Effect

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = dict(
            Effect.objects.filter(pk__in=effect_ids, confirmed_at__isnull=False).values_list(
                "pk", "confirmed_at"
            )
        )
        connection.close()
        if len(rows) == len(effect_ids):
            return rows
        time.sleep(0.5)
    raise SystemExit(f"timed out: {len(rows)} of {len(effect_ids)} settled after {timeout}s")


def _report(effect_ids, first_due, settled, provider, args, logs) -> int:
    from gateway.models import EffectEvent

    unknown_at = dict(
        EffectEvent.objects.filter(effect_id__in=effect_ids, to_status="UNKNOWN")
        .order_by("id")
        .values_list("effect_id", "created_at")
    )
    after_due = [(settled[e] - first_due[e]).total_seconds() for e in effect_ids if e in first_due]
    after_unknown = [(settled[e] - unknown_at[e]).total_seconds() for e in effect_ids]
    operations = provider.operations()
    keys = {op["idempotency_key"] for op in operations}
    print(
        f"settle time: {args.effects} effects at c = {args.concurrency}"
        f"{' (a burst)' if args.burst else ' (each client waits for its effect)'}, "
        f"commit_then_drop on every send, GATEWAY_RECONCILE_BACKOFF={args.backoff:g}, no beat; "
        f"logs in {logs}"
    )
    print(f"  UNKNOWN -> CONFIRMED after the first lookup's due time: {_stats(after_due)}")
    print(f"  UNKNOWN -> CONFIRMED after becoming UNKNOWN:          {_stats(after_unknown)}")
    print(f"  due times seen: {len(after_due)} of {len(effect_ids)}")
    print(f"  provider operations: {len(operations)} for {len(keys)} keys")
    return 0 if len(operations) == len(keys) == len(effect_ids) else 1


def _stats(values: list[float]) -> str:
    if not values:
        return "no values"
    ordered = sorted(values)

    def at(fraction: float) -> float:
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]

    return f"p50 {at(0.5):.2f} s, p99 {at(0.99):.2f} s, max {ordered[-1]:.2f} s"


if __name__ == "__main__":
    sys.exit(main())
