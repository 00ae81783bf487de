"""Load the contract modules named by ``GATEWAY_CONTRACT_MODULES``, all or nothing per module.

A contract module is any importable module that exposes ``CONTRACTS`` (a list of
EffectContract), and optionally ``ADAPTERS`` (provider name -> adapter factory, a callable
taking gateway.providers.base.ProviderConfig) and ``FINGERPRINTS`` (effect type -> {version:
fingerprint}, the fingerprints its versions were released with). The gateway loads them once
per process (gateway.apps), checks every declaration, and keeps only the modules whose every
declaration passed: a module with one bad contract contributes nothing, and its problems are
``manage.py check`` errors (gateway.checks), which stop ``runserver``, ``migrate`` and the
workers. Nothing is loaded per call.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from gateway.contracts import _OPS, ADAPTERS, CONTRACTS, AdapterFactory, EffectContract

# Check ids, one per kind of problem (docs/guides/effect-types.md lists them).
IMPORT_FAILED = "gateway.E101"
NO_CONTRACTS = "gateway.E102"
BAD_SCHEMA = "gateway.E103"
BAD_APPROVAL = "gateway.E104"
NO_ADAPTER = "gateway.E105"
NO_COMPENSATOR = "gateway.E106"
DECLARED_TWICE = "gateway.E107"
BAD_DECLARATION = "gateway.E108"
BAD_EXAMPLE = "gateway.E109"
VERSION_NOT_RAISED = "gateway.W101"
FINGERPRINT_NOT_RECORDED = "gateway.W102"

_APPROVAL_MODES = ("never", "always", "rule")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a contract module: where (module, effect type) and what."""

    id: str
    module: str
    message: str
    type: str = ""
    hint: str = ""

    @property
    def error(self) -> bool:
        return ".E" in self.id

    def __str__(self) -> str:
        where = f"{self.module}: {self.type}" if self.type else self.module
        return f"{where}: {self.message}"


@dataclass
class Loaded:
    """The outcome of a load: the accepted modules' contracts and adapters, every problem."""

    modules: list[str]
    contracts: dict[str, EffectContract] = field(default_factory=dict)
    adapters: dict[str, AdapterFactory] = field(default_factory=dict)
    # effect type -> the module that declared it
    origin: dict[str, str] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)


@dataclass
class _Module:
    name: str
    contracts: list[EffectContract]
    adapters: dict[str, AdapterFactory]
    fingerprints: Mapping[str, Mapping[Any, str]] | None


_loaded = Loaded(modules=[])


def load(names: Iterable[str]) -> Loaded:
    """Import and check every module of ``names`` (in order: on a type declared twice, the
    first module keeps it and the later one is refused). Installs nothing."""
    if isinstance(names, str):  # a setting overridden with one string: its names
        names = [n.strip() for n in names.split(",") if n.strip()]
    result = Loaded(modules=list(names))
    if not result.modules:
        result.problems.append(
            Problem(NO_CONTRACTS, "GATEWAY_CONTRACT_MODULES", "names no contract module")
        )
    candidates: list[_Module] = []
    for name in result.modules:
        module, problems = _import(name)
        fingerprints = module.fingerprints if module is not None else None
        for contract in module.contracts if module is not None else ():
            try:
                problems += _contract_problems(name, contract, fingerprints)
            except Exception as exc:  # a value no check expected (a set in a schema, ...)
                problems.append(
                    Problem(
                        BAD_DECLARATION,
                        name,
                        f"cannot be checked: {type(exc).__name__}: {exc}",
                        contract.type,
                    )
                )
        if module is not None and not any(p.error for p in problems):
            candidates.append(module)
        result.problems += problems
    accepted = _without_twins(candidates, result.problems)
    accepted = _with_compensators(accepted, result.problems)
    for module in accepted:
        for contract in module.contracts:
            result.contracts[contract.type] = contract
            result.origin[contract.type] = module.name
        result.adapters.update(module.adapters)
    return result


