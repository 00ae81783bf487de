"""Providers as the deployment configures them (``GATEWAY_PROVIDERS``): per provider, which
adapter, its base URL, its timeout, where its credential is kept, and the adapter's options.

One entry, in the setting's JSON object under the provider's name::

    {"adapter": "stripe", "base_url": "https://api.stripe.com", "timeout": 20,
     "credential": {"env": "STRIPE_SECRET_KEY"}, "options": {"default_source": "tok_visa"},
     "rate_limit": "25/s", "max_in_flight": 8, "circuit": {"failures": 5, "open_seconds": 30}}

``rate_limit``, ``max_in_flight`` and ``circuit`` protect the provider (gateway.providers.
protection): every worker together sends at most that many calls per period, holds at most
that many calls in flight, and stops sending after that many failures in a row.

``adapter`` is a built-in kind (``ADAPTER_KINDS``) or the dotted path of a factory taking a
``ProviderConfig``; left out, the provider's contract-module factory serves it if its pack has
one, else the SPEC §6 adapter. The credential names where the secret is kept (``{"env":
NAME}`` or ``{"file": PATH}``), never the secret itself; it is read when the adapter is built,
kept only by the adapter, and shown only as a fingerprint (``fingerprint``). A provider the
setting does not name keeps its ``GATEWAY_PROVIDER_URLS`` entry and the SPEC §6 adapter.

``entry_problems`` says what is wrong with an entry (the start-up checks, gateway.checks);
``parse_entry`` reads one for the registry, raising ImproperlyConfigured on the same problems.
"""

from __future__ import annotations

import hashlib
import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from gateway.providers.base import ProviderConfig
from gateway.providers.gates import Rate, parse_rate

# Built-in adapter kinds -> the factory that builds one from a ProviderConfig. "rest" is the
# declarative REST adapter (gateway.providers.rest), through ``rest_from_config``.
ADAPTER_KINDS: dict[str, str] = {
    "http": "gateway.providers.http.from_config",
    "stripe": "gateway.providers.stripe.from_config",
    "smtp": "gateway.providers.smtp.from_config",
    "rest": "gateway.providers.config.rest_from_config",
}
# The options each built-in kind reads (anything else is a typo, refused at start-up).
KIND_OPTIONS: dict[str, frozenset[str] | None] = {
    "http": frozenset(),
    "stripe": frozenset({"default_source", "charge_customer", "lookup_max_pages"}),
    "smtp": frozenset(
        {
            "from_address",
            "starttls",
            "username",
            "message_id_domain",
            "archive_address",
            "ca_file",
            "local_hostname",
            "imap",
        }
    ),
    "rest": frozenset(
        {"spec", "spec_file", "headers", "ca_certs", "credential_header", "credential_scheme"}
    ),
}
_KEYS = frozenset(
    {"adapter", "base_url", "timeout", "credential", "options", "rate_limit", "max_in_flight",
     "circuit"}
)  # fmt: skip
_CIRCUIT_KEYS = frozenset({"failures", "open_seconds"})


