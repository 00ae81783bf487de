"""The compensating command of a confirmed effect, built before anything offers it: what it
will send (type, resource, payload), or which fields it lacks and how to supply them.

``effect_compensate`` sends exactly this; the console shows it in the compensation form and
shows the missing fields instead of the button when it cannot be built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.contracts import EffectContract, get_contract
from gateway.integrity import open_command_payload
from gateway.models import Effect, Receipt


@dataclass(frozen=True)
class CompensationPlan:
    """``type``, ``resource`` and ``payload`` of the compensating command; ``missing`` names
    the payload fields it could not fill (then it is never sent) and ``problems`` says why."""

    type: str
    resource: dict[str, Any]
    payload: dict[str, Any]
    missing: tuple[str, ...] = ()
    problems: dict[str, list[str]] = field(default_factory=dict)

    @property
    def buildable(self) -> bool:
        return not self.missing and not self.problems

    def how_to_supply(self, effect_type: str) -> str:
        """One sentence: what is missing and where it comes from."""
        names = ", ".join(self.missing) or ", ".join(self.problems)
        return (
            f"The {self.type} command cannot be built: {names} is missing from the receipt "
            f"of this {effect_type}. Resolve it with the {names} the provider shows, or "
            "issue the compensation by hand."
        )


def latest_receipt(effect: Effect) -> Receipt | None:
    return effect.receipts.order_by("-received_at", "-id").first()


def compensation_plan(
    effect: Effect, contract: EffectContract | None = None, receipt: Receipt | None = None
) -> CompensationPlan | None:
    """The compensating command as it would be sent now; None when the contract declares no
    compensator. Validated against the compensator's own schema, so that a field the receipt
    did not give (a ``charge_id`` a manual resolution left out) is named here, not by a
    refused command."""
    contract = contract or get_contract(effect.type)
    if contract is None or not contract.compensator or contract.compensation is None:
        return None
    receipt = receipt if receipt is not None else latest_receipt(effect)
    resource, payload = contract.compensation(
        effect.command.resource,
        open_command_payload(effect.command),
        receipt.result if receipt else {},
        effect.provider_operation_id,
    )
    compensator = get_contract(contract.compensator)
    missing: list[str] = []
    problems: dict[str, list[str]] = {}
    if compensator is not None:
        for error in compensator.payload_validator.iter_errors(payload):
            name = _field_of(error)
            if name:
                missing.append(name)
            else:
                problems.setdefault("payload", []).append(error.message)
    # A declared receipt field the builder filled with nothing counts as missing as well.
    for name in contract.receipt_fields:
        if name in payload and not payload[name] and name not in missing:
            missing.append(name)
    return CompensationPlan(
        type=contract.compensator,
        resource=resource,
        payload=payload,
        missing=tuple(dict.fromkeys(missing)),
        problems=problems,
    )


def _field_of(error: Any) -> str:
    """The top-level payload field a schema error is about ("" when it is about the whole)."""
    if error.validator == "required" and isinstance(error.instance, dict):
        absent = [name for name in error.validator_value if name not in error.instance]
        return absent[0] if absent else ""
    path = list(error.path)
    return str(path[0]) if path else ""
