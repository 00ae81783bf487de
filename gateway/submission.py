"""What a submitted command is checked against and written as, for both paths that write it:
the ORM's (``services.command_submit``) and the fast path's one statement (``fastpath.submit``).

Both take the rows' values from ``new_rows``, field by field, and write them as they are
(the fast path renders its INSERT from the models' columns): a column added to ``Command`` or
``Effect`` is one line in ``new_rows``, and both paths write it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.conf import settings

from gateway.choices import ApprovalState, EffectStatus, EventKind
from gateway.contracts import EffectContract

S = EffectStatus
MAX_EXPIRES_IN = 7 * 24 * 3600
DEFAULT_EXPIRES_IN = 3600  # a command not sent within the hour expires (``expires_in``)


def provider_key(tenant_slug: str, idempotency_key: str) -> str:
    """The key the provider deduplicates on: the agent's key, within its tenant (two tenants
    may use the same key for different commands)."""
    return f"{tenant_slug}:{idempotency_key}"


def provider_key_tenant(key: str) -> str | None:
    """The tenant slug a provider key names (``provider_key``'s inverse); None for a key the
    gateway did not make."""
    slug, separator, _ = key.partition(":")
    return slug if separator else None


def without_nulls(value: Any) -> Any:
    """``value`` with every object member that is null left out, at any depth (not inside
    arrays): in a command's resource and payload, null means absent. Agents' tool schemas
    (OpenAI's strict mode) make every field required and let an optional one be null; the
    same command with a field absent or null is one command, with one digest."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    return value


class NewRows(NamedTuple):
    """A new command's rows, by attname: the command, its effect and its ``submitted`` event."""

    command: dict[str, Any]
    effect: dict[str, Any]
    event: dict[str, Any]


def new_rows(
    *,
    effect_id: str,
    principal: Any,
    contract: EffectContract,
    idempotency_key: str,
    digest: str,
    resource: dict[str, Any],
    payload: dict[str, Any],
    intent: Any,
    context: Any,
    expires_in: Any,
    sealed: str,
    redacted: dict[str, Any],
    capability_id: str | None,
    reserved: int,
    now: datetime,
    wait: str | None = None,
    compensates_id: str | None = None,
    saga_id: str = "",
    saga_step: str = "",
    token_id: int | None = None,
) -> NewRows:
    """The rows a submission writes: AWAITING_APPROVAL when gated (``wait``: why beyond the
    contract's policy, ``capabilities.approval_wait``), else PREPARED and due now."""
    if wait is None and contract.requires_approval(payload):
        wait = "waiting for an approver: " + contract.approval.description
    needs_approval = wait is not None
    status = S.AWAITING_APPROVAL if needs_approval else S.PREPARED
    command = {
        "effect_id": effect_id,
        "tenant_id": principal.tenant_id,
        "type": contract.type,
        "contract_version": contract.version,
        "provider": contract.provider,
        "idempotency_key": idempotency_key,
        "provider_key": provider_key(principal.tenant.slug, idempotency_key),
        "payload_digest": digest,
        "resource": resource,
        "resource_type": resource["type"],
        "resource_id": resource["id"],
        "resource_version": resource.get("version"),
        "payload_sealed": sealed,
        "payload_redacted": redacted,
        "intent": intent or {},
        "context": context or {},
        "requested_by_id": principal.pk,
        "capability_id": capability_id,
        "budget_amount": reserved,
        "approval_required": needs_approval,
        "compensates_id": compensates_id,
        "submitted_with_id": token_id,  # dispatch refuses it if that was revoked by then
        "saga_id": saga_id,
        "saga_step": saga_step,
        "expires_at": now + timedelta(seconds=expires_in or DEFAULT_EXPIRES_IN),
        "created_at": now,
    }
    effect = {
        "command_id": effect_id,
        "tenant_id": principal.tenant_id,
        "type": contract.type,
        "owner": contract.owner,
        "status": status,
        "status_changed_at": now,
        "approval_state": ApprovalState.PENDING if needs_approval else ApprovalState.NOT_REQUIRED,
        # If the message that it is due is lost, the sweeper sends it again after this.
        "next_dispatch_at": (
            None if needs_approval else now + timedelta(seconds=settings.GATEWAY_REDELIVER_AFTER)
        ),
        "created_at": now,
        "updated_at": now,
    }
    event = {
        "kind": EventKind.SUBMITTED,
        "actor": principal.label,
        "to_status": status,
        "reason": wait or "",
        "data": {"idempotency_key": idempotency_key, "payload_digest": digest},
    }
    return NewRows(command, effect, event)


def validate(
    *,
    contract: EffectContract | None,
    effect_type: Any,
    resource: Any,
    payload: Any,
    intent: Any,
    context: Any,
    expires_in: Any,
) -> dict[str, list[str]]:
    """A submission's field errors (empty: valid)."""
    errors: dict[str, list[str]] = {}
    if contract is None:
        errors["type"] = [f"unknown effect type {effect_type!r}; see GET /api/v1/effect-types"]
    _validate_resource(errors, contract, resource)
    if not isinstance(payload, dict):
        errors["payload"] = ["must be an object"]
    elif contract:
        for error in sorted(
            contract.payload_validator.iter_errors(payload), key=lambda e: list(e.path)
        ):
            path = ".".join(str(part) for part in error.path)
            errors.setdefault(f"payload.{path}" if path else "payload", []).append(error.message)
    if intent is not None and not isinstance(intent, dict):
        errors["intent"] = ["must be an object (summary, task_id, plan_revision)"]
    elif isinstance(intent, dict):
        summary = intent.get("summary")
        if summary is not None and (not isinstance(summary, str) or len(summary) > 4000):
            errors["intent.summary"] = ["must be a string of at most 4000 characters"]
        revision = intent.get("plan_revision")
        if revision is not None and (isinstance(revision, bool) or not isinstance(revision, int)):
            errors["intent.plan_revision"] = ["must be an integer"]
    if context is not None and not isinstance(context, dict):
        errors["context"] = ["must be an object"]
    if expires_in is not None and (
        isinstance(expires_in, bool)
        or not isinstance(expires_in, int)
        or not 1 <= expires_in <= MAX_EXPIRES_IN
    ):
        errors["expires_in"] = [f"must be whole seconds from 1 to {MAX_EXPIRES_IN}"]
    return errors


def _validate_resource(
    errors: dict[str, list[str]], contract: EffectContract | None, resource: Any
) -> None:
    if not isinstance(resource, dict):
        errors["resource"] = ["must be an object with type, id and (where needed) version"]
        return
    if contract and resource.get("type") != contract.resource_type:
        errors["resource.type"] = [f"must be {contract.resource_type!r} for this type"]
    rid = resource.get("id")
    if not isinstance(rid, str) or not rid or len(rid) > 200:
        errors["resource.id"] = ["must be a non-empty string of at most 200 characters"]
    version = resource.get("version")
    if version is None:
        if contract and contract.resource_version_required:
            errors["resource.version"] = ["required: the version you expect to change"]
    elif isinstance(version, bool) or not isinstance(version, int) or version < 0:
        errors["resource.version"] = ["must be a non-negative integer"]
    extra = set(resource) - {"type", "id", "version"}
    if extra:
        errors["resource"] = [f"unexpected fields: {', '.join(sorted(extra))}"]
