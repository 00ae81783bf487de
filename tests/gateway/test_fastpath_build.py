"""The submission's fast path builds the effect it answers with by position (fastpath._built):
it must be the instance the keyword constructor gives, field for field, marked saved."""

from __future__ import annotations

from datetime import UTC, datetime

from gateway import fastpath
from gateway.models import Command, Effect

NOW = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def _fields(instance) -> dict:
    return {f.attname: getattr(instance, f.attname) for f in instance._meta.concrete_fields}


def test_a_positional_build_is_the_keyword_instance_marked_saved():
    values = {
        "command_id": "eff_x",
        "tenant_id": 7,
        "type": "ticket.create",
        "owner": "support",
        "status": "PREPARED",
        "status_changed_at": NOW,
        "approval_state": "not_required",
        "next_dispatch_at": NOW,
        "created_at": NOW,
        "updated_at": NOW,
    }
    built = fastpath._built(Effect, fastpath._E_FIELDS, "default", **values)
    expected = Effect(**values)
    assert _fields(built) == _fields(expected)
    assert (built._state.adding, built._state.db) == (False, "default")


def test_a_positional_build_fills_the_defaults_of_the_fields_not_named():
    command = fastpath._built(
        Command, fastpath._C_FIELDS, "default", effect_id="eff_y", tenant_id=1, created_at=NOW
    )
    assert command.intent == {} and command.context == {}
    assert command.saga_id == "" and command.budget_amount == 0
    assert command.compensates_id is None and command.capability_id is None
    assert _fields(command) == _fields(Command(effect_id="eff_y", tenant_id=1, created_at=NOW))