def install(loaded: Loaded) -> None:
    """Make ``loaded`` the process's contracts and adapters (in place: every ``from
    gateway.contracts import CONTRACTS`` sees them)."""
    global _loaded
    CONTRACTS.clear()
    CONTRACTS.update(loaded.contracts)
    ADAPTERS.clear()
    ADAPTERS.update(loaded.adapters)
    _loaded = loaded
    from gateway.providers import registry

    registry.forget_adapters()


def load_configured() -> Loaded:
    """Load and install the modules the settings name (start-up, and a test's override)."""
    from django.conf import settings

    loaded = load(settings.GATEWAY_CONTRACT_MODULES)
    install(loaded)
    return loaded


def current() -> Loaded:
    """What this process loaded: its modules, contracts, adapters and problems."""
    return _loaded


def _import(name: str) -> tuple[_Module | None, list[Problem]]:
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # any error in a team's module is that module's problem
        return None, [
            Problem(IMPORT_FAILED, name, f"cannot be imported: {type(exc).__name__}: {exc}")
        ]
    contracts = getattr(module, "CONTRACTS", None)
    if isinstance(contracts, Mapping):
        contracts = list(contracts.values())
    if not isinstance(contracts, list | tuple) or not contracts:
        return None, [Problem(NO_CONTRACTS, name, "exposes no contracts (a list CONTRACTS)")]
    problems = [
        Problem(BAD_DECLARATION, name, f"CONTRACTS holds {item!r}, not an EffectContract")
        for item in contracts
        if not isinstance(item, EffectContract)
    ]
    adapters = getattr(module, "ADAPTERS", None) or {}
    if not isinstance(adapters, Mapping) or not all(
        isinstance(k, str) and callable(v) for k, v in adapters.items()
    ):
        problems.append(
            Problem(BAD_DECLARATION, name, "ADAPTERS is not a mapping of provider -> factory")
        )
        adapters = {}
    fingerprints = getattr(module, "FINGERPRINTS", None)
    if fingerprints is not None and not isinstance(fingerprints, Mapping):
        problems.append(Problem(BAD_DECLARATION, name, "FINGERPRINTS is not a mapping"))
        fingerprints = None
    if problems:
        return None, problems
    return _Module(name, list(contracts), dict(adapters), fingerprints), []


def _contract_problems(
    module: str, contract: EffectContract, fingerprints: Mapping[str, Mapping[Any, str]] | None
) -> list[Problem]:
    """What is wrong with one contract on its own: its schema, its approval rule, its
    example, its version (and, as warnings, its recorded fingerprint)."""

    def problem(id: str, message: str, hint: str = "") -> Problem:
        return Problem(id, module, message, contract.type, hint)

    try:
        jsonschema.Draft202012Validator.check_schema(contract.payload_schema)
    except jsonschema.SchemaError as exc:
        return [problem(BAD_SCHEMA, f"payload_schema is not valid JSON Schema: {exc.message}")]
    contract.fingerprint  # noqa: B018 - raises for a value JSON cannot hold (caller: E108)
    problems = []
    schema = contract.payload_schema
    properties = (schema.get("properties") if isinstance(schema, dict) else None) or {}
    approval = contract.approval
    if approval.mode not in _APPROVAL_MODES:
        problems.append(problem(BAD_APPROVAL, f"approval mode {approval.mode!r} is unknown"))
    elif approval.mode == "rule" and approval.field not in properties:
        problems.append(
            problem(
                BAD_APPROVAL,
                f"the approval rule reads field {approval.field!r}, which payload_schema "
                f"does not have (it has: {', '.join(sorted(properties)) or 'none'})",
            )
        )
    elif approval.mode == "rule" and approval.op not in _OPS:
        problems.append(problem(BAD_APPROVAL, f"approval operator {approval.op!r} is unknown"))
    if not isinstance(contract.version, int) or isinstance(contract.version, bool):
        problems.append(problem(BAD_DECLARATION, f"version {contract.version!r} is not an int"))
    elif contract.version < 1:
        problems.append(problem(BAD_DECLARATION, f"version {contract.version} is below 1"))
    example = contract.example.get("payload") if isinstance(contract.example, dict) else None
    if example is not None:
        error = jsonschema.exceptions.best_match(contract.payload_validator.iter_errors(example))
        if error is not None:
            problems.append(problem(BAD_EXAMPLE, f"example payload is invalid: {error.message}"))
    return problems + _fingerprint_problems(module, contract, fingerprints)


