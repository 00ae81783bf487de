"""Saga definitions: multi-step flows, declared once, in code (SPEC §5 "Sagas").

A definition names its inputs (a JSON Schema, with a valid example) and its steps, in order.
Each step says which effect type it issues, how the command's resource (with the version it
expects to change) and payload are built from the inputs and the receipts of the steps
before it, what must hold before it is issued, and what a failure of it triggers.

How a confirmed step is undone is *not* declared here: it is its contract's (compensator,
window, irreversible boundary, owner; gateway.contracts), read through ``Step.compensation``,
so a saga can never undo an effect differently from an operator pressing "compensate".
The API lists the definitions at ``GET /api/v1/saga-definitions``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import jsonschema

from gateway.contracts import EffectContract, get_contract
from gateway.lib import jsonin
from gateway.submission import DEFAULT_EXPIRES_IN
from sagas.choices import FailureAction, Trigger

# --- what a step can read -------------------------------------------------------------------


@dataclass(frozen=True)
class StepReceipt:
    """The provider's receipt of a confirmed step, as later steps may read it."""

    provider_operation_id: str
    provider_status: str
    result: Mapping[str, Any]


@dataclass(frozen=True)
class StepContext:
    """The inputs of the run and the receipts of its confirmed steps, by step name."""

    saga_id: str
    inputs: Mapping[str, Any]
    receipts: Mapping[str, StepReceipt]

    def result(self, step: str) -> Mapping[str, Any]:
        receipt = self.receipts.get(step)
        return receipt.result if receipt else {}


# (context) -> (resource, payload) of the step's command
Build = Callable[[StepContext], tuple[dict[str, Any], dict[str, Any]]]


@dataclass(frozen=True)
class Precondition:
    """What must hold before a step is issued, in words and as a check."""

    description: str
    check: Callable[[StepContext], bool]

    def unmet(self, context: StepContext) -> str | None:
        """None when it holds, else the reason the step is not issued."""
        return None if self.check(context) else f"precondition not met: {self.description}"


def receipt_has(step: str, name: str) -> Precondition:
    """The receipt of ``step`` carries a non-empty ``name`` (an id the next step needs)."""
    return Precondition(
        f"the receipt of {step} has {name!r}",
        lambda context: bool(context.result(step).get(name)),
    )


@dataclass(frozen=True)
class FailurePolicy:
    """What each trigger does when a step fails: compensate the confirmed steps before it
    (in reverse order), or pause the run for an operator to resume or cancel."""

    pause_on: frozenset[str] = frozenset()
    description: str = "Any failure compensates the confirmed steps, newest first."

    def action(self, trigger: str) -> str:
        if trigger in self.pause_on and trigger != Trigger.ABANDONED:
            return FailureAction.PAUSE
        return FailureAction.COMPENSATE

    def as_data(self) -> dict[str, Any]:
        return {
            "description": self.description,
            "triggers": {trigger: str(self.action(trigger)) for trigger in Trigger.values},
        }


COMPENSATE_ON_FAILURE = FailurePolicy()
PAUSE_ON_STALE_VERSION = FailurePolicy(
    pause_on=frozenset({Trigger.PRECONDITION_FAILED}),
    description=(
        "A stale expected revision (or an unmet precondition) pauses the run for an operator: "
        "someone else changed the service, and undoing ours would not fix that. Resume after "
        "the fix re-issues the step as a new revision; cancel with compensate undoes the rest. "
        "Any other failure compensates."
    ),
)


@dataclass(frozen=True)
class CompensationSpec:
    """How a confirmed step is undone, read from its contract."""

    compensator: str | None
    window: timedelta | None
    irreversible_boundary: str | None
    irreversible: bool
    automatic: bool
    owner: str

    @property
    def needed(self) -> bool:
        """False when the contract leaves nothing to undo (no compensator, not irreversible:
        e.g. recording a verification)."""
        return bool(self.compensator) or self.irreversible

    def as_data(self) -> dict[str, Any]:
        return {
            "compensator": self.compensator,
            "window_seconds": int(self.window.total_seconds()) if self.window else None,
            "irreversible_boundary": self.irreversible_boundary,
            "irreversible": self.irreversible,
            "automatic": self.automatic,
            "owner": self.owner,
            "needed": self.needed,
        }


