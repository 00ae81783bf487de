"""The fault campaign's parts (tests/slow/test_fault_campaign.py): the oracle that reads the
sandbox provider's own log against the ledger, and the extra product processes that join and
leave during the run (a second web node, a second worker, a second beat).

The oracle counts, per accepted effect:

- **duplicates**: idempotency keys the provider executed more than once;
- **lost**: accepted, yet neither executed at the provider nor terminal in the ledger; and
  **disagreeing**: the ledger says CONFIRMED and the provider has no such operation (or a
  failed one), or the provider executed it and the ledger says it never happened;
- **stuck**: not settled once the run settled, and not with a human either;
- **blind resends**: a send of a key after an earlier send of it with no answered lookup of
  the key in between (every second send follows an uncertain first one: nothing else makes
  the gateway send a key again).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from django.db import connection

from gateway.choices import SETTLED, TERMINAL
from gateway.models import Effect, EffectEvent
from gateway.providers.sandbox import FAILED, SandboxProvider
from reconciliation.models import Case
from tests.support.processes import ROOT, child_env

# The sandbox log's actions of a POST that reached the provider's decision, and the faults
# that turn a POST away before it; the lookups that answered (found or not found).
SEND_ACTIONS = frozenset({"commit", "replay", "key_reused", "conflict", "reject"})
SEND_FAULTS = frozenset({"fail_before_commit", "reset_before_commit", "throttle"})
ANSWERED_LOOKUPS = frozenset({"lookup", "lookup_miss"})
NEVER_HAPPENED = frozenset({"REJECTED", "EXPIRED", "CANCELLED", "NOT_STARTED"})


def _faults_of(entry: dict[str, Any]) -> set[str]:
    return set(entry["fault"].split("+")) if entry.get("fault") else set()


def is_send(entry: dict[str, Any]) -> bool:
    return entry["action"] in SEND_ACTIONS or (
        entry["action"] == "fault" and bool(_faults_of(entry) & SEND_FAULTS)
    )


def blind_resends(log: list[dict[str, Any]]) -> list[str]:
    """Keys sent again with no answered lookup since their previous send (one entry per
    such send)."""
    sent: set[str] = set()
    looked: set[str] = set()
    blind: list[str] = []
    for entry in log:
        key = entry.get("idempotency_key")
        if not key:
            continue
        if is_send(entry):
            if key in sent and key not in looked:
                blind.append(key)
            sent.add(key)
            looked.discard(key)
        elif entry["action"] in ANSWERED_LOOKUPS:
            looked.add(key)
    return blind


def percentiles(values: list[float]) -> str:
    if not values:
        return "none"
    ordered = sorted(values)

    def at(fraction: float) -> float:
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]

    return (
        f"p50 {at(0.5):.1f} s, p90 {at(0.9):.1f} s, p99 {at(0.99):.1f} s, "
        f"max {ordered[-1]:.1f} s (n = {len(ordered)})"
    )


@dataclass
class Verdict:
    """What the oracle found; ``lines`` is the table the campaign prints."""

    effects: int
    statuses: Counter = field(default_factory=Counter)
    duplicates: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    disagreeing: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    human: list[str] = field(default_factory=list)
    escalated_settled: list[str] = field(default_factory=list)
    blind: list[str] = field(default_factory=list)
    resends: int = 0
    unknown_to_settled: list[float] = field(default_factory=list)
    end_to_end: list[float] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [
            f"effects accepted: {self.effects}",
            f"final statuses: {dict(sorted(self.statuses.items()))}",
            f"with a human, not settled (escalated, mismatch or an open case): "
            f"{len(self.human)}; escalated on the way and settled since: "
            f"{len(self.escalated_settled)}",
            f"duplicates (keys executed more than once): {len(self.duplicates)}",
            f"lost (accepted, neither executed nor terminal): {len(self.lost)}",
            f"ledger and provider disagree: {len(self.disagreeing)}",
            f"stuck (not settled after settling, no human): {len(self.stuck)}",
            f"blind resends (a second send without a lookup between): {len(self.blind)} "
            f"(resends after a lookup: {self.resends - len(self.blind)})",
            f"UNKNOWN -> settled: {percentiles(self.unknown_to_settled)}",
            f"accepted -> settled: {percentiles(self.end_to_end)}",
        ]


def judge(effect_ids: list[str], sandbox: SandboxProvider) -> Verdict:
    """The sandbox's operations and log against the ledger's effects."""
    connection.close()
    verdict = Verdict(effects=len(effect_ids))
    ops: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for op in sandbox.operations():
        ops[op["idempotency_key"]].append(op)
    verdict.duplicates = sorted(key for key, found in ops.items() if len(found) > 1)
    log = sandbox.log()
    verdict.blind = blind_resends(log)
    sends = Counter(entry["idempotency_key"] for entry in log if is_send(entry))
    verdict.resends = sum(count - 1 for count in sends.values())
    cased = set(Case.objects.filter(effect_id__in=effect_ids).values_list("effect_id", flat=True))
    for effect in Effect.objects.filter(pk__in=effect_ids).select_related("command").iterator():
        verdict.statuses[effect.status] += 1
        executed = ops.get(effect.command.provider_key, [])
        if not executed and effect.status not in TERMINAL:
            verdict.lost.append(effect.pk)
        succeeded = [op for op in executed if op["status"] != FAILED]
        if (effect.status == "CONFIRMED" and not succeeded) or (
            succeeded and effect.status in NEVER_HAPPENED
        ):
            verdict.disagreeing.append(effect.pk)
        flagged = effect.escalated or effect.mismatch or effect.pk in cased
        if flagged and effect.status in SETTLED:
            verdict.escalated_settled.append(effect.pk)
        elif flagged:
            verdict.human.append(effect.pk)
        elif effect.status not in SETTLED:
            verdict.stuck.append(effect.pk)
    verdict.unknown_to_settled, verdict.end_to_end = _settle_times(effect_ids)
    return verdict


def _settle_times(effect_ids: list[str]) -> tuple[list[float], list[float]]:
    """Seconds from an effect's first UNKNOWN to its settled status, for those that were
    UNKNOWN; and from its acceptance to its settled status, for all that settled."""
    first_unknown: dict[str, datetime] = {}
    settled: dict[str, datetime] = {}
    rows = (
        EffectEvent.objects.filter(effect_id__in=effect_ids, to_status__isnull=False)
        .order_by("id")
        .values_list("effect_id", "to_status", "created_at")
    )
    for effect_id, status, at in rows.iterator():
        if status == "UNKNOWN":
            first_unknown.setdefault(effect_id, at)
        if status in SETTLED:
            settled.setdefault(effect_id, at)
    created = dict(Effect.objects.filter(pk__in=effect_ids).values_list("pk", "created_at"))
    after_unknown = [
        (settled[e] - at).total_seconds() for e, at in first_unknown.items() if e in settled
    ]
    end_to_end = [(at - created[e]).total_seconds() for e, at in settled.items()]
    return after_unknown, end_to_end


class WebNode:
    """A second web node: gunicorn serving the gateway on a port of its own, against the
    run's database and broker."""

    def __init__(self, port: int, log: Path, **env: str) -> None:
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        self.handle = log.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "gateway.wsgi", "-b", f"127.0.0.1:{port}",
             "-w", "1", "--threads", "2", "-k", "gthread", "--log-level", "warning"],
            cwd=ROOT, stdout=self.handle, stderr=subprocess.STDOUT,
            env=child_env(ALLOWED_HOSTS="127.0.0.1,localhost", **env), start_new_session=True,
        )  # fmt: skip

    def ready(self) -> bool:
        if self.process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{self.base}/healthz", timeout=2) as response:
                return response.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def submit(self, token: str, key: str, body: bytes) -> tuple[int, bytes]:
        """``POST /api/v1/commands``; the status and body, or 0 when no answer came."""
        request = urllib.request.Request(
            f"{self.base}/api/v1/commands",
            data=body,
            method="POST",
            headers={
                "Authorization": f"Bearer {token}",
                "Idempotency-Key": key,
                "Content-Type": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, b""
        except (OSError, urllib.error.URLError):
            return 0, b""

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, sig)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)
        self.handle.close()


def wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False