@dataclass(frozen=True)
class ProviderEntry:
    """One provider's ``GATEWAY_PROVIDERS`` entry, read and checked (no secret in it)."""

    name: str
    adapter: str  # a kind of ADAPTER_KINDS, a dotted factory path, or "" (the pack's, or http)
    base_url: str
    timeout: float | None
    credential_env: str = ""
    credential_file: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)
    # Protection (gateway.providers.protection): None for "not limited" / "the default".
    rate_limit: Rate | None = None
    max_in_flight: int | None = None
    circuit_failures: int | None = None
    circuit_open_seconds: float | None = None

    @property
    def has_credential(self) -> bool:
        return bool(self.credential_env or self.credential_file)

    def read_credential(self) -> str:
        """The secret, from the environment or its file; ImproperlyConfigured naming where it
        was looked for (never what was found) when it is not there."""
        where = f"provider {self.name!r}: credential"
        if self.credential_env:
            value = os.environ.get(self.credential_env, "")
            if not value.strip():
                raise ImproperlyConfigured(
                    f"{where}: environment variable {self.credential_env} is not set or empty"
                )
            return value.strip()
        if self.credential_file:
            path = Path(self.credential_file)
            try:
                value = path.read_text(encoding="utf-8")
            except FileNotFoundError:
                raise ImproperlyConfigured(f"{where}: no file at {path}") from None
            except (OSError, UnicodeDecodeError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
                raise ImproperlyConfigured(f"{where}: cannot read {path} ({reason})") from None
            if not value.strip():
                raise ImproperlyConfigured(f"{where}: the file {path} is empty")
            return value.strip()
        return ""


def fingerprint(secret: str) -> str:
    """What may be shown of a credential: ``sha256:`` and the first 12 hex digits of its
    SHA-256, and its last 4 characters when it is long enough (16 or more) for those not to
    give much of it away. "" for no credential."""
    if not secret:
        return ""
    digest = hashlib.sha256(secret.encode()).hexdigest()[:12]
    return f"sha256:{digest}…{secret[-4:]}" if len(secret) >= 16 else f"sha256:{digest}"


def resolve_factory(adapter: str) -> Callable[..., Any]:
    """The factory an ``adapter`` value names; ImproperlyConfigured when there is none."""
    path = ADAPTER_KINDS.get(adapter, adapter)
    module_name, _, attribute = path.rpartition(".")
    if not module_name:
        kinds = ", ".join(sorted(ADAPTER_KINDS))
        raise ImproperlyConfigured(
            f"unknown adapter {adapter!r}: use one of {kinds}, or the dotted path of a factory"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        what = f"adapter kind {adapter!r}" if adapter in ADAPTER_KINDS else f"{path!r}"
        raise ImproperlyConfigured(
            f"{what}: module {module_name} cannot be imported ({exc})"
        ) from None
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise ImproperlyConfigured(f"{path!r}: {module_name} has no callable {attribute!r}")
    return factory


def _credential_problems(name: str, credential: Any) -> tuple[str, str, list[str]]:
    """(env name, file path, problems) of an entry's ``credential``. The message never
    repeats the value: an inline secret must not reach a log through its own error."""
    inline = (
        f"provider {name!r}: credential must say where the secret is kept, "
        '{"env": "VARIABLE"} or {"file": "/path"}, never the secret itself'
    )
    if credential is None:
        return "", "", []
    if not isinstance(credential, dict) or len(credential) != 1:
        return "", "", [inline]
    ((kind, value),) = credential.items()
    if kind not in ("env", "file") or not isinstance(value, str) or not value.strip():
        return "", "", [inline]
    return (value.strip(), "", []) if kind == "env" else ("", value.strip(), [])


def _entry_fields(name: str, raw: Any) -> tuple[ProviderEntry | None, list[str]]:
    """The entry's fields as typed values, or the problems of its shape."""
    if not isinstance(raw, dict):
        return None, [f"provider {name!r}: the entry must be a JSON object"]
    problems = [
        f"provider {name!r}: unknown key {key!r} (known: {', '.join(sorted(_KEYS))})"
        for key in sorted(set(raw) - _KEYS)
    ]
    adapter, base_url = raw.get("adapter", ""), raw.get("base_url", "")
    timeout, options = raw.get("timeout"), raw.get("options", {})
    if not isinstance(adapter, str):
        problems.append(f"provider {name!r}: adapter must be a string")
    if not isinstance(base_url, str):
        problems.append(f"provider {name!r}: base_url must be a string")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
    ):
        problems.append(f"provider {name!r}: timeout must be a positive number of seconds")
    elif timeout is not None and 2 * timeout >= settings.GATEWAY_DISPATCH_LEASE:
        problems.append(
            f"provider {name!r}: timeout {timeout:g}s must be under half of "
            f"GATEWAY_DISPATCH_LEASE ({settings.GATEWAY_DISPATCH_LEASE:g}s)"
        )
    if not isinstance(options, dict):
        problems.append(f"provider {name!r}: options must be a JSON object")
    env, path, credential_problems = _credential_problems(name, raw.get("credential"))
    problems += credential_problems
    protection, protection_problems = _protection_fields(name, raw)
    problems += protection_problems
    if problems:
        return None, problems
    entry = ProviderEntry(
        name, adapter.strip(), base_url.strip(), timeout, env, path, dict(options), **protection
    )
    return entry, []


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _protection_fields(name: str, raw: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The entry's ``rate_limit`` ("50/s"), ``max_in_flight`` (calls at once, across workers)
    and ``circuit`` (``{"failures": 5, "open_seconds": 30}``), or their problems."""
    fields: dict[str, Any] = {}
    problems: list[str] = []
    if raw.get("rate_limit") is not None:
        try:
            fields["rate_limit"] = parse_rate(raw["rate_limit"])
        except ValueError as exc:
            problems.append(f"provider {name!r}: rate_limit {exc}")
    if raw.get("max_in_flight") is not None:
        if _positive_int(raw["max_in_flight"]):
            fields["max_in_flight"] = raw["max_in_flight"]
        else:
            problems.append(f"provider {name!r}: max_in_flight must be a positive whole number")
    circuit = raw.get("circuit", {})
    if not isinstance(circuit, dict) or set(circuit) - _CIRCUIT_KEYS:
        problems.append(
            f"provider {name!r}: circuit must be a JSON object with failures and open_seconds"
        )
        return fields, problems
    if "failures" in circuit:
        if _positive_int(circuit["failures"]):
            fields["circuit_failures"] = circuit["failures"]
        else:
            problems.append(f"provider {name!r}: circuit.failures must be a positive whole number")
    seconds = circuit.get("open_seconds")
    if seconds is not None:
        if isinstance(seconds, int | float) and not isinstance(seconds, bool) and seconds > 0:
            fields["circuit_open_seconds"] = float(seconds)
        else:
            problems.append(f"provider {name!r}: circuit.open_seconds must be a positive number")
    return fields, problems


def entry_problems(name: str, raw: Any) -> list[str]:
    """Everything wrong with one entry, each naming the provider: its shape, an adapter that
    does not resolve, a missing base URL, an option its kind does not read, a credential that
    cannot be read."""
    entry, problems = _entry_fields(name, raw)
    if entry is None:
        return problems
    if entry.adapter:
        try:
            resolve_factory(entry.adapter)
        except ImproperlyConfigured as exc:
            problems.append(f"provider {name!r}: {exc}")
    if entry.adapter in ADAPTER_KINDS and not entry.base_url:
        problems.append(f"provider {name!r}: base_url is missing (adapter {entry.adapter!r})")
    known = KIND_OPTIONS.get(entry.adapter)  # None: a factory that checks its own options
    if known is not None:
        readable = ", ".join(sorted(known)) or "none"
        problems += [
            f"provider {name!r}: option {option!r} is not one the {entry.adapter} adapter "
            f"reads (it reads: {readable})"
            for option in sorted(set(entry.options) - known)
        ]
    try:
        entry.read_credential()
    except ImproperlyConfigured as exc:
        problems.append(str(exc))
    return problems


def parse_entry(name: str, raw: Any) -> ProviderEntry:
    """The entry, or ImproperlyConfigured with its shape's problems (the rest are found when
    the adapter is built)."""
    entry, problems = _entry_fields(name, raw)
    if entry is None:
        raise ImproperlyConfigured(f"GATEWAY_PROVIDERS: {'; '.join(problems)}")
    return entry


def rest_from_config(config: ProviderConfig) -> Any:
    """The declarative REST adapter of a ``GATEWAY_PROVIDERS`` entry (``"adapter": "rest"``):
    its options ``spec`` or ``spec_file`` (the declaration), ``headers`` and ``ca_certs`` go
    to ``gateway.providers.rest.adapter_from_config`` with the entry's base URL and timeout;
    the credential goes as one more header, ``credential_header`` (``Authorization``) with
    ``credential_scheme`` (``Bearer``; "" sends the secret alone) before it."""
    from gateway.providers import rest  # type: ignore[attr-defined,unused-ignore]

    options = dict(config.options)
    header = str(options.pop("credential_header", "Authorization"))
    scheme = str(options.pop("credential_scheme", "Bearer"))
    headers = dict(options.pop("headers", {}) or {})
    if config.credential:
        headers[header] = f"{scheme} {config.credential}" if scheme else config.credential
    entry = {**options, "base_url": config.base_url, "timeout": config.timeout}
    if headers:
        entry["headers"] = headers
    return rest.adapter_from_config(config.name, entry)
