"""Side-effect contracts: every effect type the gateway executes, declared once, in code (SPEC §3).

Contracts live in contract modules (the shipped demo pack, gateway.contracts.demo, and a
team's own), named by ``GATEWAY_CONTRACT_MODULES`` and loaded once at start-up by
gateway.contracts.loading into ``CONTRACTS`` (and their adapter factories into ``ADAPTERS``).
A contract says what a command of that type looks like (its JSON Schema), who runs it (the
provider), what "done" means (completion semantics), how to find an operation again (lookup),
what to do when the outcome is uncertain (recovery), who must approve it, and how — if at all
— it is undone. The API lists them at ``GET /api/v1/effect-types``; agent tool integrations
expose ``payload_schema`` as the tool's input schema.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from gateway.choices import EffectClass
from gateway.lib import jsonin
from gateway.lib.digest import sha256_digest

if TYPE_CHECKING:
    from gateway.providers.base import ProviderAdapter, ProviderConfig

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
    "in": lambda value, options: value in options,
}


@dataclass(frozen=True)
class ApprovalPolicy:
    """Never, always, or a rule on one payload field (``amount > 10000``)."""

    mode: str  # "never" | "always" | "rule"
    description: str
    field: str | None = None
    op: str | None = None
    value: Any = None

    def requires_approval(self, payload: Mapping[str, Any]) -> bool:
        if self.mode == "always":
            return True
        if self.mode == "never":
            return False
        actual = payload.get(self.field) if self.field else None
        if actual is None:
            return True  # a rule that cannot be evaluated errs on the side of a human
        return _OPS[self.op or ""](actual, self.value)

    def as_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {"mode": self.mode, "description": self.description}
        if self.mode == "rule":
            data["rule"] = {"field": self.field, "op": self.op, "value": self.value}
        return data


NEVER = ApprovalPolicy("never", "Runs without an approver.")
ALWAYS = ApprovalPolicy("always", "Every command needs an approver.")


@dataclass(frozen=True)
class RecoveryPolicy:
    """What the gateway does with each uncertain outcome of this type."""

    max_dispatch_attempts: int = 5
    # Lookups of an UNKNOWN/IN_PROGRESS effect before it goes to the human queue.
    reconcile_budget: int = 8
    # How long the provider keeps idempotency keys: past this, "not found" proves nothing.
    key_retention: timedelta = timedelta(days=1)

    def as_data(self) -> dict[str, Any]:
        return {
            "when_confirmed": "skip: the receipt is stored, nothing is sent again",
            "when_not_started": (
                f"retry with the original idempotency key, at most "
                f"{self.max_dispatch_attempts} attempts, while unexpired and authorised"
            ),
            "when_unknown": (
                f"reconcile by lookup first; after {self.reconcile_budget} inconclusive "
                "lookups, pause and escalate to the owner"
            ),
            "max_dispatch_attempts": self.max_dispatch_attempts,
            "reconcile_budget": self.reconcile_budget,
            "key_retention_seconds": int(self.key_retention.total_seconds()),
        }


def _plain(value: Any) -> Any:
    """A rule's value as JSON can hold it (``in`` takes any collection)."""
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    return list(value) if isinstance(value, tuple) else value


# (original resource, original payload, receipt result, provider operation id)
#   -> (resource, payload) of the compensating command
CompensationBuilder = Callable[
    [Mapping[str, Any], Mapping[str, Any], Mapping[str, Any], str], tuple[dict, dict]
]


