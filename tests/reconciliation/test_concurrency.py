"""Two reconcilers at once, with real threads on PostgreSQL: the claim (FOR UPDATE SKIP
LOCKED plus the pushed next_check_at) gives every due effect to exactly one of them."""

from __future__ import annotations

import threading

import pytest
from django.db import connections
from django.utils import timezone

from gateway.models import Effect
from reconciliation import services
from reconciliation.models import ReconciliationRecord
from tests.reconciliation.conftest import lookups, operations, sends

pytestmark = pytest.mark.django_db(transaction=True)


def test_two_reconcilers_never_look_up_the_same_effect(recon_unknown, recon_sandbox):
    effects = [recon_unknown(f"race:{n}") for n in range(16)]
    # All due at once: both reconcilers compete for the same rows.
    Effect.objects.filter(pk__in=[e.pk for e in effects]).update(next_check_at=timezone.now())
    start = threading.Barrier(2)
    claimed: dict[str, int] = {}
    errors: list[BaseException] = []

    def reconciler(name: str) -> None:
        try:
            start.wait(timeout=10)
            total = 0
            while found := services.reconcile_next_batch(limit=3, actor=name):
                total += found
            claimed[name] = total
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=reconciler, args=(f"rec-{i}",)) for i in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert errors == []
    assert sum(claimed.values()) == len(effects)
    for effect in effects:
        effect.refresh_from_db()
        assert effect.status == "CONFIRMED"
        assert len(lookups(recon_sandbox, effect)) == 1, effect.pk
        assert ReconciliationRecord.objects.filter(effect=effect).count() == 1
        assert len(operations(recon_sandbox, effect)) == 1
        assert len(sends(recon_sandbox, effect)) == 1
    # Each effect's one record names the reconciler that claimed it.
    actors = set(ReconciliationRecord.objects.values_list("actor", flat=True))
    assert actors <= {"rec-1", "rec-2"}