@dataclass(frozen=True)
class Step:
    """One step: the effect it issues, how its command is built, when it may go."""

    name: str
    effect_type: str
    description: str
    build: Build
    precondition: Precondition | None = None
    on_failure: FailurePolicy = COMPENSATE_ON_FAILURE
    # Seconds the step's command may wait (for an approver, a retry) before it expires.
    expires_in: int = DEFAULT_EXPIRES_IN

    @property
    def contract(self) -> EffectContract:
        contract = get_contract(self.effect_type)
        if contract is None:
            raise LookupError(f"step {self.name}: no contract for {self.effect_type}")
        return contract

    @property
    def compensation(self) -> CompensationSpec:
        contract = self.contract
        return CompensationSpec(
            compensator=contract.compensator,
            window=contract.compensation_window,
            irreversible_boundary=contract.irreversible_boundary,
            irreversible=contract.irreversible,
            automatic=contract.automatic_compensation,
            owner=contract.owner,
        )

    def as_data(self, index: int) -> dict[str, Any]:
        return {
            "index": index,
            "name": self.name,
            "description": self.description,
            "effect_type": self.effect_type,
            "owner": self.contract.owner,
            "precondition": self.precondition.description if self.precondition else None,
            "on_failure": self.on_failure.as_data(),
            "compensation": self.compensation.as_data(),
            "expires_in": self.expires_in,
        }


@dataclass(frozen=True)
class SagaDefinition:
    """A named multi-step flow: its inputs and its steps, in order."""

    name: str
    description: str
    inputs_schema: dict[str, Any]
    example: dict[str, Any]
    steps: tuple[Step, ...]
    # Inputs shown as "[redacted]" to callers who may not see personal data.
    personal_inputs: tuple[str, ...] = ()
    _validator: jsonschema.Draft202012Validator = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_validator", jsonin.payload_validator(self.inputs_schema))

    def step(self, name: str) -> Step:
        for step in self.steps:
            if step.name == name:
                return step
        raise LookupError(f"{self.name} has no step {name!r}")

    def input_errors(self, inputs: Any) -> dict[str, list[str]]:
        """Field errors of ``inputs`` against the schema, keyed ``inputs.<path>``."""
        errors: dict[str, list[str]] = {}
        for error in sorted(self._validator.iter_errors(inputs), key=lambda e: list(e.path)):
            path = ".".join(str(part) for part in error.path)
            errors.setdefault(f"inputs.{path}" if path else "inputs", []).append(error.message)
        return errors

    def as_data(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "inputs_schema": self.inputs_schema,
            "example": self.example,
            "personal_inputs": list(self.personal_inputs),
            "steps": [step.as_data(index) for index, step in enumerate(self.steps)],
        }


DEFINITIONS: dict[str, SagaDefinition] = {}


def register(definition: SagaDefinition) -> SagaDefinition:
    """Add a definition, refusing one that could never run: a duplicate name or step, an
    unknown effect type, or an example its own schema rejects."""
    if definition.name in DEFINITIONS:
        raise ValueError(f"saga {definition.name} declared twice")
    names = [step.name for step in definition.steps]
    if len(set(names)) != len(names) or not names:
        raise ValueError(f"saga {definition.name}: step names must be unique and non-empty")
    for step in definition.steps:
        step.contract  # noqa: B018 - raises for an unknown effect type
    if errors := definition.input_errors(definition.example):
        raise ValueError(f"saga {definition.name}: the example is not valid: {errors}")
    DEFINITIONS[definition.name] = definition
    return definition


def get_definition(name: str) -> SagaDefinition | None:
    return DEFINITIONS.get(name)


# --- JSON Schema building blocks ------------------------------------------------------------