@dataclass(frozen=True)
class EffectContract:
    """One effect type's side-effect contract."""

    type: str
    provider: str
    effect_class: EffectClass
    description: str
    resource_type: str
    payload_schema: dict[str, Any]
    example: dict[str, Any]
    owner: str
    commit_semantics: str
    completion_semantics: str
    approval: ApprovalPolicy = NEVER
    recovery: RecoveryPolicy = field(default_factory=RecoveryPolicy)
    supports_idempotency: bool = True
    lookup: tuple[str, ...] = ("idempotency_key", "provider_operation_id")
    # Provider operation statuses that satisfy the completion semantics.
    completion_statuses: frozenset[str] = frozenset({"succeeded"})
    resource_version_required: bool = False
    compensator: str | None = None
    compensation_window: timedelta | None = None
    # A provider state past which compensation is manual; None: no such state.
    irreversible_boundary: str | None = None
    # True when the effect can never be undone, only followed by a correction.
    irreversible: bool = False
    # True when the compensator may be issued without a human deciding to.
    automatic_compensation: bool = True
    compensation: CompensationBuilder | None = None
    # The fields of the provider's result that the compensator (and the saga steps after it)
    # read from the receipt: what an operator who confirms the effect by hand must supply.
    # Not part of the fingerprint: it names what is read, it promises nothing new.
    receipt_fields: tuple[str, ...] = ()
    personal_fields: tuple[str, ...] = ()
    # The provider's own console for one operation, as a template of ``{base}`` (the
    # provider's URL), ``{provider_key}`` and ``{operation_id}``; None: it has none.
    console_url: str | None = None
    # Raised whenever the schema or a policy changes (a new version); every command keeps
    # the version it was submitted under (Command.contract_version).
    version: int = 1

    @cached_property
    def fingerprint(self) -> str:
        """``sha256:`` of what a version promises: the payload schema and every policy
        (approval, recovery, idempotency, completion, compensation). Not the descriptions,
        the example, the owner or the console link: changing those is not a new version."""
        return sha256_digest(
            {
                "type": self.type,
                "provider": self.provider,
                "effect_class": str(self.effect_class),
                "resource_type": self.resource_type,
                "resource_version_required": self.resource_version_required,
                "payload_schema": self.payload_schema,
                "approval": {
                    "mode": self.approval.mode,
                    "field": self.approval.field,
                    "op": self.approval.op,
                    "value": _plain(self.approval.value),
                },
                "recovery": {
                    k: v for k, v in self.recovery.as_data().items() if not k.startswith("when_")
                },
                "idempotency": [self.supports_idempotency, list(self.lookup)],
                "completion_statuses": sorted(self.completion_statuses),
                "compensator": self.compensator,
                "compensation_window": (
                    self.compensation_window.total_seconds() if self.compensation_window else None
                ),
                "irreversible": [self.irreversible, self.irreversible_boundary],
                "automatic_compensation": self.automatic_compensation,
                "personal_fields": list(self.personal_fields),
            }
        )

    @cached_property
    def payload_validator(self) -> Any:
        """The validator of ``payload_schema``, built once per process instead of at every
        submission (building it cost more than validating)."""
        return jsonin.payload_validator(self.payload_schema)

    def requires_approval(self, payload: Mapping[str, Any]) -> bool:
        return self.approval.requires_approval(payload)

    def as_data(self) -> dict[str, Any]:
        """The public description served by ``GET /api/v1/effect-types``."""
        window = self.compensation_window
        return {
            "type": self.type,
            "version": self.version,
            "fingerprint": self.fingerprint,
            "description": self.description,
            "provider": self.provider,
            "effect_class": str(self.effect_class),
            "owner": self.owner,
            "resource_type": self.resource_type,
            "resource_version_required": self.resource_version_required,
            "payload_schema": self.payload_schema,
            "example": self.example,
            "commit_semantics": self.commit_semantics,
            "completion_semantics": self.completion_semantics,
            "idempotency": {
                "supported": self.supports_idempotency,
                "lookup": list(self.lookup),
            },
            "approval": self.approval.as_data(),
            "recovery": self.recovery.as_data(),
            "compensator": self.compensator,
            "compensation_window_seconds": int(window.total_seconds()) if window else None,
            "irreversible_boundary": self.irreversible_boundary,
            "irreversible": self.irreversible,
            "automatic_compensation": self.automatic_compensation,
            "receipt_fields": list(self.receipt_fields),
            "personal_fields": list(self.personal_fields),
        }


# The loaded set: effect type -> contract, and provider name -> adapter factory. Filled in
# place at start-up by gateway.contracts.loading (``from gateway.contracts import CONTRACTS``
# stays valid); only the modules that passed every check are in them.
CONTRACTS: dict[str, EffectContract] = {}
AdapterFactory = Callable[["ProviderConfig"], "ProviderAdapter"]
ADAPTERS: dict[str, AdapterFactory] = {}


def get_contract(effect_type: str) -> EffectContract | None:
    return CONTRACTS.get(effect_type)
