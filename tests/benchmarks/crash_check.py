"""A larger run of the crash checker, for the figures in docs/reliability.md.

    DATABASE_URL=postgres://… CELERY_BROKER_URL=redis://… \
        .venv/bin/python -m tests.benchmarks.crash_check --effects 200 --kills 12

Submits N effects, then runs them through a real beat and a real (solo) worker that is
SIGKILLed at every dispatch failpoint the given number of times, while the sandbox injects
provider faults; when everything has settled or reached a human, it compares the sandbox's
operation log with the ledger and prints the figures. Uses the configured database (it runs
migrations) and broker; nothing is mocked.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path


def main() -> int:
    args = _arguments()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from gateway.celery import app as celery_app
    from tests.support import crash

    call_command("migrate", interactive=False, verbosity=0)
    random.seed(args.seed)
    run = uuid.uuid4().hex[:8]
    queue = f"crash-{run}"
    celery_app.conf.task_default_queue = queue
    sandbox = _faulty_sandbox(args.faults)
    effect_ids = _submit(run, args.effects)
    logs = Path(tempfile.mkdtemp(prefix="crash-check-"))
    failpoints = ",".join(
        f"dispatch.{point}={args.kills}" for point in ("after_claim", "after_call", "after_record")
    )
    started = time.monotonic()
    try:
        result = crash.run(
            effect_ids=effect_ids,
            queue=queue,
            logs=logs,
            failpoints=failpoints,
            failpoint_dir=logs / "failpoints",
            timeout=args.timeout,
        )
    finally:
        sandbox.stop()
    faults = Counter(e["fault"] for e in sandbox.provider.log() if e.get("fault"))
    report = crash.check(
        effect_ids,
        sandbox.provider,
        kills=result.kills,
        seconds=time.monotonic() - started,
        faults=faults,
    )
    engine = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    print(
        f"crash check {run}: database {engine}, broker "
        f"{settings.CELERY_BROKER_URL.split('://')[0]}, logs in {logs}"
    )
    for line in report.lines():
        print(f"  {line}")
    bad = report.duplicates or report.lost or report.stuck
    return 1 if bad else 0


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--effects", type=int, default=200)
    parser.add_argument("--kills", type=int, default=12, help="per failpoint, 3 failpoints")
    parser.add_argument("--faults", type=int, default=10, help="per sandbox fault kind")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--seed", type=int, default=7)
    return parser.parse_args()


def _faulty_sandbox(faults: int):
    """The sandbox provider on a free port, ``faults`` of each fault kind queued, and the
    gateway pointed at it."""
    from django.conf import settings

    from gateway.providers.sandbox import SandboxProvider, SandboxServer

    sandbox = SandboxServer(SandboxProvider(), port=0).start()
    settings.GATEWAY_PROVIDER_URLS = {
        name: sandbox.base_url(name)
        for name in ("billing", "inventory", "shipping", "deploy", "tickets", "mail", "verify")
    }
    for fault in ("commit_then_drop", "fail_before_commit", "slow"):
        params = {"seconds": 3} if fault == "slow" else {}
        sandbox.provider.add_fault(fault, times=faults, **params)
    sandbox.provider.add_fault("processing", times=faults, lookups=3)
    return sandbox


def _submit(run: str, effects: int) -> list[str]:
    """``effects`` ticket effects of a new agent of tenant ``crash``, submitted in process."""
    from django.core.management import call_command

    from gateway import services
    from gateway.models import Principal

    call_command(
        "issue_token",
        tenant="crash",
        principal=f"crash-{run}",
        role="agent",
        stdout=io.StringIO(),
    )
    agent = Principal.objects.get(tenant__slug="crash", name=f"crash-{run}")
    effect_ids = []
    for index in range(effects):
        submission = services.command_submit(
            principal=agent,
            idempotency_key=f"crash:{run}:{index}",
            type="ticket.create",
            resource={"type": "queue", "id": "crash"},
            payload={"title": f"crash {index}", "priority": random.choice(["P2", "P3", "P4"])},
            expires_in=3600,
        )
        effect_ids.append(submission.effect.pk)
    return effect_ids


if __name__ == "__main__":
    sys.exit(main())
