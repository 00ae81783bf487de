"""The bench's fault pass: time to certainty, on the product's running processes after the
measured passes (skipped with ``--no-fault-pass``).

- **UNKNOWN → settled**: ``--fault-effects`` ticket commands at c = 8 (each client thread
  waits for its effect to be CONFIRMED before it submits the next, as an agent that waits on
  its effect does) while the sandbox provider commits every one and drops its answer
  (``commit_then_drop``), then answers the lookups at once. Each effect is UNKNOWN with its
  first lookup due on the contract's backoff schedule (``GATEWAY_RECONCILE_BACKOFF``): the
  first lookup would succeed at that due time. Printed: how long after it each effect was
  CONFIRMED (p50, p99, max), against the targets p50 ≤ 3 s and p99 ≤ 15 s.
- **Lease expiry**: ``--fault-leases`` claims taken in this process at random moments over
  a few seconds and never answered (a worker that died after its claim, with a 5 s lease, the
  due time announced as the dispatch path announces it). Printed: how long after each
  lease's expiry the workers' wakers made it UNKNOWN (lease recovery), against the target of
  2 s; the lookups then find nothing at the provider and the effects are sent again with
  their keys.

Both check the provider's log: each key one operation.
"""

from __future__ import annotations

import random
import threading
import time
from datetime import datetime
from typing import Any

from django.conf import settings

from gateway import deadlines, services
from gateway.models import Effect, EffectEvent, Principal
from tests.benchmarks.bench.options import BenchError
from tests.benchmarks.bench.stats import percentile

CONCURRENCY = 8
LEASE = 5.0  # seconds: the stranded claims' lease
SETTLE_P50, SETTLE_P99, LEASE_LATE = 3.0, 15.0, 2.0  # the targets, in seconds


class _DueTimes(threading.Thread):
    """Reads the UNKNOWN effects' first due time every 50 ms (a claim pushes it on, so the
    earliest value seen is the schedule's)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.first_due: dict[str, datetime] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        from django.db import connection

        while not self.stopping.wait(0.05):
            rows = Effect.objects.filter(
                status="UNKNOWN", check_count=0, next_check_at__isnull=False
            ).values_list("pk", "next_check_at")
            for effect_id, due in rows:
                if due is not None:
                    known = self.first_due.get(effect_id)
                    self.first_due[effect_id] = due if known is None else min(known, due)
        connection.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(5)


def fault_pass(bench: Any, tokens: list[str]) -> list[str]:
    """Both parts of the fault pass on ``bench``'s running stack; the lines to print."""
    n, leases = bench.options["fault_effects"], bench.options["fault_leases"]
    lines = [
        "",
        f"fault pass (c = {CONCURRENCY}; the product's workers: their wakers act at the due "
        "times, the sweeps are 30 s apart; tests/benchmarks/bench/faults.py):",
    ]
    if n:
        lines += _unknown_pass(bench, tokens, n)
    if leases:
        lines += _lease_pass(bench, leases)
    return lines


def _unknown_pass(bench: Any, tokens: list[str], n: int) -> list[str]:
    from tests.benchmarks.bench.run import BODY, run_process

    provider = bench.sandbox.provider
    provider.add_fault("commit_then_drop", times=n, provider="tickets")
    watcher = _DueTimes()
    watcher.start()
    prefix = f"fault:{bench.run_id}"
    try:
        client = run_process(
            "tests.benchmarks.bench.client",
            {
                "bases": bench.bases,
                "tokens": tokens,
                "body": BODY,
                "prefix": prefix,
                "concurrency": CONCURRENCY,
                "count": n,
                "rate": 0,
                "loop": "effect",
                "dsn": bench.dsn,
            },
            "the fault pass's client",
        )
        ids: list[str] = client["ids"]
        bench._await_settled(ids)
    finally:
        watcher.stop()
        provider.clear_faults()
    rows = Effect.objects.filter(pk__in=ids, confirmed_at__isnull=False)
    confirmed = {pk: at for pk, at in rows.values_list("pk", "confirmed_at") if at is not None}
    late = [
        (confirmed[e] - watcher.first_due[e]).total_seconds()
        for e in ids
        if e in confirmed and e in watcher.first_due
    ]
    keys = [op["idempotency_key"] for op in provider.operations(provider="tickets")]
    ours = [key for key in keys if prefix in key]
    return [
        f"  UNKNOWN -> CONFIRMED after the first lookup would succeed ({n} effects, "
        f"commit_then_drop on every send, GATEWAY_RECONCILE_BACKOFF="
        f"{settings.GATEWAY_RECONCILE_BACKOFF:g} s): {_stats(late)}; "
        f"{_verdict(late, SETTLE_P50, SETTLE_P99)}",
        f"    due times seen {len(late)} of {n}; CONFIRMED {len(confirmed)} of {n}; "
        f"provider operations {len(ours)} for {len(set(ours))} keys",
    ]