def _schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


_ID = {"type": "string", "minLength": 1, "maxLength": 200}
_TEXT = {"type": "string", "minLength": 1, "maxLength": 500}
_REVISION = {
    "type": "integer",
    "minimum": 0,
    "description": "The revision the promotion expects to replace (optimistic concurrency).",
}
_SHA = {"type": "string", "pattern": "^[0-9a-f]{7,40}$", "description": "Git commit SHA."}


# --- order.fulfillment ----------------------------------------------------------------------


def _order(context: StepContext) -> dict[str, Any]:
    return {"type": "order", "id": context.inputs["order_id"]}


def _reserve(context: StepContext):
    inputs = context.inputs
    payload = {"sku": inputs["sku"], "quantity": inputs["quantity"]}
    if inputs.get("warehouse"):
        payload["warehouse"] = inputs["warehouse"]
    return _order(context), payload


def _charge(context: StepContext):
    inputs = context.inputs
    return _order(context), {
        "amount": inputs["amount"],
        "currency": inputs["currency"],
        "customer_id": inputs["customer_id"],
        "description": f"Order {inputs['order_id']}",
    }


def _ship(context: StepContext):
    inputs = context.inputs
    payload: dict[str, Any] = {
        "address": dict(inputs["address"]),
        "items": [{"sku": inputs["sku"], "quantity": inputs["quantity"]}],
    }
    if inputs.get("carrier"):
        payload["carrier"] = inputs["carrier"]
    return _order(context), payload


def _notify(context: StepContext):
    inputs = context.inputs
    shipment = context.result("create_shipment")
    order_id = inputs["order_id"]
    return {"type": "customer", "id": inputs["customer_id"]}, {
        "to": inputs["email"],
        "subject": f"Your order {order_id} is on its way",
        "body": (
            f"Your order {order_id} has shipped with {shipment.get('carrier', 'our carrier')}. "
            f"Tracking number: {shipment['tracking_number']}."
        ),
    }


_ADDRESS = {
    "type": "object",
    "properties": {
        "name": _TEXT,
        "line1": _TEXT,
        "city": _TEXT,
        "postal_code": {"type": "string", "minLength": 2, "maxLength": 16},
        "country": {"type": "string", "pattern": "^[A-Z]{2}$"},
    },
    "required": ["name", "line1", "city", "postal_code", "country"],
    "additionalProperties": False,
}

ORDER_FULFILLMENT = register(
    SagaDefinition(
        name="order.fulfillment",
        description=(
            "Reserve stock, charge the customer, book the shipment, then tell the customer. "
            "A failure undoes the confirmed steps newest first: cancel the shipment, refund "
            "the charge, release the stock. The email is never taken back automatically."
        ),
        inputs_schema=_schema(
            {
                "order_id": _ID,
                "customer_id": _ID,
                "email": {
                    "type": "string",
                    "format": "email",
                    "pattern": "^[^@\\s]+@[^@\\s]+$",
                    "maxLength": 254,
                },
                "sku": _ID,
                "quantity": {"type": "integer", "minimum": 1, "maximum": 10_000},
                "warehouse": _ID,
                "amount": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 100_000_000,
                    "description": "In minor units of the currency (cents): 2500 is 25.00.",
                },
                "currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
                "address": _ADDRESS,
                "carrier": _ID,
            },
            [
                "order_id",
                "customer_id",
                "email",
                "sku",
                "quantity",
                "amount",
                "currency",
                "address",
            ],
        ),
        example={
            "order_id": "ord_881",
            "customer_id": "cus_42",
            "email": "ada@example.com",
            "sku": "SKU-RED-MUG",
            "quantity": 2,
            "amount": 4999,
            "currency": "EUR",
            "address": {
                "name": "Ada Lovelace",
                "line1": "12 St James's Square",
                "city": "London",
                "postal_code": "SW1Y 4JH",
                "country": "GB",
            },
        },
        personal_inputs=("email", "address"),
        steps=(
            Step(
                name="reserve_inventory",
                effect_type="inventory.reservation.create",
                description="Hold the stock of the order.",
                build=_reserve,
            ),
            Step(
                name="charge_payment",
                effect_type="billing.charge.create",
                description="Charge the customer for the order.",
                build=_charge,
                precondition=receipt_has("reserve_inventory", "reservation_id"),
            ),
            Step(
                name="create_shipment",
                effect_type="shipment.create",
                description="Book the carrier shipment.",
                build=_ship,
                precondition=receipt_has("charge_payment", "charge_id"),
            ),
            Step(
                name="notify_customer",
                effect_type="email.message.send",
                description="Tell the customer the order is on its way, with the tracking number.",
                build=_notify,
                precondition=receipt_has("create_shipment", "tracking_number"),
            ),
        ),
    )
)


