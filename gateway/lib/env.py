"""Reading settings from the environment: strict parsers, and the registry of every variable
read, with its default and meaning.

``gateway/settings.py`` reads every environment variable through these helpers and passes
each one its meaning (``doc=``); the registry they fill is the source of the settings
reference (docs/reference/settings.md is generated from it), and a test fails on a variable
read without one. A malformed value stops the process with the variable's name.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured


@dataclass(frozen=True)
class EnvSetting:
    """One environment variable the settings read: what it means, and its default."""

    name: str
    kind: str
    default: Any
    doc: str
    section: str
    # The default as a reader should see it, where the value is computed (from another
    # setting or the checkout's path) rather than fixed.
    shown: str | None = None
    zero_turns_off: bool = False


# Every documented variable, in the order the settings read them.
REGISTRY: dict[str, EnvSetting] = {}
_section = ["General"]


def env_section(title: str) -> None:
    """Start a section of the settings reference: the variables read after this belong to it."""
    _section[0] = title


def _register(name: str, kind: str, default: Any, doc: str, shown: str | None, zero: bool) -> None:
    if not doc:
        # Helpers called without a meaning (tests probing the parsers) record nothing; the
        # settings reference test fails on any variable gateway/settings.py reads this way.
        return
    setting = EnvSetting(name, kind, default, doc, _section[0], shown, zero)
    known = REGISTRY.setdefault(name, setting)
    if known != setting:
        raise ImproperlyConfigured(f"{name} is read twice with different defaults or meanings")


def env_str(name: str, default: str, *, doc: str = "", shown: str | None = None) -> str:
    _register(name, "string", default, doc, shown, False)
    return os.environ.get(name, default)


def env_bool(name: str, default: bool, *, doc: str = "", shown: str | None = None) -> bool:
    _register(name, "boolean", default, doc, shown, False)
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use true/false)")


def _number(name: str, default: float, zero_turns_off: bool) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value):
        raise ImproperlyConfigured(f"{name}={raw!r} is not a finite number")
    if zero_turns_off and value == 0:
        return value
    if value <= 0:
        allowed = "positive, or 0 to turn it off" if zero_turns_off else "positive"
        raise ImproperlyConfigured(f"{name}={raw!r} must be {allowed}")
    return value


def env_number(
    name: str,
    default: float,
    *,
    zero_turns_off: bool = False,
    doc: str = "",
    shown: str | None = None,
) -> float:
    """A positive number; with ``zero_turns_off``, 0 too (the setting's "off")."""
    _register(name, "number", default, doc, shown, zero_turns_off)
    return _number(name, default, zero_turns_off)


def env_int(
    name: str,
    default: int,
    *,
    zero_turns_off: bool = False,
    doc: str = "",
    shown: str | None = None,
) -> int:
    _register(name, "integer", default, doc, shown, zero_turns_off)
    value = _number(name, default, zero_turns_off)
    if value != int(value):
        raise ImproperlyConfigured(f"{name} must be a whole number")
    return int(value)


def env_list(
    name: str, default: list[str], *, doc: str = "", shown: str | None = None
) -> list[str]:
    """A comma-separated list."""
    _register(name, "list", default, doc, shown, False)
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_names(
    name: str, default: list[str], *, doc: str = "", shown: str | None = None
) -> list[str]:
    """A list of names: a JSON list (``["a", "b"]``) or comma-separated (``a,b``)."""
    _register(name, "list", default, doc, shown, False)
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.startswith("["):
        return [item.strip() for item in raw.split(",") if item.strip()]
    try:
        names = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ImproperlyConfigured(f"{name} is not a JSON list: {exc}") from None
    if not isinstance(names, list) or not names:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a non-empty JSON list of names")
    if not all(isinstance(n, str) and n.strip() for n in names):
        raise ImproperlyConfigured(f"{name}={raw!r} is not a JSON list of names")
    return [n.strip() for n in names]


def env_json_object(name: str, *, doc: str = "", shown: str | None = None) -> dict[str, Any]:
    """A JSON object (empty when unset)."""
    _register(name, "JSON object", {}, doc, shown, False)
    try:
        value = json.loads(os.environ.get(name) or "{}")
    except json.JSONDecodeError as exc:
        raise ImproperlyConfigured(f"{name} is not a JSON object: {exc}") from None
    if not isinstance(value, dict):
        raise ImproperlyConfigured(f"{name} is not a JSON object")
    return value
