"""What reconciliation and sagas add to the ledger's console pages, registered in their
``AppConfig.ready()``: the ledger's pages never import those apps.

An explicit registry (``grep effect_panels`` finds every contributor), filled once per process:

- ``effect_panels``: context an app adds to the effect page (the open case and the
  reconciliation records; the saga run), with what of it the page's poll watches;
- ``triage_panels``: the same for the triage queue (the sagas stopped for a human);
- ``effect_actions``: buttons of the effect page served by another app's services
  (reconcile, resolve, acknowledge), posted to the same ``console:effect-action`` URL;
- ``triage_includes`` / ``triage_excludes``: what else needs a human (an effect with an open
  case) and what no longer does (a failed compensation fixed by hand), as ``Q`` on Effect;
- ``triage_holders``: who is on each effect of a triage page (one query);
- ``bulk_actions``: actions on a group of the triage queue served by another app;
- ``exports``: lists of another app's pages that ``/export/<name>.<csv|jsonl>`` streams.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django import forms
    from django.db.models import Q

    from gateway.console.base import ConsoleRequest
    from gateway.models import Effect, Principal


@dataclass(frozen=True)
class Panel:
    """What an app adds to a page: ``context`` entries for the template, and ``token``, the
    part of them the page's poll compares (the page redraws when it changes)."""

    context: dict[str, Any] = field(default_factory=dict)
    token: Any = None


@dataclass(frozen=True)
class EffectAction:
    """A button of the effect page served by another app: the form it validates, the call of
    that app's service (returns what to tell the operator), and whether to show the button
    (``shown(principal, effect, page_context)``; the service decides again)."""

    form: type[forms.Form]
    run: Callable[[ConsoleRequest, Effect, dict[str, Any]], str]
    shown: Callable[[Principal, Effect, dict[str, Any]], bool]


@dataclass(frozen=True)
class BulkAction:
    """An action on a group of effects of the triage queue: its button label (with the
    count), the causes it is offered for (empty: every group), and the call, which gets the
    effect ids of the group (as many as the engineer saw) and the group, and returns what to
    tell them. ``reason``: the form asks for a reason and a confirmation (the freezes);
    ``answer``: more of the page to redraw after it (out of band), e.g. the started job's card.
    """

    label: str
    causes: frozenset[str]
    run: Callable[[ConsoleRequest, list[str], Any], str]
    tone: str = ""
    reason: bool = False
    answer: Callable[[ConsoleRequest], str] | None = None


@dataclass(frozen=True)
class Export:
    """A list the console exports (gateway.console.exports): its columns, and
    ``rows(request)``, which applies the page's own filters, tenant scope and role check when
    it is called (before the response starts) and returns the rows as an iterator that reads
    from a server-side cursor (``QuerySet.iterator(chunk_size=…)``)."""

    columns: tuple[str, ...]
    rows: Callable[[ConsoleRequest], Iterable[dict[str, Any]]]


EffectPanel = Callable[["Principal", "Effect"], Panel]
TriagePanel = Callable[["Principal"], Panel]

effect_panels: list[EffectPanel] = []
triage_panels: list[TriagePanel] = []
effect_actions: dict[str, EffectAction] = {}
# ``include(tenant_id)``: evaluated when the queue is read, so that it can be a short list of
# ids (the queue's partial index then still serves the query, OR-ed with the primary key).
triage_includes: list[Callable[[int], Q]] = []
triage_excludes: list[Callable[[], Q]] = []
triage_holders: list[Callable[[list[str]], dict[str, str]]] = []
bulk_actions: dict[str, BulkAction] = {}
# Why an approved effect would still not be dispatched (its saga is frozen): (principal,
# effects) -> {effect id: reason}, one query for all.
dispatch_blockers: list[Callable[[Principal, list[Any]], dict[str, str]]] = []
# What another app finds for the console's search box: (principal, q) -> hits.
search_hits: list[Callable[[Principal, str], list[Any]]] = []
exports: dict[str, Export] = {}


def add_effect_panel(panel: EffectPanel) -> None:
    if panel not in effect_panels:
        effect_panels.append(panel)


def add_triage_panel(panel: TriagePanel) -> None:
    if panel not in triage_panels:
        triage_panels.append(panel)


def add_effect_action(name: str, action: EffectAction) -> None:
    effect_actions[name] = action


def add_triage_predicates(
    *, include: Callable[[int], Q] | None = None, exclude: Callable[[], Q] | None = None
) -> None:
    if include is not None and include not in triage_includes:
        triage_includes.append(include)
    if exclude is not None and exclude not in triage_excludes:
        triage_excludes.append(exclude)


def add_triage_holders(holders: Callable[[list[str]], dict[str, str]]) -> None:
    if holders not in triage_holders:
        triage_holders.append(holders)


def add_bulk_action(name: str, action: BulkAction) -> None:
    bulk_actions[name] = action


def add_search(find: Callable[[Principal, str], list[Any]]) -> None:
    if find not in search_hits:
        search_hits.append(find)


def add_dispatch_blocker(blocker: Callable[[Principal, list[Any]], dict[str, str]]) -> None:
    if blocker not in dispatch_blockers:
        dispatch_blockers.append(blocker)


def add_export(name: str, export: Export) -> None:
    exports[name] = export
