"""Side-effect contracts: every effect type the gateway executes, declared once, in code (SPEC §3).

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
from typing import Any

from gateway.choices import EffectClass
from gateway.lib import jsonin

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
    personal_fields: tuple[str, ...] = ()
    # The provider's own console for one operation, as a template of ``{base}`` (the
    # provider's URL), ``{provider_key}`` and ``{operation_id}``; None: it has none.
    console_url: str | None = None

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
            "personal_fields": list(self.personal_fields),
        }


# --- JSON Schema building blocks -------------------------------------------------------------


def _schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


_AMOUNT = {
    "type": "integer",
    "minimum": 1,
    "maximum": 100_000_000,
    "description": "In minor units of the currency (cents): 2500 is 25.00.",
}
_CURRENCY = {"type": "string", "pattern": "^[A-Z]{3}$", "description": "ISO 4217 code."}
_TEXT = {"type": "string", "minLength": 1, "maxLength": 500}
_ID = {"type": "string", "minLength": 1, "maxLength": 200}
_SHA = {"type": "string", "pattern": "^[0-9a-f]{7,40}$", "description": "Git commit SHA."}
_ENVIRONMENT = {"type": "string", "enum": ["staging", "production"]}


def _from_receipt(result: Mapping[str, Any], name: str, operation_id: str) -> str:
    """The provider's id for the thing created, falling back to its operation id."""
    return str(result.get(name) or operation_id)


def _refund_charge(resource, payload, result, operation_id):
    return dict(resource), {
        "amount": payload["amount"],
        "currency": payload["currency"],
        "reason": "compensation of charge",
        "charge_id": _from_receipt(result, "charge_id", operation_id),
    }


def _release_reservation(resource, payload, result, operation_id):
    return dict(resource), {
        "reservation_id": _from_receipt(result, "reservation_id", operation_id),
        "reason": "compensation of reservation",
    }


def _cancel_shipment(resource, payload, result, operation_id):
    return dict(resource), {
        "shipment_id": _from_receipt(result, "shipment_id", operation_id),
        "reason": "compensation of shipment",
    }


def _rollback_release(resource, payload, result, operation_id):
    rollback_resource = {k: v for k, v in resource.items() if k != "version"}
    if "version" in resource:
        # The promotion moved the service one revision on; the rollback expects that one.
        rollback_resource["version"] = resource["version"] + 1
    return rollback_resource, {
        "environment": payload["environment"],
        "to_sha": payload.get("previous_sha") or "0000000",
        "reason": f"roll back release {payload['release']}",
    }


def _close_ticket(resource, payload, result, operation_id):
    return dict(resource), {
        "ticket_id": _from_receipt(result, "ticket_id", operation_id),
        "resolution": "opened in error",
    }


