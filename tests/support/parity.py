"""Run the same scenario through the ledger's ORM path and its fast path, and describe what
each wrote so that the two descriptions are equal exactly when the writes are.

A scenario runs twice, each time in a savepoint that is rolled back afterwards, on a frozen
clock (``django.utils.timezone.now``) and a deterministic sandbox (its operation ids, result
tokens and times), once with ``GATEWAY_FAST_PATH`` off and once on. What is compared:

- every row of every table of the project, before and after (the rows the run wrote or
  changed, and those it left alone), column by column. Identifiers a run draws anew are named
  by what they belong to: an effect id by its command's (tenant, key), a provider's operation
  id by the key it was sent with, another drawn id by its row's place among the new rows of
  its table (sorted by content); inside strings and JSON too. A number the database draws
  (an auto-incremented id) is left out; a reference to such a row names the row.
  Some columns differ by design and are replaced by what they must prove: a sealed payload
  by the payload it opens to (the seal binds the effect id, and its nonce is random), a
  receipt's seal by whether it verifies, a transaction id (``txid``) by nothing.
- every log line of the project's loggers: logger, level, message and every extra field.
- what the scenario returned (statuses, ``created``, the error raised).
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.apps import apps
from django.db import models, transaction
from django.utils import timezone

from gateway import fastpath, trust
from gateway.checkpoints import receipt_seal
from gateway.integrity import open_command_payload
from gateway.lib.digest import sha256_digest
from gateway.lib.vault import SealBroken
from gateway.models import Command, Receipt
from gateway.providers import protection

PROJECT_APPS = ("gateway", "reconciliation", "sagas", "webhooks", "agent_hooks")
PROJECT_LOGGERS = ("gateway", "reconciliation", "sagas")
_PLAIN_RECORD = set(logging.LogRecord("x", 0, "x", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


class Clock:
    """``timezone.now`` held still, moved only by ``advance``."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@dataclass
class Outcome:
    """What one run of a scenario left behind, described path-independently."""

    result: Any
    rows: dict[str, list[dict[str, Any]]]
    logs: list[tuple[Any, ...]]
    on_commit: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


def project_models() -> list[type[models.Model]]:
    return [m for m in apps.get_models() if m._meta.app_label in PROJECT_APPS]


def _pks() -> set[tuple[str, Any]]:
    return {
        (model._meta.label, pk)
        for model in project_models()
        for pk in model.objects.values_list("pk", flat=True)
    }


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def captured_logs() -> Iterator[list[logging.LogRecord]]:
    """Every record of the project's loggers, at any level."""
    handler = _Records()
    loggers = [logging.getLogger(name) for name in PROJECT_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    try:
        yield handler.records
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)


class _Rollback(Exception):
    pass


def run_both(scenario: Callable[[Clock], Any], *, settings, sandbox) -> tuple[Outcome, Outcome]:
    """The scenario through the ORM path, then through the fast path; each rolled back."""
    start = timezone.now()
    outcomes = []
    for fast in (False, True):
        settings.GATEWAY_FAST_PATH = fast
        with pytest.MonkeyPatch.context() as monkeypatch:
            outcomes.append(_run(scenario, Clock(start), monkeypatch=monkeypatch, sandbox=sandbox))
    return outcomes[0], outcomes[1]


def _run(scenario, clock: Clock, *, monkeypatch, sandbox) -> Outcome:
    fastpath.known_keys.clear()
    trust.clear()
    sandbox.reset()
    protection.reset()  # the providers' circuits and limits (Redis), like the sandbox
    _deterministic_sandbox(monkeypatch)
    random.seed(31)  # the backoffs' jitter
    monkeypatch.setattr(timezone, "now", clock)
    outcome: Outcome | None = None
    before = _pks()
    try:
        with transaction.atomic(), captured_logs() as records:
            callbacks = len(transaction.get_connection().run_on_commit)
            try:
                result: Any = scenario(clock)
            except Exception as error:  # the scenario's answer: compared like a result
                result = ("raised", type(error).__name__, str(error))
            describe = Describer(before, sandbox.operations())
            outcome = Outcome(
                result=describe.value(result),
                rows=describe.rows(),
                logs=[],
            )
            outcome.on_commit = sorted(
                line
                for _, func, _ in transaction.get_connection().run_on_commit[callbacks:]
                for line in describe.callbacks(func)
            )
            outcome.logs = [describe.log(record) for record in records]
            raise _Rollback
    except _Rollback:
        pass
    assert outcome is not None
    return outcome