def _fingerprint_problems(
    module: str, contract: EffectContract, fingerprints: Mapping[str, Mapping[Any, str]] | None
) -> list[Problem]:
    if fingerprints is None:
        return []  # the module records no fingerprints: nothing to compare with
    recorded = (fingerprints.get(contract.type) or {}).get(contract.version)
    if recorded is None:
        return [
            Problem(
                FINGERPRINT_NOT_RECORDED,
                module,
                f"version {contract.version} has no recorded fingerprint",
                contract.type,
                hint=f'record it in FINGERPRINTS: {{{contract.version}: "{contract.fingerprint}"}}',
            )
        ]
    if recorded == contract.fingerprint:
        return []
    return [
        Problem(
            VERSION_NOT_RAISED,
            module,
            f"the schema or a policy changed but version is still {contract.version} "
            f"(recorded {recorded}, now {contract.fingerprint})",
            contract.type,
            hint=f"raise version to {contract.version + 1} and record its fingerprint "
            f'{{{contract.version + 1}: "{contract.fingerprint}"}}',
        )
    ]


def _without_twins(modules: list[_Module], problems: list[Problem]) -> list[_Module]:
    """The modules that declare no type (or provider adapter) an earlier one declared."""
    types: dict[str, str] = {}
    providers: dict[str, str] = {}
    accepted = []
    for module in modules:
        twins = []
        mine: set[str] = set()
        for contract in module.contracts:
            first = types.get(contract.type) or (module.name if contract.type in mine else "")
            if first:
                twins.append(
                    Problem(
                        DECLARED_TWICE,
                        module.name,
                        f"declared twice: {first} declares it too",
                        contract.type,
                    )
                )
            mine.add(contract.type)
        twins += [
            Problem(
                DECLARED_TWICE,
                module.name,
                f"an adapter for provider {name!r} is declared twice: "
                f"{providers[name]} declares one too",
            )
            for name in module.adapters
            if name in providers
        ]
        problems += twins
        if not twins:
            accepted.append(module)
            types.update(dict.fromkeys(mine, module.name))
            providers.update(dict.fromkeys(module.adapters, module.name))
    return accepted


def _with_compensators(modules: list[_Module], problems: list[Problem]) -> list[_Module]:
    """The modules whose every compensator names a loaded type (refusing one module can
    orphan another's compensator, so until nothing changes)."""
    while True:
        types = {c.type for m in modules for c in m.contracts}
        missing = [
            Problem(
                NO_COMPENSATOR,
                m.name,
                f"compensator {c.compensator!r} is not a loaded effect type",
                c.type,
            )
            for m in modules
            for c in m.contracts
            if c.compensator is not None and c.compensator not in types
        ]
        if not missing:
            return modules
        problems += missing
        refused = {p.module for p in missing}
        modules = [m for m in modules if m.name not in refused]


def provider_problems(loaded: Loaded, urls: Mapping[str, str]) -> list[Problem]:
    """The loaded contracts whose provider has neither an adapter nor a URL: nothing could
    send them (the URL is deployment configuration, checked against the current settings)."""
    return [
        Problem(
            NO_ADAPTER,
            loaded.origin[contract.type],
            f"provider {contract.provider!r} has no adapter (ADAPTERS of a contract module) "
            "and no URL in GATEWAY_PROVIDER_URLS",
            contract.type,
            hint=f'set GATEWAY_PROVIDER_URLS to include "{contract.provider}" (SPEC §6 '
            "adapter), or declare an adapter for it in a contract module",
        )
        for contract in loaded.contracts.values()
        if contract.provider not in loaded.adapters and not urls.get(contract.provider)
    ]
