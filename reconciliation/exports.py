"""The human queue as an export (``/export/cases.<csv|jsonl>``, gateway.console.exports): the
cases page's filters, tenant scope and order, read from a server-side cursor."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gateway.console.base import ConsoleRequest
from gateway.console.extensions import Export
from gateway.templatetags.console import money
from reconciliation.models import Case

# Rows fetched from the server-side cursor per round trip.
EXPORT_CHUNK = 2000

COLUMNS = (
    "case_id",
    "effect_id",
    "type",
    "owner",
    "reason",
    "reason_text",
    "state",
    "opened_at",
    "opened_by",
    "taken_by",
    "resolved_at",
    "resolved_by",
    "effect_status",
    "at_stake",
)


def _row(case: Case) -> dict[str, Any]:
    effect = case.effect
    return {
        "case_id": case.pk,
        "effect_id": case.effect_id,
        "type": effect.type,
        "owner": case.owner,
        "reason": case.reason,
        "reason_text": case.reason_text,
        "state": case.state,
        "opened_at": case.opened_at,
        "opened_by": case.opened_by,
        "taken_by": case.acknowledged_by.label if case.acknowledged_by else "",
        "resolved_at": case.resolved_at,
        "resolved_by": case.resolved_actor,
        "effect_status": effect.status,
        "at_stake": money(effect.command.payload_redacted),
    }


def case_rows(request: ConsoleRequest) -> Iterator[dict[str, Any]]:
    """Every case the cases page lists with these filters (all of its pages)."""
    from reconciliation.views import CaseFilters, _cases_query

    filters = CaseFilters.parse(request.GET)
    query = _cases_query(request.principal, filters)
    return (_row(case) for case in query.iterator(chunk_size=EXPORT_CHUNK))


CASES_EXPORT = Export(COLUMNS, case_rows)