def _deterministic_sandbox(monkeypatch) -> None:
    """The sandbox's operation ids, result tokens and times, the same in both runs."""
    from gateway.providers.sandbox import provider

    counter = itertools.count(1)
    tokens = random.Random(7)
    monkeypatch.setattr(provider, "new_id", lambda prefix: f"{prefix}_{next(counter):04d}")
    monkeypatch.setattr(provider, "_now", lambda: "2026-01-01T00:00:00.000Z")
    monkeypatch.setattr(
        provider,
        "secrets",
        SimpleNamespace(
            token_hex=lambda n=8: tokens.getrandbits(8 * n).to_bytes(n).hex(),
            randbelow=tokens.randrange,
        ),
    )


def _drawn(field: models.Field) -> bool:
    """A primary key the database numbers (its value says only when the row was written)."""
    return isinstance(field, models.AutoField | models.BigAutoField)


class Describer:
    """Names the identifiers a run drew anew, and describes rows, values and log records
    with those names."""

    def __init__(self, before: set[tuple[str, Any]], operations: list[dict[str, Any]]) -> None:
        self.before = before
        # The provider's operations, named by the key they were sent with (a drain sends
        # concurrently: which one the sandbox numbered first is chance).
        self.results = {op["id"]: op["result"] for op in operations}
        self.strings: dict[str, str] = {
            op["id"]: f"<operation {op['idempotency_key']}>" for op in operations
        }
        self.raw = {
            model._meta.label: list(
                model.objects.order_by("pk").values(
                    *(f.attname for f in model._meta.concrete_fields)
                )
            )
            for model in project_models()
        }
        self.names: dict[tuple[str, Any], str] = {}
        self._name_effects()
        for model in project_models():
            self._name_new_rows(model)

    def _new(self, label: str, model: type[models.Model]) -> list[dict[str, Any]]:
        pk = model._meta.pk.attname
        return [row for row in self.raw[label] if (label, row[pk]) not in self.before]

    def _name_effects(self) -> None:
        """Each new effect by its command's (tenant, key); a key that names another new effect
        (a compensation's) once that one has its name."""
        unnamed = {row["effect_id"]: row for row in self._new("gateway.Command", Command)}
        while unnamed:
            ready = [
                row
                for row in unnamed.values()
                if not any(other in row["idempotency_key"] for other in unnamed)
            ]
            assert ready, "keys that name each other"
            for row in ready:
                name = f"<effect {row['tenant_id']}:{self.value(row['idempotency_key'])}>"
                self.names[("gateway.Command", row["effect_id"])] = name
                self.names[("gateway.Effect", row["effect_id"])] = name
                self.strings[row["effect_id"]] = name
                del unnamed[row["effect_id"]]

    def _name_new_rows(self, model: type[models.Model]) -> None:
        label, pk = model._meta.label, model._meta.pk
        if pk.is_relation:  # named by what it points at (an effect: its command)
            return
        new = [row for row in self._new(label, model) if (label, row[pk.attname]) not in self.names]
        ordered = sorted(new, key=lambda row: repr(self._row(model, row, skip_pk=True)))
        for index, row in enumerate(ordered):
            name = f"<{label} {index}>"
            self.names[(label, row[pk.attname])] = name
            if isinstance(row[pk.attname], str):
                self.strings[row[pk.attname]] = name

    def rows(self) -> dict[str, list[dict[str, Any]]]:
        described = {}
        for model in project_models():
            label = model._meta.label
            rows = [self._row(model, row) for row in self.raw[label]]
            if label == "gateway.EffectEvent":
                self._number_events(rows, self.raw[label])
            described[label] = sorted(rows, key=repr)
        return described

    @staticmethod
    def _number_events(rows: list[dict], raw: list[dict]) -> None:
        """Each event's place in its effect's timeline (raw rows are in id order)."""
        seen: dict[Any, int] = {}
        for row, source in zip(rows, raw, strict=True):
            seen[source["effect_id"]] = seen.get(source["effect_id"], 0) + 1
            row["_place"] = seen[source["effect_id"]]

    def _row(self, model, row: dict[str, Any], *, skip_pk: bool = False) -> dict[str, Any]:
        label = model._meta.label
        out: dict[str, Any] = {}
        for f in model._meta.concrete_fields:
            value = row[f.attname]
            if f.attname == "txid" or (f.primary_key and (skip_pk or _drawn(f))):
                continue  # a row drawn anew is compared by its content, not its number
            if f.primary_key and not f.is_relation:
                out[f.attname] = self.names.get((label, value), value)
            elif f.is_relation and value is not None:
                target = f.related_model._meta.label
                out[f.attname] = self.names.get((target, value), self.value(value))
            else:
                out[f.attname] = self._special(model, f.attname, row) or self.value(value)
        return out

    def _special(self, model, name: str, row: dict[str, Any]) -> Any:
        if model is Command and name == "payload_sealed":
            try:
                return ("opens to", open_command_payload(Command(**row)))
            except SealBroken as broken:
                return ("does not open", str(broken))
        if name.endswith("_sealed"):
            return "<sealed>"
        if model is Receipt and name == "result":
            same = row["result"] == self.results.get(row["provider_operation_id"])
            return "<the provider's result>" if same else ("<not the provider's>", row["result"])
        if model is Receipt and name == "result_digest":
            same = row["result_digest"] == sha256_digest(row["result"])
            return "<the result's digest>" if same else ("<not its digest>", row["result_digest"])
        if model is Receipt and name == "seal":
            fields = {k: v for k, v in row.items() if k != "id"}
            return "<seal verifies>" if receipt_seal(Receipt(**fields)) == row["seal"] else "<bad>"
        return None

    def value(self, value: Any) -> Any:
        """A value with the run's new string ids named, inside strings and JSON too."""
        if isinstance(value, str):
            for raw, name in self.strings.items():
                if raw in value:
                    value = value.replace(raw, name)
            return value
        if isinstance(value, dict):
            return {self.value(k): self.value(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self.value(v) for v in value)
        if isinstance(value, (bytes, memoryview)):
            return bytes(value)
        return value

    def callbacks(self, func: Callable[[], Any]) -> list[str]:
        """An after-commit callback: what it calls, with which arguments. The publication of
        status changes (``moves.after_commit``) one entry per effect: the ORM path publishes
        each transition on its own, the fast path the effects of a statement together."""
        if getattr(func, "__qualname__", "") == "after_commit.<locals>.<lambda>":
            cells = dict(zip(func.__code__.co_freevars, func.__closure__ or (), strict=True))
            return [f"moves.published({self.value(i)})" for i in cells["ids"].cell_contents]
        return [self.callback(func)]

    def callback(self, func: Callable[[], Any]) -> str:
        args: tuple[Any, ...] = ()
        while isinstance(func, functools.partial):
            args = func.args + args
            func = func.func
        target = getattr(func, "__self__", None)
        name = getattr(func, "__qualname__", repr(func))
        if target is not None:  # a bound method: a Sender's send, e.g.
            name = f"{getattr(target, 'name', type(target).__name__)}.{name}"
        described = [
            self.value(arg if isinstance(arg, str) else self.callback(arg)) for arg in args
        ]
        return f"{name}({', '.join(map(str, described))})"

    def log(self, record: logging.LogRecord) -> tuple[Any, ...]:
        extras = {
            key: self.value(value)
            for key, value in record.__dict__.items()
            if key not in _PLAIN_RECORD
        }
        return (
            record.name,
            record.levelname,
            self.value(record.getMessage()),
            json.dumps(extras, sort_keys=True, default=str),
            record.exc_info is not None,
        )


def differences(orm: Outcome, fast: Outcome) -> list[str]:
    """What differs between the two runs, table by table and column by column."""
    found = []
    if orm.on_commit != fast.on_commit:
        found.append(f"after commit: ORM {orm.on_commit} != fast {fast.on_commit}")
    if orm.result != fast.result:
        found.append(f"result: ORM {orm.result!r} != fast {fast.result!r}")
    for label in orm.rows:
        only_orm = [row for row in orm.rows[label] if row not in fast.rows[label]]
        only_fast = [row for row in fast.rows[label] if row not in orm.rows[label]]
        if len(only_orm) == len(only_fast) == 1:  # one row differs: say which columns
            row_a, row_b = only_orm[0], only_fast[0]
            found.extend(
                f"{label}.{column}: ORM {row_a.get(column)!r} != fast {row_b.get(column)!r}"
                for column in sorted(set(row_a) | set(row_b))
                if row_a.get(column) != row_b.get(column)
            )
            continue
        found.extend(f"{label}: only the ORM path wrote {row}" for row in only_orm)
        found.extend(f"{label}: only the fast path wrote {row}" for row in only_fast)
    if sorted(orm.logs) != sorted(fast.logs):
        only_orm = [line for line in orm.logs if line not in fast.logs]
        only_fast = [line for line in fast.logs if line not in orm.logs]
        found.append(f"logs: ORM only {only_orm}, fast only {only_fast}")
    return found
