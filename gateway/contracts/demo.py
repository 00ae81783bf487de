"""The demo pack: the effect types the product ships (SPEC §3), as one contract module.

It is loaded like a team's own module (``GATEWAY_CONTRACT_MODULES``, gateway.contracts.loading):
``CONTRACTS`` lists the contracts; ``FINGERPRINTS`` records each version's fingerprint, so
that ``manage.py check`` warns when a schema or a policy changes and the version does not.
No ``ADAPTERS``: every provider here speaks SPEC §6 through the bundled HTTP adapter.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from gateway.choices import EffectClass
from gateway.contracts import ApprovalPolicy, EffectContract

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

# The billing provider's (here: the sandbox's) page of the operations it holds for a key.
_BILLING_CONSOLE = "{base}/_operations?idempotency_key={provider_key}"

CONTRACTS: list[EffectContract] = []


CONTRACTS.append(
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
        receipt_fields=("charge_id",),
        console_url=_BILLING_CONSOLE,
    )
)

CONTRACTS.append(
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

CONTRACTS.append(
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
        receipt_fields=("reservation_id",),
    )
)

CONTRACTS.append(
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

CONTRACTS.append(
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
        receipt_fields=("shipment_id",),
        personal_fields=("address",),
    )
)

CONTRACTS.append(
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

CONTRACTS.append(
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

CONTRACTS.append(
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

CONTRACTS.append(
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

CONTRACTS.append(
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
        receipt_fields=("ticket_id",),
    )
)

CONTRACTS.append(
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

CONTRACTS.append(
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


# The fingerprint each released version had (EffectContract.fingerprint): a contract whose
# schema or policy changes without a new version is a `manage.py check` warning.
FINGERPRINTS: dict[str, dict[int, str]] = {
    "billing.charge.create": {
        1: "sha256:61983ff97c6f4e2deb737855b33f8e997b177f42849ac2bf9149abd5dd49aaa7"
    },
    "billing.refund.create": {
        1: "sha256:647a8fc4bb3a835a1b8c56f99e2cefebb90c71b37a124477b16e7dc41bdb3e36"
    },
    "inventory.reservation.create": {
        1: "sha256:fd1b3de2be44c791cece715cc3ac08ec19ac5febf1595d9fbc480050349905e1"
    },
    "inventory.reservation.release": {
        1: "sha256:03743b61f43e61939f9de22cd6c735ebf6ad0cffb332e54c2ac834307db1ba4c"
    },
    "shipment.create": {
        1: "sha256:8630385f03a93691f416a11db9418746c910f575b407cd3fa6442c124db87f6a"
    },
    "shipment.cancel": {
        1: "sha256:ebc8522221306a9ed0ef9895c3cf12d5d3fceaf758807f046255f8444a8da5bb"
    },
    "deployment.release.promote": {
        1: "sha256:c662898111f0ef855cad2350a759a85944e94e64f4acf1462b0ffba48aa0dc8b"
    },
    "deployment.release.rollback": {
        1: "sha256:2de96789a09247b2b200cf6e969df93cba24b09d4b33e44a114dab1a437bb1b7"
    },
    "deployment.release.verify": {
        1: "sha256:f402dbd27ed5e49a79b2528651c727c5869f69c501c71be30303516521982b42"
    },
    "ticket.create": {1: "sha256:a83bf058c802419bc46c912fc5c84c647c28715cd5443af9a287770c596443c2"},
    "ticket.close": {1: "sha256:977456f3d697b28ef28434fd71397753214e669304b0be09086226035bf1553b"},
    "email.message.send": {
        1: "sha256:d01137105395e7cbc3f08f9c984e08c570a8c465aec9cd5a9fa6878ce913c8d3"
    },
}
