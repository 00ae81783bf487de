"""docs/reference/statuses.md: the statuses, transition tables and named sets of
gateway/choices.py and sagas/choices.py, and the vocabularies of reconciliation."""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from types import ModuleType

from django.db import models

from scripts.docs_reference.markdown import code, header, table

INTRO = """
An effect's status and a saga's state change only along their transition table: the services'
compare-and-set guard, the console's colours and the tests all read the same table. The named
sets group statuses by what the code does with them.
"""


def _sets(module: ModuleType, members: list[str]) -> list[tuple[str, list[str]]]:
    """The module's named frozensets of these values (TERMINAL, UNCERTAIN, …), in definition
    order, each in the vocabulary's order."""
    found = []
    for name, value in vars(module).items():
        if name.isupper() and isinstance(value, frozenset) and value and value <= set(members):
            found.append((name, sorted(value, key=members.index)))
    return found


def _transitions(
    choices: type[models.TextChoices], table_: Mapping[str, frozenset[str]], tone: Mapping
) -> str:
    order = [choice.value for choice in choices]
    comments = value_comments(choices)
    headers = ["from", "may move to", "console tone"] + (["meaning"] if comments else [])
    rows = []
    for status in choices:
        targets = sorted(table_[status], key=order.index)
        row = [
            code(status.value),
            ", ".join(code(target) for target in targets) or "— (terminal)",
            tone.get(status, ""),
        ]
        rows.append(row + ([comments.get(status.value, "")] if comments else []))
    return table(headers, rows)


def set_comments(module: ModuleType) -> dict[str, str]:
    """The comment lines just above each top-level assignment of the module."""
    comments: dict[str, str] = {}
    above: list[str] = []
    for line in inspect.getsource(module).splitlines():
        if line.startswith("#"):
            above.append(line.lstrip("# "))
            continue
        assignment = re.match(r"([A-Z_]+)(?::[^=]*)? = ", line)
        if assignment and above:
            comments[assignment.group(1)] = " ".join(above)
        above = []
    return comments


def _named_sets(module: ModuleType, choices: type[models.TextChoices]) -> str:
    comments = set_comments(module)
    rows = [
        [code(name), ", ".join(code(status) for status in members), comments.get(name, "")]
        for name, members in _sets(module, [choice.value for choice in choices])
    ]
    return table(["set", "statuses", "meaning"], rows)


def value_comments(choices: type[models.TextChoices]) -> dict[str, str]:
    """Each member's comment in the class's source: the one on its line, or the lines of
    comment just above it."""
    comments: dict[str, str] = {}
    above: list[str] = []
    for line in inspect.getsource(choices).splitlines()[1:]:
        text = line.strip()
        if text.startswith("#"):
            above.append(text.lstrip("# "))
            continue
        member = re.match(r"([A-Z_]+) = .*?(?:#\s*(.*))?$", text)
        if member and member.group(1) in choices.__members__:
            value = choices[member.group(1)].value
            comments[value] = " ".join([*above, member.group(2) or ""]).strip()
        above = []
    return comments


def _vocabulary(module: ModuleType, choices: type[models.TextChoices]) -> str:
    doc = (choices.__doc__ or "").strip()
    values = [choice.value for choice in choices if choice.value]
    lead = f"{doc}\n\n" if doc and not doc.startswith("An enumeration") else ""
    text = f"### `{choices.__module__}.{choices.__name__}`\n\n{lead}"
    comments = value_comments(choices)
    if any(comments.get(value) for value in values):
        text += table(["value", "meaning"], ([code(v), comments.get(v, "")] for v in values))
    else:
        text += "Values: " + ", ".join(code(value) for value in values) + ".\n"
    for name, members in _sets(module, values):
        text += f"\n- {code(name)}: " + ", ".join(code(member) for member in members)
    return text + "\n"


def _vocabularies(module: ModuleType, skip: type[models.TextChoices] | None = None) -> str:
    classes = {
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, models.TextChoices)
        and value.__module__ == module.__name__
        and value is not skip
    }
    ordered = sorted(classes, key=lambda cls: list(vars(module).values()).index(cls))
    return "\n".join(_vocabulary(module, choices) for choices in ordered)


def render() -> str:
    from gateway import choices as gateway_choices
    from reconciliation import choices as reconciliation_choices
    from sagas import choices as saga_choices

    parts = [
        header("Statuses and transitions", INTRO, "`gateway/choices.py`, `sagas/choices.py`"),
        "## Effect statuses\n",
        "`gateway.choices.EffectStatus`, with `ALLOWED_TRANSITIONS`:\n",
        _transitions(
            gateway_choices.EffectStatus,
            gateway_choices.ALLOWED_TRANSITIONS,
            gateway_choices.STATUS_TONE,
        ),
        "### Named sets of effect statuses\n",
        _named_sets(gateway_choices, gateway_choices.EffectStatus),
        "## Saga states\n",
        "`sagas.choices.SagaState`, with `sagas.choices.ALLOWED_TRANSITIONS`. `frozen` is not a "
        "state: it is a flag on the run that stops the orchestrator and every dispatch.\n",
        _transitions(
            saga_choices.SagaState, saga_choices.ALLOWED_TRANSITIONS, saga_choices.STATE_TONE
        ),
        "### Named sets of saga states\n",
        _named_sets(saga_choices, saga_choices.SagaState),
        "## Other vocabularies\n",
        "The values stored beside the statuses: roles, outcomes, attempts and approvals of "
        "the ledger; lookups, cases and receipts of reconciliation; triggers and tasks of "
        "sagas.\n",
        _vocabularies(gateway_choices, gateway_choices.EffectStatus),
        _vocabularies(reconciliation_choices),
        _vocabularies(saga_choices, saga_choices.SagaState),
    ]
    return "\n".join(parts)
