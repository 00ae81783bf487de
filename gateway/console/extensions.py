"""What reconciliation and sagas add to the ledger's console pages, registered in their
``AppConfig.ready()``: the ledger's pages never import those apps.

An explicit registry (``grep effect_panels`` finds every contributor), filled once per process:

- ``effect_panels``: context an app adds to the effect page (the open case and the
  reconciliation records; the saga run), with what of it the page's poll watches;
- ``triage_panels``: the same for the triage queue (the sagas stopped for a human);
- ``effect_actions``: buttons of the effect page served by another app's services
  (reconcile, resolve, acknowledge), posted to the same ``console:effect-action`` URL.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django import forms

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


EffectPanel = Callable[["Principal", "Effect"], Panel]
TriagePanel = Callable[["Principal"], Panel]

effect_panels: list[EffectPanel] = []
triage_panels: list[TriagePanel] = []
effect_actions: dict[str, EffectAction] = {}


def add_effect_panel(panel: EffectPanel) -> None:
    if panel not in effect_panels:
        effect_panels.append(panel)


def add_triage_panel(panel: TriagePanel) -> None:
    if panel not in triage_panels:
        triage_panels.append(panel)


def add_effect_action(name: str, action: EffectAction) -> None:
    effect_actions[name] = action