def _lease_pass(bench: Any, count: int) -> list[str]:
    """``count`` claims never answered, taken at random moments over ``count`` × 0.3 s."""
    agent = Principal.objects.get(tenant__slug="bench", name=f"bench-{bench.run_id}")
    previous = settings.GATEWAY_DISPATCH_LEASE
    settings.GATEWAY_DISPATCH_LEASE = LEASE
    expires: dict[str, Any] = {}
    try:
        for index in range(count):
            time.sleep(random.uniform(0, 0.6))
            effect_id, at = _stranded_claim(agent, f"lease:{bench.run_id}:{index}")
            expires[effect_id] = at
    finally:
        settings.GATEWAY_DISPATCH_LEASE = previous
    ids = list(expires)
    bench._await_settled(ids)
    recovered = dict(
        EffectEvent.objects.filter(effect_id__in=ids, kind="lease_expired").values_list(
            "effect_id", "created_at"
        )
    )
    late = [(recovered[e] - expires[e]).total_seconds() for e in ids if e in recovered]
    keys = [op["idempotency_key"] for op in bench.sandbox.provider.operations(provider="tickets")]
    ours = [key for key in keys if f"lease:{bench.run_id}:" in key]
    confirmed = Effect.objects.filter(pk__in=ids, status="CONFIRMED").count()
    return [
        f"  lease expiry acted on after the deadline ({count} claims never answered, "
        f"{LEASE:g} s leases): {_stats(late)}; {_verdict(late, LEASE_LATE, LEASE_LATE, 'max')}",
        f"    recovered {len(late)} of {count}; CONFIRMED {confirmed} of {count} "
        f"after the lookup; provider operations {len(ours)} for {len(set(ours))} keys",
    ]


def _stranded_claim(agent: Principal, key: str) -> tuple[str, Any]:
    """A command claimed here and never sent: what a worker leaves that died after its claim.
    Submitted and claimed in one transaction, so that no worker claims it first."""
    from django.db import transaction

    with transaction.atomic():
        effect = services.command_submit(
            principal=agent,
            idempotency_key=key,
            type="ticket.create",
            resource={"type": "queue", "id": "bench"},
            payload={"title": key, "priority": "P4"},
        ).effect
        claim = services.effect_claim(effect_id=effect.pk, worker="bench-stranded")
        if claim is None:
            raise BenchError(f"the fault pass could not claim {effect.pk}")
        lease = Effect.objects.values_list("lease_expires_at", flat=True).get(pk=effect.pk)
        # As the dispatch path does (gateway.deadlines.lease_soon): the waker hears of it.
        deadlines.soon(lease)
    return effect.pk, lease


def _stats(values: list[float]) -> str:
    if not values:
        return "no values"
    return (
        f"p50 {percentile(values, 50):.2f} s, p99 {percentile(values, 99):.2f} s, "
        f"max {max(values):.2f} s"
    )


def _verdict(values: list[float], p50: float, p99: float, tail: str = "p99") -> str:
    if not values:
        return "MISSED (no values)"
    top = max(values) if tail == "max" else percentile(values, 99)
    met = percentile(values, 50) <= p50 and top <= p99
    target = f"p50 ≤ {p50:g} s, {tail} ≤ {p99:g} s"
    return f"target {target}: {'met' if met else 'MISSED'}"
