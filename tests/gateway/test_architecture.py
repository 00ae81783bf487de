"""The boundaries of docs/internals/layers.md that the tools do not see by themselves: the hooks
the ledger calls instead of importing the apps above it are filled once Django is set up, and
the import contract of pyproject.toml covers every module of gateway but the project shell."""

from __future__ import annotations

import pkgutil
import tomllib
from pathlib import Path

import gateway
from gateway import capabilities, hooks, moves
from gateway.agent_hooks import console as agent_hooks_console
from gateway.console import extensions
from gateway.webhooks.apps import announce_creation, announce_transition, record_waiter
from reconciliation import job_views
from reconciliation import views as reconciliation_views
from reconciliation.exports import CASES_EXPORT
from reconciliation.services import expiry
from sagas import listeners
from sagas import views as sagas_views

ROOT = Path(__file__).resolve().parents[2]
# The project shell: it composes the apps, so it alone may import reconciliation and sagas.
SHELL = {"urls", "settings", "settings_oauth", "celery", "asgi", "wsgi"}


def test_the_ledgers_hooks_are_filled_after_django_setup():
    # In INSTALLED_APPS order: the ledger's own listeners, then reconciliation's, sagas',
    # then the outbox.
    assert list(hooks.after_transition) == [
        capabilities.capability_release_unsent,
        moves.after_transition,
        expiry.announce_on_transition,
        listeners.advance_after_transition,
        announce_transition,
    ]
    assert list(hooks.effect_created) == [expiry.announce_on_creation, announce_creation]
    assert list(hooks.command_replayed) == [record_waiter]
    assert list(hooks.dispatch_holds) == [listeners.FROZEN_SAGA]
    assert list(hooks.mismatch_found) == [listeners.freeze_on_mismatch]
    assert hooks.dispatch_sender.bound
    assert hooks.due_sender.bound


def test_the_console_extensions_are_filled_after_django_setup():
    assert extensions.effect_panels == [
        reconciliation_views.effect_panel,
        reconciliation_views.effect_holder_panel,
        sagas_views.effect_panel,
        agent_hooks_console.effect_panel,
    ]
    assert extensions.triage_panels == [job_views.jobs_panel, sagas_views.triage_panel]
    assert set(extensions.effect_actions) == {
        "reconcile",
        "resolve",
        "acknowledge",
        "take",
        "release",
        "close-case",
        "record-fix",
    }
    assert set(extensions.bulk_actions) == {"reconcile", "rearm", "take"}
    assert extensions.search_hits == [sagas_views.search_hits]
    assert extensions.exports == {"cases": CASES_EXPORT}


def test_registering_a_listener_twice_keeps_one():
    registry: hooks.Registry[object] = hooks.Registry("test")
    listener = object()
    registry.register(listener)
    registry.register(listener)
    assert list(registry) == [listener]


def test_the_boundary_contract_names_every_module_of_gateway_but_the_shell():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contract = next(c for c in config["contracts"] if c["id"] == "gateway-below-apps")
    modules = {f"gateway.{m.name}" for m in pkgutil.iter_modules(gateway.__path__)}
    expected = modules - {f"gateway.{name}" for name in SHELL}
    assert set(contract["source_modules"]) == expected
    # The debt is paid: no contract ignores an import.
    assert all(not c.get("ignore_imports") for c in config["contracts"])
