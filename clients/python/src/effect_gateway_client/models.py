"""What the client returns: typed views of the gateway's JSON, each keeping the raw document."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Statuses after which waiting longer changes nothing without a human or a new command.
SETTLED = frozenset(
    {"CONFIRMED", "REJECTED", "EXPIRED", "CANCELLED", "COMPENSATED", "COMPENSATION_FAILED"}
)
# The status machine's dead ends (SPEC §4); CONFIRMED may still be compensated.
TERMINAL = frozenset({"REJECTED", "EXPIRED", "CANCELLED", "COMPENSATED", "COMPENSATION_FAILED"})


@dataclass(frozen=True)
class Effect:
    """One effect as ``GET /api/v1/effects/{id}`` describes it (SPEC §5)."""

    effect_id: str
    type: str
    status: str
    idempotency_key: str
    payload_digest: str
    resource: dict[str, Any]
    intent: dict[str, Any]
    context: dict[str, Any]
    attempts: int
    approval: dict[str, Any]
    receipt: dict[str, Any] | None
    compensation: dict[str, Any]
    compensates: str | None
    payload: dict[str, Any] | None
    created_at: str
    updated_at: str
    expires_at: str
    # True when the gateway answered a submission with the effect the key already named
    # (header ``Idempotent-Replayed: true``): nothing new was recorded or sent.
    replayed: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any], *, replayed: bool = False) -> Effect:
        return cls(
            effect_id=data["effect_id"],
            type=data["type"],
            status=data["status"],
            idempotency_key=data.get("idempotency_key", ""),
            payload_digest=data.get("payload_digest", ""),
            resource=data.get("resource") or {},
            intent=data.get("intent") or {},
            context=data.get("context") or {},
            attempts=int(data.get("attempts") or 0),
            approval=data.get("approval") or {},
            receipt=data.get("receipt"),
            compensation=data.get("compensation") or {},
            compensates=data.get("compensates"),
            payload=data.get("payload"),
            created_at=data.get("created_at", ""),
            updated_at=data.get("updated_at", ""),
            expires_at=data.get("expires_at", ""),
            replayed=replayed,
            raw=data,
        )

    @property
    def settled(self) -> bool:
        """Waiting longer changes nothing: confirmed, or ended without effect."""
        return self.status in SETTLED

    @property
    def awaiting_approval(self) -> bool:
        return self.status == "AWAITING_APPROVAL"


@dataclass(frozen=True)
class EffectPage:
    """One page of ``GET /api/v1/effects``, newest first; ``next_cursor`` continues it."""

    results: list[Effect]
    next_cursor: str | None


@dataclass(frozen=True)
class EffectType:
    """One side-effect contract as ``GET /api/v1/effect-types`` lists it (SPEC §3)."""

    type: str
    description: str
    provider: str
    effect_class: str
    resource_type: str
    resource_version_required: bool
    payload_schema: dict[str, Any]
    example: dict[str, Any]
    approval: dict[str, Any]
    irreversible: bool
    compensator: str | None
    owner: str
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EffectType:
        return cls(
            type=data["type"],
            description=data.get("description", ""),
            provider=data.get("provider", ""),
            effect_class=data.get("effect_class", ""),
            resource_type=data.get("resource_type", ""),
            resource_version_required=bool(data.get("resource_version_required")),
            payload_schema=data.get("payload_schema") or {"type": "object"},
            example=data.get("example") or {},
            approval=data.get("approval") or {},
            irreversible=bool(data.get("irreversible")),
            compensator=data.get("compensator"),
            owner=data.get("owner", ""),
            raw=data,
        )

    @property
    def financial(self) -> bool:
        return self.effect_class == "financial_write"

    @property
    def tool_name(self) -> str:
        return tool_name(self.type)


def tool_name(effect_type: str) -> str:
    """The MCP tool of an effect type: ``billing.refund.create`` → ``billing_refund_create``.
    Dots are not allowed in every host's tool names (Claude's API accepts ``[a-zA-Z0-9_-]``)."""
    return effect_type.replace(".", "_")