# --- release.production ---------------------------------------------------------------------


def _service(context: StepContext, environment: str, version: int | None = None):
    """A service's deployment in one environment: each has its own revision."""
    resource: dict[str, Any] = {
        "type": "service",
        "id": f"{context.inputs['service']}@{environment}",
    }
    if version is not None:
        resource["version"] = version
    return resource


def _promote(environment: str) -> Build:
    def build(context: StepContext):
        inputs = context.inputs
        payload = {"environment": environment, "sha": inputs["sha"], "release": inputs["release"]}
        if inputs.get("previous_sha"):
            payload["previous_sha"] = inputs["previous_sha"]
        return _service(context, environment, inputs[f"{environment}_revision"]), payload

    return build


def _verify(context: StepContext):
    inputs = context.inputs
    return _service(context, "staging"), {
        "environment": "staging",
        "sha": inputs["sha"],
        "checks": list(inputs.get("checks") or ["smoke"]),
    }


VERIFICATION_PASSED = Precondition(
    "the staging verification reported no failure",
    lambda context: (
        "verify_staging" in context.receipts
        and context.result("verify_staging").get("verified", True) is not False
        and context.result("verify_staging").get("state") not in {"failed", "error"}
    ),
)

RELEASE_PRODUCTION = register(
    SagaDefinition(
        name="release.production",
        description=(
            "Promote a release to staging (expecting the staging revision), verify it there, "
            "then promote it to production (expecting the production revision; an approver "
            "signs off). A stale revision pauses the run for an operator; any other failure "
            "rolls back the promotions made, newest first."
        ),
        inputs_schema=_schema(
            {
                "service": {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]{0,99}$"},
                "release": _ID,
                "sha": _SHA,
                "previous_sha": _SHA,
                "staging_revision": _REVISION,
                "production_revision": _REVISION,
                "checks": {"type": "array", "items": _ID, "minItems": 1, "maxItems": 50},
            },
            ["service", "release", "sha", "staging_revision", "production_revision"],
        ),
        example={
            "service": "catalog",
            "release": "2026.11.29-1",
            "sha": "a1b2c3d4e5f6",
            "previous_sha": "0f9e8d7c6b5a",
            "staging_revision": 41,
            "production_revision": 57,
            "checks": ["smoke", "error-rate"],
        },
        steps=(
            Step(
                name="promote_staging",
                effect_type="deployment.release.promote",
                description="Promote the release to staging, expecting the staging revision.",
                build=_promote("staging"),
                on_failure=PAUSE_ON_STALE_VERSION,
            ),
            Step(
                name="verify_staging",
                effect_type="deployment.release.verify",
                description="Run the post-deploy checks on staging.",
                build=_verify,
                precondition=receipt_has("promote_staging", "deployment_id"),
            ),
            Step(
                name="promote_production",
                effect_type="deployment.release.promote",
                description=(
                    "Promote the release to production, expecting the production revision."
                ),
                build=_promote("production"),
                precondition=VERIFICATION_PASSED,
                on_failure=PAUSE_ON_STALE_VERSION,
                # An approver signs production promotions off: give them a working day.
                expires_in=8 * 3600,
            ),
        ),
    )
)