def _correction_email(resource, payload, result, operation_id):
    return dict(resource), {
        "to": payload["to"],
        "subject": f"Correction: {payload['subject']}"[:200],
        "body": "Please disregard our previous message; it was sent in error.",
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
_ITEMS = {
    "type": "array",
    "minItems": 1,
    "items": {
        "type": "object",
        "properties": {"sku": _ID, "quantity": {"type": "integer", "minimum": 1}},
        "required": ["sku", "quantity"],
        "additionalProperties": False,
    },
}
_ORDER = {"type": "order", "id": "ord_881", "version": 17}

CONTRACTS: dict[str, EffectContract] = {}


# The billing provider's (here: the sandbox's) page of the operations it holds for a key.
_BILLING_CONSOLE = "{base}/_operations?idempotency_key={provider_key}"


def register(contract: EffectContract) -> EffectContract:
    if contract.type in CONTRACTS:
        raise ValueError(f"effect type {contract.type} declared twice")
    CONTRACTS[contract.type] = contract
    return contract


register(
    EffectContract(
        type="billing.charge.create",
        provider="billing",
        effect_class=EffectClass.FINANCIAL_WRITE,
        description="Charge a customer for an order.",
        resource_type="order",
        payload_schema=_schema(
            {"amount": _AMOUNT, "currency": _CURRENCY, "customer_id": _ID, "description": _TEXT},
            ["amount", "currency", "customer_id"],
        ),
        example={
            "resource": _ORDER,
            "payload": {"amount": 4999, "currency": "EUR", "customer_id": "cus_42"},
        },
        owner="billing-oncall",
        commit_semantics="The charge exists once the provider returns its operation id.",
        completion_semantics="captured",
        approval=ApprovalPolicy(
            "rule", "Charges over 5,000.00 need an approver.", "amount", ">", 500_000
        ),
        compensator="billing.refund.create",
        compensation_window=timedelta(days=30),
        irreversible_boundary="payout_settled",
        compensation=_refund_charge,
        console_url=_BILLING_CONSOLE,
    )
)

register(
    EffectContract(
        type="billing.refund.create",
        provider="billing",
        effect_class=EffectClass.FINANCIAL_WRITE,
        description="Refund money to a customer against an order.",
        resource_type="order",
        payload_schema=_schema(
            {"amount": _AMOUNT, "currency": _CURRENCY, "reason": _TEXT, "charge_id": _ID},
            ["amount", "currency", "reason"],
        ),
        example={
            "resource": _ORDER,
            "payload": {"amount": 500, "currency": "EUR", "reason": "duplicate charge"},
        },
        owner="billing-oncall",
        commit_semantics="The refund exists once the provider returns its operation id.",
        completion_semantics="accepted",
        approval=ApprovalPolicy(
            "rule", "Refunds over 100.00 need an approver.", "amount", ">", 10_000
        ),
        irreversible=True,
        automatic_compensation=False,
        console_url=_BILLING_CONSOLE,
    )
)

register(
    EffectContract(
        type="inventory.reservation.create",
        provider="inventory",
        effect_class=EffectClass.EXTERNAL_WRITE,
        description="Hold stock of one SKU for an order.",
        resource_type="order",
        payload_schema=_schema(
            {
                "sku": _ID,
                "quantity": {"type": "integer", "minimum": 1, "maximum": 10_000},
                "warehouse": _ID,
            },
            ["sku", "quantity"],
        ),
        example={"resource": _ORDER, "payload": {"sku": "SKU-RED-MUG", "quantity": 2}},
        owner="fulfillment-oncall",
        commit_semantics="Stock is held once the provider returns the reservation.",
        completion_semantics="reserved",
        compensator="inventory.reservation.release",
        compensation_window=timedelta(days=7),
        compensation=_release_reservation,
    )
)

register(
    EffectContract(
        type="inventory.reservation.release",
        provider="inventory",
        effect_class=EffectClass.IDEMPOTENT_WRITE,
        description="Give back stock held by a reservation.",
        resource_type="order",
        payload_schema=_schema({"reservation_id": _ID, "reason": _TEXT}, ["reservation_id"]),
        example={
            "resource": _ORDER,
            "payload": {"reservation_id": "res_123", "reason": "cancelled"},
        },
        owner="fulfillment-oncall",
        commit_semantics="Releasing twice is harmless; the stock comes back once.",
        completion_semantics="released",
    )
)

register(
    EffectContract(
        type="shipment.create",
        provider="shipping",
        effect_class=EffectClass.EXTERNAL_WRITE,
        description="Book a carrier shipment for an order.",
        resource_type="order",
        payload_schema=_schema(
            {"address": _ADDRESS, "items": _ITEMS, "carrier": _ID}, ["address", "items"]
        ),
        example={
            "resource": _ORDER,
            "payload": {
                "address": {
                    "name": "Ada Lovelace",
                    "line1": "12 St James's Square",
                    "city": "London",
                    "postal_code": "SW1Y 4JH",
                    "country": "GB",
                },
                "items": [{"sku": "SKU-RED-MUG", "quantity": 2}],
            },
        },
        owner="fulfillment-oncall",
        commit_semantics="The shipment is booked once the provider returns its id.",
        completion_semantics="booked",
        compensator="shipment.cancel",
        compensation_window=timedelta(hours=12),
        irreversible_boundary="handed_to_carrier",
        compensation=_cancel_shipment,
        personal_fields=("address",),
    )
)

register(
    EffectContract(
        type="shipment.cancel",
        provider="shipping",
        effect_class=EffectClass.IDEMPOTENT_WRITE,
        description="Cancel a booked shipment before the carrier collects it.",
        resource_type="order",
        payload_schema=_schema({"shipment_id": _ID, "reason": _TEXT}, ["shipment_id"]),
        example={
            "resource": _ORDER,
            "payload": {"shipment_id": "shp_9", "reason": "order cancelled"},
        },
        owner="fulfillment-oncall",
        commit_semantics="Cancelling twice is harmless.",
        completion_semantics="cancelled",
    )
)

_SERVICE = {"type": "service", "id": "catalog", "version": 41}

register(
    EffectContract(
        type="deployment.release.promote",
        provider="deploy",
        effect_class=EffectClass.EXTERNAL_WRITE,
        description="Promote a release (a commit SHA) of a service to an environment.",
        resource_type="service",
        resource_version_required=True,
        payload_schema=_schema(
            {"environment": _ENVIRONMENT, "sha": _SHA, "release": _ID, "previous_sha": _SHA},
            ["environment", "sha", "release"],
        ),
        example={
            "resource": _SERVICE,
            "payload": {
                "environment": "staging",
                "sha": "a1b2c3d4e5f6",
                "release": "2026.11.29-1",
                "previous_sha": "0f9e8d7c6b5a",
            },
        },
        owner="release-eng",
        commit_semantics="The rollout starts once accepted; the service revision then moves on.",
        completion_semantics="rolled_out",
        approval=ApprovalPolicy(
            "rule", "Promotions to production need an approver.", "environment", "==", "production"
        ),
        compensator="deployment.release.rollback",
        compensation_window=timedelta(hours=24),
        compensation=_rollback_release,
    )
)

register(
    EffectContract(
        type="deployment.release.rollback",
        provider="deploy",
        effect_class=EffectClass.EXTERNAL_WRITE,
        description="Roll a service back to an earlier commit SHA.",
        resource_type="service",
        resource_version_required=True,
        payload_schema=_schema(
            {"environment": _ENVIRONMENT, "to_sha": _SHA, "reason": _TEXT},
            ["environment", "to_sha"],
        ),
        example={
            "resource": _SERVICE,
            "payload": {
                "environment": "production",
                "to_sha": "0f9e8d7c6b5a",
                "reason": "error rate up after release",
            },
        },
        owner="release-eng",
        commit_semantics="The rollback starts once accepted.",
        completion_semantics="rolled_out",
    )
)

register(
    EffectContract(
        type="deployment.release.verify",
        provider="deploy",
        effect_class=EffectClass.IDEMPOTENT_WRITE,
        description="Run the post-deploy checks of a release in one environment and record them.",
        resource_type="service",
        payload_schema=_schema(
            {
                "environment": _ENVIRONMENT,
                "sha": _SHA,
                "checks": {"type": "array", "items": _ID, "maxItems": 50},
            },
            ["environment", "sha"],
        ),
        example={
            "resource": {"type": "service", "id": "catalog"},
            "payload": {"environment": "staging", "sha": "a1b2c3d4e5f6", "checks": ["smoke"]},
        },
        owner="release-eng",
        commit_semantics="Recording a verification twice is harmless.",
        completion_semantics="passed",
    )
)

_QUEUE = {"type": "queue", "id": "support"}

register(
    EffectContract(
        type="ticket.create",
        provider="tickets",
        effect_class=EffectClass.EXTERNAL_WRITE,
        description="Open a ticket in a support or engineering queue.",
        resource_type="queue",
        payload_schema=_schema(
            {
                "title": _TEXT,
                "priority": {"type": "string", "enum": ["P1", "P2", "P3", "P4"]},
                "body": {"type": "string", "maxLength": 10_000},
                "customer_id": _ID,
            },
            ["title", "priority"],
        ),
        example={"resource": _QUEUE, "payload": {"title": "Printer on fire", "priority": "P2"}},
        owner="support-tools",
        commit_semantics="The ticket exists once the provider returns its id.",
        completion_semantics="open",
        compensator="ticket.close",
        compensation_window=timedelta(days=14),
        compensation=_close_ticket,
    )
)

register(
    EffectContract(
        type="ticket.close",
        provider="tickets",
        effect_class=EffectClass.IDEMPOTENT_WRITE,
        description="Close a ticket with a resolution.",
        resource_type="queue",
        payload_schema=_schema({"ticket_id": _ID, "resolution": _TEXT}, ["ticket_id"]),
        example={"resource": _QUEUE, "payload": {"ticket_id": "T-381", "resolution": "fixed"}},
        owner="support-tools",
        commit_semantics="Closing twice is harmless.",
        completion_semantics="closed",
    )
)

register(
    EffectContract(
        type="email.message.send",
        provider="mail",
        effect_class=EffectClass.EXTERNAL_WRITE,
        description="Send an email to a customer. Irreversible: it can only be followed up.",
        resource_type="customer",
        payload_schema=_schema(
            {
                "to": {
                    "type": "string",
                    "format": "email",
                    "pattern": "^[^@\\s]+@[^@\\s]+$",
                    "maxLength": 254,
                },
                "subject": {"type": "string", "minLength": 1, "maxLength": 200},
                "body": {"type": "string", "minLength": 1, "maxLength": 20_000},
                "template": _ID,
            },
            ["to", "subject", "body"],
        ),
        example={
            "resource": {"type": "customer", "id": "cus_42"},
            "payload": {
                "to": "ada@example.com",
                "subject": "Your order has shipped",
                "body": "Your order ord_881 is on its way.",
            },
        },
        owner="lifecycle-messaging",
        commit_semantics="Once the provider accepts it the message may be delivered at any time.",
        completion_semantics="sent",
        compensator="email.message.send",
        irreversible=True,
        irreversible_boundary="sent",
        automatic_compensation=False,
        compensation=_correction_email,
        personal_fields=("to", "body"),
    )
)


def get_contract(effect_type: str) -> EffectContract | None:
    return CONTRACTS.get(effect_type)
