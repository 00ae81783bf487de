"""Every write to the ledger. One function per transition, each a compare-and-set that appends
its event in the same transaction (STYLE 4–8).

The dispatch path is split in atomic phases so that a crash at any point leaves a visible
row, never a gap:

1. ``effect_claim``: PREPARED/NOT_STARTED → DISPATCHING with a new fence, attempt row
   "sending", committed *before* the provider is called.
2. the adapter call, outside any transaction;
3. ``effect_record_outcome``: written only while the fence still matches; a worker that lost
   its claim (lease recovery, a newer claim) has its late answer refused and recorded.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import DateTimeField, DurationField, ExpressionWrapper, F, Value
from django.db.models.functions import Greatest, Least
from django.utils import timezone

from gateway import audit, capabilities, fastpath, hooks, ledger, moves
from gateway.choices import APPROVER_ROLES as APPROVER_ROLES
from gateway.choices import (
    BEFORE_DISPATCH,
    DISPATCHABLE,
    OUTCOME_STATUS,
    ApprovalState,
    AttemptState,
    EffectStatus,
    Outcome,
    Role,
)
from gateway.choices import OPERATOR_ROLES as OPERATOR_ROLES
from gateway.choices import SUBMITTER_ROLES as SUBMITTER_ROLES
from gateway.contracts import EffectContract, get_contract
from gateway.errors import (
    DigestMismatch,
    IdempotencyKeyMismatch,
    InvalidTransition,
    NotPermitted,
    ValidationProblem,
)
from gateway.integrity import (
    effect_refuse_tampered,
    effect_refuse_tampered_claim,
    open_command_payload,
    payload_binding,
    verified_claimed_payload,
    verified_payload,
)
from gateway.ledger import MAX_KEY_LENGTH as MAX_KEY_LENGTH
from gateway.ledger import REDACTED as REDACTED
from gateway.ledger import redact as redact
from gateway.lib.digest import payload_digest
from gateway.lib.failpoints import failpoint
from gateway.lib.vault import seal_bound
from gateway.models import Attempt, Command, Effect, Principal, Receipt, new_effect_id
from gateway.providers.base import CallResult, ExecuteRequest
from gateway.providers.registry import adapter_for

logger = logging.getLogger(__name__)

S = EffectStatus
MAX_EXPIRES_IN = 7 * 24 * 3600
DEFAULT_EXPIRES_IN = 3600


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# --- submission -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Submission:
    effect: Effect
    created: bool


def _validate_submission(
    *,
    contract: EffectContract | None,
    effect_type: Any,
    resource: Any,
    payload: Any,
    intent: Any,
    context: Any,
    expires_in: Any,
) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    if contract is None:
        errors["type"] = [f"unknown effect type {effect_type!r}; see GET /api/v1/effect-types"]
    if not isinstance(resource, dict):
        errors["resource"] = ["must be an object with type, id and (where needed) version"]
    else:
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


def command_submit(
    *,
    principal: Principal,
    idempotency_key: str,
    type: Any,
    resource: Any,
    payload: Any,
    intent: Any = None,
    context: Any = None,
    expires_in: Any = None,
    compensates: Command | None = None,
    saga_id: str | None = None,
    saga_step: str = "",
) -> Submission:
    """Freeze a command and create its effect, or return the effect this key already names.

    Same key + same digest returns the existing effect (``created=False``), however many
    callers race: they collide on the (tenant, key) unique index, not on a prior SELECT.
    Same key + another digest raises IdempotencyKeyMismatch. Nothing is written otherwise.
    """
    ledger.validate_idempotency_key(idempotency_key, what="command")
    contract = get_contract(type) if isinstance(type, str) else None
    errors = _validate_submission(
        contract=contract,
        effect_type=type,
        resource=resource,
        payload=payload,
        intent=intent,
        context=context,
        expires_in=expires_in,
    )
    if errors:
        raise ValidationProblem("The command is not valid.", errors=errors)
    assert contract is not None
    if principal.role not in SUBMITTER_ROLES:
        raise NotPermitted(f"A principal with role {principal.role} cannot submit commands.")
    if principal.frozen:
        raise NotPermitted(f"Principal {principal.name} is frozen.")

    digest = payload_digest(type=contract.type, resource=resource, payload=payload)
    if compensates is None and not saga_id and fastpath.enabled():
        fast = _submit_fast(principal, contract, idempotency_key, digest, resource, payload,
                            intent, context, expires_in)  # fmt: skip
        if fast is not None:
            return fast
    existing = _existing_command(principal, idempotency_key, digest)
    if existing is not None:
        return Submission(existing, created=False)

    now = timezone.now()
    effect_id = new_effect_id()
    try:
        with transaction.atomic():
            capability, reserved = capabilities.capability_reserve(
                principal=principal, contract=contract, resource=resource, payload=payload
            )
            wait = capabilities.approval_wait(
                principal=principal, contract=contract, payload=payload,
                capability=capability, compensates=compensates,
            )  # fmt: skip
            needs_approval = wait is not None
            status = S.AWAITING_APPROVAL if needs_approval else S.PREPARED
            command = Command.objects.create(
                effect_id=effect_id,
                tenant_id=principal.tenant_id,
                type=contract.type,
                contract_version=contract.version,
                provider=contract.provider,
                idempotency_key=idempotency_key,
                provider_key=f"{principal.tenant.slug}:{idempotency_key}",
                payload_digest=digest,
                resource=resource,
                resource_type=resource["type"],
                resource_id=resource["id"],
                resource_version=resource.get("version"),
                # Bound to this command: a ciphertext copied from another row won't open.
                payload_sealed=seal_bound(
                    payload, bound_to=payload_binding(effect_id=effect_id, digest=digest)
                ),
                payload_redacted=redact(payload, contract),
                intent=intent or {},
                context=context or {},
                requested_by=principal,
                capability=capability,
                budget_amount=reserved,
                approval_required=needs_approval,
                compensates=compensates,
                saga_id=saga_id or "",
                saga_step=saga_step,
                expires_at=now + timedelta(seconds=expires_in or DEFAULT_EXPIRES_IN),
                created_at=now,
            )
            effect = Effect.objects.create(
                command=command,
                tenant_id=principal.tenant_id,
                type=contract.type,
                owner=contract.owner,
                status=status,
                status_changed_at=now,
                approval_state=(
                    ApprovalState.PENDING if needs_approval else ApprovalState.NOT_REQUIRED
                ),
                # If the message below is lost, the sweeper sends it again after this.
                next_dispatch_at=(
                    None
                    if needs_approval
                    else now + timedelta(seconds=settings.GATEWAY_REDELIVER_AFTER)
                ),
                created_at=now,
                updated_at=now,
            )
            ledger.append_event(
                effect,
                kind="submitted",
                actor=principal.label,
                principal=principal,
                to_status=status,
                now=now,
                reason=wait or "",
                data={"idempotency_key": idempotency_key, "payload_digest": digest},
            )
            for listener in hooks.effect_created:
                listener(effect)
            if not needs_approval and saga_id:
                ledger.enqueue_dispatch(effect.pk)  # a saga's step: sent on its own
            elif not needs_approval:
                ledger.enqueue_due(effect.pk)
    except IntegrityError:
        # Another request with this key committed first: it is the one effect for the key.
        existing = _existing_command(principal, idempotency_key, digest)
        if existing is None:
            raise
        return Submission(existing, created=False)
    return Submission(effect, created=True)


def _submit_fast(principal, contract, key, digest, resource, payload, intent, context, expires_in):
    """The one-statement submission (gateway.fastpath), for a command that belongs to no saga
    and compensates nothing; a budget is reserved in the same statement. None when the
    general path must decide."""
    if (principal.tenant_id, key) in fastpath.known_keys:
        # A replay, most likely (an agent retrying): one SELECT, no seal, no insert attempt.
        existing = fastpath.replay(principal=principal, idempotency_key=key)
        if existing is not None:
            _check_replay_digest(existing.command, key, digest)
            return Submission(existing, created=False)
    if len(hooks.effect_created) and contract.requires_approval(payload):
        # A command that waits for an approver is announced (hooks.effect_created) in the
        # transaction that writes it, which is the general path's; the wait is human anyway.
        return None
    now = timezone.now()
    grant = fastpath.submission_grant(principal, contract, resource, payload, now)
    if grant is None:
        # No grant (an agent's 403, or a person's wait for an approver), or an amount it
        # refuses: the general path says why.
        return None
    effect_id = new_effect_id()
    written = fastpath.submit(
        effect_id=effect_id,
        principal=principal,
        contract=contract,
        idempotency_key=key,
        digest=digest,
        resource=resource,
        payload=payload,
        intent=intent,
        context=context,
        expires_in=expires_in,
        # Bound to this command: a ciphertext copied from another row won't open.
        sealed=seal_bound(payload, bound_to=payload_binding(effect_id=effect_id, digest=digest)),
        redacted=redact(payload, contract),
        grant=grant,
        now=now,
    )
    if written is None:
        return None
    if not written.created:
        _check_replay_digest(written.effect.command, key, digest)
    elif written.effect.status == S.PREPARED:
        ledger.enqueue_due(written.effect.pk)  # committed (one statement, autocommit)
    return Submission(written.effect, created=written.created)


def _check_replay_digest(command: Command, key: str, digest: str) -> None:
    if command.payload_digest != digest:
        raise IdempotencyKeyMismatch(
            f"Idempotency key {key!r} was used for command {command.effect_id} with digest "
            f"{command.payload_digest}; this request has digest {digest}. Send the identical "
            "command to replay it, or use a new key for a new command.",
            extra={"effect_id": command.effect_id, "payload_digest": command.payload_digest},
        )


def _existing_command(principal: Principal, key: str, digest: str) -> Effect | None:
    command = (
        Command.objects.filter(tenant_id=principal.tenant_id, idempotency_key=key)
        .only("effect_id", "payload_digest")
        .first()
    )
    if command is None:
        return None
    _check_replay_digest(command, key, digest)
    return Effect.objects.select_related("command").get(pk=command.effect_id)


def command_payload(command: Command) -> dict[str, Any]:
    """The clear payload (for the dispatcher and for roles allowed to see it)."""
    return open_command_payload(command)


# --- human actions ----------------------------------------------------------------------------


def effect_cancel(*, effect: Effect, principal: Principal, reason: str = "") -> Effect:
    """Cancel before dispatch: by the requester or an operator."""
    is_requester = effect.command.requested_by_id == principal.pk
    if not is_requester:
        ledger.require_role(principal, OPERATOR_ROLES, "cancel another principal's command")
    with transaction.atomic():
        if effect.status not in BEFORE_DISPATCH or not ledger.transition(
            effect,
            to=S.CANCELLED,
            actor=principal.label,
            principal=principal,
            reason=reason or "cancelled before dispatch",
            next_dispatch_at=None,
        ):
            effect.refresh_from_db()
            raise InvalidTransition(
                f"Effect {effect.pk} is {effect.status}: only an effect that has not been "
                "dispatched can be cancelled (compensate a confirmed one instead)."
            )
    return effect


def _not_awaiting_approval(effect: Effect) -> InvalidTransition:
    return InvalidTransition(f"Effect {effect.pk} is {effect.status}, not awaiting approval.")


def effect_approve(
    *, effect: Effect, principal: Principal, payload_digest: str, comment: str = ""
) -> Effect:
    """Approve exactly the digest the approver read; never the requester, never an agent."""
    ledger.require_role(principal, APPROVER_ROLES, "approve commands")
    if effect.command.requested_by_id == principal.pk:
        raise NotPermitted("The requester of a command cannot approve it.")
    if payload_digest != effect.command.payload_digest:
        raise DigestMismatch(
            # Never the right digest in the message: an approver must read it from the
            # command, not copy it from an error.
            f"You approved {payload_digest!r}, which is not this command's digest. Re-read "
            "the command and approve what it says.",
            extra={"payload_digest": effect.command.payload_digest},
        )
    now = timezone.now()
    with transaction.atomic():
        if effect.status != S.AWAITING_APPROVAL or not ledger.transition(
            effect,
            to=S.PREPARED,
            actor=principal.label,
            principal=principal,
            kind="approved",
            reason=comment or "approved",
            data={"approved_digest": payload_digest},
            approval_state=ApprovalState.APPROVED,
            approved_by=principal,
            approved_digest=payload_digest,
            approved_at=now,
            next_dispatch_at=now + timedelta(seconds=settings.GATEWAY_REDELIVER_AFTER),
        ):
            effect.refresh_from_db()
            raise _not_awaiting_approval(effect)
        ledger.enqueue_dispatch(effect.pk)
    return effect


def effect_reject(*, effect: Effect, principal: Principal, reason: str = "") -> Effect:
    ledger.require_role(principal, APPROVER_ROLES, "reject commands")
    with transaction.atomic():
        if effect.status != S.AWAITING_APPROVAL or not ledger.transition(
            effect,
            to=S.REJECTED,
            actor=principal.label,
            principal=principal,
            kind="rejected",
            reason=reason or "rejected by approver",
            approval_state=ApprovalState.REJECTED,
        ):
            effect.refresh_from_db()
            raise _not_awaiting_approval(effect)
    return effect


def effect_set_frozen(
    *, effect: Effect, principal: Principal, frozen: bool, reason: str = ""
) -> Effect:
    """Freeze (nothing is dispatched) or unfreeze an effect; recorded either way."""
    ledger.require_role(principal, OPERATOR_ROLES, "freeze effects")
    with transaction.atomic():
        audit.lock_chain(effect.tenant_id)
        changed = Effect.objects.filter(pk=effect.pk, frozen=not frozen).update(
            frozen=frozen, updated_at=timezone.now()
        )
        if changed:
            ledger.append_event(
                effect,
                kind="frozen" if frozen else "unfrozen",
                actor=principal.label,
                principal=principal,
                reason=reason,
                from_status=effect.status,
                to_status=effect.status,
            )
            effect.frozen = frozen
            if not frozen and effect.status in DISPATCHABLE:
                ledger.enqueue_dispatch(effect.pk)
    return effect


def compensation_key(effect: Effect) -> str:
    """One compensation per effect: asking twice replays the same command."""
    return f"compensation:{effect.pk}"


def effect_compensate(
    *, effect: Effect, principal: Principal, reason: str, automatic: bool = False
) -> Submission:
    """Issue a **new** command of the contract's compensator type, with its own key and its own
    approval; the original becomes COMPENSATING and both stay in the ledger, linked.

    ``automatic`` is the saga orchestrator acting: refused for contracts whose compensation a
    human must decide (irreversible effects such as a sent email).
    """
    contract = get_contract(effect.type)
    if contract is None or not contract.compensator or contract.compensation is None:
        raise InvalidTransition(f"{effect.type} has no compensator: handle it manually.")
    if principal.role not in {Role.AGENT, *OPERATOR_ROLES}:
        raise NotPermitted(f"A principal with role {principal.role} cannot compensate.")
    if not contract.automatic_compensation and (automatic or principal.role == Role.AGENT):
        raise NotPermitted(
            f"{effect.type} is compensated only by an operator's decision "
            f"({contract.compensator}); it is never automatic."
        )
    if effect.status == S.COMPENSATING and effect.compensated_by_id:
        existing = Effect.objects.select_related("command").get(pk=effect.compensated_by_id)
        return Submission(existing, created=False)
    if effect.status != S.CONFIRMED:
        raise InvalidTransition(
            f"Effect {effect.pk} is {effect.status}: only a CONFIRMED effect is compensated."
        )
    now = timezone.now()
    if contract.compensation_window and effect.confirmed_at:
        window_end = effect.confirmed_at + contract.compensation_window
        if now > window_end:
            raise InvalidTransition(
                f"The compensation window of {effect.pk} ended at {window_end.isoformat()}; "
                f"compensation is now manual for {contract.owner}."
            )
    receipt = effect.receipts.order_by("-received_at", "-id").first()
    resource, payload = contract.compensation(
        effect.command.resource,
        command_payload(effect.command),
        receipt.result if receipt else {},
        effect.provider_operation_id,
    )
    with transaction.atomic():
        submission = command_submit(
            principal=principal,
            idempotency_key=compensation_key(effect),
            type=contract.compensator,
            resource=resource,
            payload=payload,
            intent={"summary": f"compensate {effect.pk}: {reason}"[:4000]},
            context=effect.command.context,
            compensates=effect.command,
            saga_id=effect.command.saga_id,
            saga_step=effect.command.saga_step and f"{effect.command.saga_step}:compensation",
        )
        if not ledger.transition(
            effect,
            to=S.COMPENSATING,
            actor=principal.label,
            principal=principal,
            kind="compensation_issued",
            reason=reason,
            data={"compensation": submission.effect.pk},
            compensated_by=submission.effect.command,
        ):
            raise InvalidTransition(f"Effect {effect.pk} changed meanwhile; try again.")
    return submission


# --- dispatch ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    effect_id: str
    fence: int
    attempt_id: int
    attempt_number: int
    # What the claim verified against the digests (gateway.integrity): exactly this is sent.
    payload: dict[str, Any] | None = None


def effect_expire(*, effect: Effect, actor: str) -> bool:
    """An expired command is never sent: EXPIRED, with the reason."""
    return ledger.transition(
        effect,
        to=S.EXPIRED,
        actor=actor,
        reason="the command expired before it was sent",
        next_dispatch_at=None,
    )


def _approval_expired(effect: Effect, now) -> bool:
    if not effect.command.approval_required or effect.approved_at is None:
        return False
    return (now - effect.approved_at).total_seconds() > settings.GATEWAY_APPROVAL_TTL


def effect_claim(*, effect_id: str, worker: str) -> Claim | None:
    """PREPARED/NOT_STARTED → DISPATCHING with a new fence and an attempt row, committed
    before the provider is called. None when there is nothing to send (another worker got it,
    it is frozen, expired, or out of attempts)."""
    now = timezone.now()
    with transaction.atomic():
        effect = Effect.objects.select_related("command__requested_by").filter(pk=effect_id).first()
        if effect is None or effect.status not in DISPATCHABLE or effect.frozen:
            return None
        if any(hold.holds(effect) for hold in hooks.dispatch_holds):
            return None  # e.g. its saga is frozen: nothing of it is sent
        if effect.command.expires_at <= now:
            effect_expire(effect=effect, actor=f"worker:{worker}")
            return None
        blocker = capabilities.dispatch_blocker(effect.command, now=now)
        if blocker is not None:
            reason, final = blocker
            if final:
                ledger.transition(
                    effect,
                    to=S.REJECTED,
                    actor=f"worker:{worker}",
                    kind="authorisation_lost",
                    reason=f"{reason}; it was never sent",
                    next_dispatch_at=None,
                )
            return None
        if _approval_expired(effect, now):
            assert effect.approved_at is not None  # _approval_expired says it was approved
            ledger.transition(
                effect,
                to=S.AWAITING_APPROVAL,
                actor=f"worker:{worker}",
                kind="approval_expired",
                reason=f"approved at {effect.approved_at.isoformat()}, more than "
                f"{settings.GATEWAY_APPROVAL_TTL:.0f}s before dispatch: approve it again",
                approval_state=ApprovalState.EXPIRED,
                next_dispatch_at=None,
            )
            return None
        payload, problem = verified_payload(effect)
        if problem:
            effect_refuse_tampered(effect=effect, problem=problem, actor=f"worker:{worker}")
            return None
        contract = get_contract(effect.type)
        budget = contract.recovery.max_dispatch_attempts if contract else 1
        if effect.attempt_count >= budget:
            if effect.next_dispatch_at is not None:
                audit.lock_chain(effect.tenant_id)  # chain head before the row
                ledger.annotate(
                    effect,
                    expect_status=effect.status,
                    fields={"next_dispatch_at": None, "escalated": True},
                    kind="retry_budget_exhausted",
                    actor=f"worker:{worker}",
                    reason=f"{effect.attempt_count} attempts, none reached the provider",
                    now=now,
                )
            return None
        fence = effect.fence + 1
        number = effect.attempt_count + 1
        # Compare-and-set on status and fence against a second worker holding the same
        # message (a redelivery, or the sweeper's copy): only one of them moves the fence.
        if not ledger.transition(
            effect,
            to=S.DISPATCHING,
            actor=f"worker:{worker}",
            kind="claimed",
            reason=f"attempt {number}",
            expect_fence=effect.fence,
            data={"fence": fence},
            fence=fence,
            attempt_count=number,
            next_dispatch_at=None,
            lease_expires_at=now + timedelta(seconds=settings.GATEWAY_DISPATCH_LEASE),
        ):
            return None
        attempt = Attempt.objects.create(
            effect=effect,
            number=number,
            fence=fence,
            worker=worker,
            state=AttemptState.SENDING,
            started_at=now,
        )
    return Claim(
        effect_id=effect_id,
        fence=fence,
        attempt_id=attempt.pk,
        attempt_number=number,
        payload=payload,
    )


class _Counts(NamedTuple):
    """The two counts of an effect that ``outcome_fields`` reads."""

    attempt_count: int
    check_count: int


def outcome_fields(effect: Effect | _Counts, result: CallResult, *, now) -> dict[str, Any]:
    """Bookkeeping that goes with the status an outcome leads to."""
    status = OUTCOME_STATUS[result.outcome]
    fields: dict[str, Any] = {"lease_expires_at": None, "next_check_at": None}
    if result.operation is not None:
        fields["provider_operation_id"] = result.operation.id
    if result.mismatch:
        fields["mismatch"] = True
    if status == S.CONFIRMED:
        fields["confirmed_at"] = now
    if status == S.NOT_STARTED:
        fields["next_dispatch_at"] = now + ledger.backoff(
            settings.GATEWAY_RETRY_BACKOFF, effect.attempt_count
        )
    elif status in (S.UNKNOWN, S.IN_PROGRESS) and not result.mismatch:
        fields["next_check_at"] = now + ledger.backoff(
            settings.GATEWAY_RECONCILE_BACKOFF, effect.check_count + 1
        )
    return fields


def effect_record_outcome(*, claim: Claim, result: CallResult, worker: str) -> Effect | None:
    """Write a dispatch outcome, only while ``claim`` still holds the effect.

    A stale worker — its lease ran out and recovery made the effect UNKNOWN, or another claim
    moved the fence — writes nothing but a refusal event and its attempt's end: the current
    owner of the effect decides, with a lookup, what happened.
    """
    now = timezone.now()
    status = OUTCOME_STATUS[result.outcome]
    with transaction.atomic():
        effect = Effect.objects.select_related("command").get(pk=claim.effect_id)
        attempt_fields = {
            "outcome": result.outcome,
            "http_status": result.http_status,
            "provider_operation_id": result.operation.id if result.operation else "",
            "error": (result.error or "")[:2000],
            "finished_at": now,
        }
        evidence = {
            "attempt": claim.attempt_number,
            "fence": claim.fence,
            "outcome": str(result.outcome),
            "http_status": result.http_status,
            "provider_operation_id": result.operation.id if result.operation else None,
            "provider_status": result.operation.status if result.operation else None,
            "mismatch": result.mismatch,
            "error": (result.error or "")[:500],
        }
        if (
            effect.status != S.DISPATCHING
            or effect.fence != claim.fence
            or not ledger.transition(
                effect,
                to=status,
                actor=f"worker:{worker}",
                kind="dispatched",
                reason=result.reason,
                expect_fence=claim.fence,
                data=evidence,
                **outcome_fields(effect, result, now=now),
            )
        ):
            Attempt.objects.filter(pk=claim.attempt_id).update(
                state=AttemptState.STALE, **attempt_fields
            )
            effect.refresh_from_db()
            ledger.append_event(
                effect,
                kind="stale_write_refused",
                actor=f"worker:{worker}",
                from_status=effect.status,
                to_status=effect.status,
                data=evidence,
                reason=(
                    f"worker held fence {claim.fence}, the effect is at fence {effect.fence} "
                    f"and {effect.status}: its answer ({result.outcome}) is not written"
                ),
            )
            logger.warning(
                "stale write refused",
                extra={"effect_id": effect.pk, "fence": claim.fence, "current": effect.fence},
            )
            return None
        Attempt.objects.filter(pk=claim.attempt_id).update(
            state=AttemptState.FINISHED, **attempt_fields
        )
        ledger.record_receipt(
            effect, result, source=Receipt.Source.DISPATCH, attempt_id=claim.attempt_id, now=now
        )
    return effect


def execute_request(
    effect: Effect, *, timeout: float | None = None, payload: dict[str, Any] | None = None
) -> ExecuteRequest:
    command = effect.command
    return ExecuteRequest(
        effect_id=effect.pk,
        type=command.type,
        idempotency_key=command.provider_key,
        resource=command.resource,
        payload=payload if payload is not None else command_payload(command),
        payload_digest=command.payload_digest,
        timeout=timeout or settings.GATEWAY_PROVIDER_TIMEOUT,
    )


def effect_dispatch(*, effect_id: str, worker: str | None = None) -> bool:
    """Claim, send once, record. False when there was nothing to send."""
    worker = worker or worker_name()
    if fastpath.enabled():
        sent = _dispatch_fast(effect_id, worker)
        if sent is not None:
            return sent
    return effect_dispatch_general(effect_id=effect_id, worker=worker)


def effect_dispatch_general(*, effect_id: str, worker: str) -> bool:
    """The general path of ``effect_dispatch``: every check read and decided in Python
    (expire, reject, re-ask approval, escalate, a saga's hold), then send and record."""
    claim = effect_claim(effect_id=effect_id, worker=worker)
    if claim is None:
        return False
    failpoint("dispatch.after_claim")  # claimed and committed, nothing sent yet
    effect = Effect.objects.select_related("command").get(pk=effect_id)
    contract = get_contract(effect.type)
    assert contract is not None, f"no contract for {effect.type}"
    adapter = adapter_for(contract)
    request = execute_request(effect, payload=claim.payload)
    started = timezone.now()
    result = adapter.execute(request)
    if result.outcome == Outcome.UNKNOWN and not result.mismatch and result.http_status:
        # The provider answered (a 5xx), so its request handling is over: ask it by key
        # whether it committed before deciding anything (query first, never a blind retry).
        result = _settle_by_lookup(adapter, request, contract, result)
    _observe_dispatch(effect.type, result, (timezone.now() - started).total_seconds())
    failpoint("dispatch.after_call")  # the provider may have committed; the ledger not yet
    effect_record_outcome(claim=claim, result=result, worker=worker)
    failpoint("dispatch.after_record")  # recorded; the broker message not yet acknowledged
    return True


def _dispatch_fast(effect_id: str, worker: str) -> bool | None:
    """Claim, send, record in two statements (gateway.fastpath), same failpoints and rules as
    below. None when the claim's checks do not all hold: the general path decides."""
    claim = fastpath.claim(effect_id=effect_id, worker=worker)
    if claim is None:
        return None
    logger.info("effect claimed", extra={"effect_id": effect_id, "fence": claim.fence})
    moves.after_commit([effect_id])  # DISPATCHING, for the long polls waiting on it
    failpoint("dispatch.after_claim")  # claimed and committed, nothing sent yet
    sent = fast_send(claim)
    if sent.result is None:
        fast_refuse_tampered(claim, problem=sent.problem, worker=worker)
        return True
    failpoint("dispatch.after_call")  # the provider may have committed; the ledger not yet
    now = timezone.now()
    if fastpath.record(
        claim=claim,
        result=sent.result,
        worker=worker,
        fields=fast_fields(claim, sent.result, now),
        now=now,
    ):
        moves.after_commit([effect_id])
        log_recorded(effect_id, sent.result)
    else:  # stale, or a compensation / saga / webhook endpoint needs the general record
        fast_record_general(claim, sent.result, worker=worker)
    failpoint("dispatch.after_record")  # recorded; the broker message not yet acknowledged
    return True


@dataclass(frozen=True)
class Sent:
    """What became of a fast claim: the provider's answer, or (``result`` None) why its
    payload was not sent."""

    result: CallResult | None
    problem: str = ""


def fast_send(claim: fastpath.FastClaim) -> Sent:
    """Open and check a fast claim's payload, send it once, settle a 5xx by a lookup. No
    database access: a drainer runs it on its call pool (gateway.dispatcher)."""
    payload, problem = verified_claimed_payload(
        effect_id=claim.effect_id,
        sealed=claim.payload_sealed,
        type=claim.type,
        resource=claim.resource,
        digest=claim.payload_digest,
    )
    if payload is None:
        return Sent(None, problem)
    contract = get_contract(claim.type)
    assert contract is not None, f"no contract for {claim.type}"
    adapter = adapter_for(contract)
    request = ExecuteRequest(
        effect_id=claim.effect_id,
        type=claim.type,
        idempotency_key=claim.provider_key,
        resource=claim.resource,
        payload=payload,
        payload_digest=claim.payload_digest,
        timeout=settings.GATEWAY_PROVIDER_TIMEOUT,
    )
    started = timezone.now()
    result = adapter.execute(request)
    if result.outcome == Outcome.UNKNOWN and not result.mismatch and result.http_status:
        result = _settle_by_lookup(adapter, request, contract, result)
    _observe_dispatch(claim.type, result, (timezone.now() - started).total_seconds())
    return Sent(result)


def fast_refuse_tampered(claim: fastpath.FastClaim, *, problem: str, worker: str) -> None:
    effect_refuse_tampered_claim(
        effect_id=claim.effect_id,
        fence=claim.fence,
        attempt_id=claim.attempt_id,
        problem=problem,
        actor=f"worker:{worker}",
    )


def fast_fields(claim: fastpath.FastClaim, result: CallResult, now) -> dict[str, Any]:
    """``outcome_fields`` for a fast claim (the counts the claim returned, no row read)."""
    counts = _Counts(attempt_count=claim.attempt_number, check_count=claim.check_count)
    return outcome_fields(counts, result, now=now)


def fast_record_general(claim: fastpath.FastClaim, result: CallResult, *, worker: str) -> None:
    """Record a fast claim's outcome the general way: a stale claim's refusal, or the writes
    of a compensation, a saga step or a webhook endpoint."""
    general = Claim(claim.effect_id, claim.fence, claim.attempt_id, claim.attempt_number)
    effect_record_outcome(claim=general, result=result, worker=worker)


def log_recorded(effect_id: str, result: CallResult) -> None:
    logger.info(
        "effect transition",
        extra={"effect_id": effect_id, "from": S.DISPATCHING, "to": OUTCOME_STATUS[result.outcome]},
    )


def _settle_by_lookup(adapter, request: ExecuteRequest, contract, first: CallResult) -> CallResult:
    from gateway.providers.base import LookupStatus
    from gateway.providers.http import classify_operation

    lookup = adapter.lookup(idempotency_key=request.idempotency_key, timeout=request.timeout)
    if lookup.status == LookupStatus.NOT_FOUND:
        return CallResult(
            Outcome.NOT_STARTED,
            f"{first.reason}; the provider's lookup by key finds no operation",
            http_status=first.http_status,
            error=first.error,
        )
    if lookup.status == LookupStatus.FOUND and lookup.operation is not None:
        found = classify_operation(
            lookup.operation,
            expected_digest=request.payload_digest,
            completion_statuses=contract.completion_statuses,
            http_status=first.http_status,
        )
        return CallResult(
            found.outcome,
            f"{first.reason}; lookup: {found.reason}",
            operation=found.operation,
            http_status=first.http_status,
            error=first.error,
            mismatch=found.mismatch,
        )
    return first


def _observe_dispatch(effect_type: str, result: CallResult, seconds: float) -> None:
    from gateway.metrics import DISPATCH_SECONDS

    DISPATCH_SECONDS.labels(type=effect_type, outcome=str(result.outcome)).observe(seconds)


def redeliver_at(now: datetime) -> Any:
    """When the sweeper may send an overdue effect's message again (an SQL expression on the
    row): after as long as the effect has waited so far, at least GATEWAY_REDELIVER_AFTER and
    at most GATEWAY_REDELIVER_MAX.

    The first message is most likely waiting behind a backlog, not lost: a fixed interval
    re-sent every waiting effect every 30 s (300 effects queued → 1983 messages, 1620 of them
    no-ops that lengthened the very backlog). Doubling the wait bounds the copies per effect
    by log2(backlog / interval) and still resends a truly lost message within the cap.
    """
    waited = ExpressionWrapper(Value(now) - F("status_changed_at"), output_field=DurationField())
    wait = Least(
        Greatest(Value(timedelta(seconds=settings.GATEWAY_REDELIVER_AFTER)), waited),
        Value(timedelta(seconds=settings.GATEWAY_REDELIVER_MAX)),
    )
    return ExpressionWrapper(Value(now) + wait, output_field=DateTimeField())


def dispatch_sweep(*, limit: int = 500) -> int:
    """Re-send PREPARED/NOT_STARTED effects whose dispatch has gone quiet, and expire the ones
    whose command ran out. The broker can lose a message; the ledger cannot.

    An overdue effect is most often waiting behind a backlog, not lost: a drainer is at work
    and will claim it with the rest. So the first time a drain would take it (PREPARED, not a
    saga's step), the sweeper wakes one more drainer for all of them at once instead of a
    message each; one message per overdue effect had each sent through the single dispatch,
    the dearest path, while the backlog lasted (9,050 overdue at once in one profiled pass of
    the bench: half the worker's samples went to publishing and running those messages).
    Held effects (a frozen principal or type) are no drain's: during a backlog they wait, as
    they must, and once unfrozen they are due to every drain again (the next one takes them,
    or the sweep's first look after the drainers stop sends them one by one).
    While a drainer is at work (it claimed in the last few seconds: ``hooks.drainers_at_work``)
    that holds at every look, however long the backlog lasts. Otherwise an effect overdue
    again (a wake-up nobody answered: no drainer threads, or Redis lost it), a NOT_STARTED
    one (its retry time, which a drain respects, was just pushed back) and a saga's step get
    their own message, as always. ``_first_look`` says how the sweeper tells a second look.
    """
    now = timezone.now()
    expired = 0
    for effect in Effect.objects.select_related("command").filter(
        status__in=BEFORE_DISPATCH, command__expires_at__lte=now
    )[:limit]:
        with transaction.atomic():
            expired += effect_expire(effect=effect, actor="sweeper")
    waiting = Effect.objects.filter(
        status__in=DISPATCHABLE, next_dispatch_at__lte=now, frozen=False
    )
    # Effects held (a frozen saga) wait where they are: sending them to a worker that will
    # refuse them every sweep is noise.
    for hold in hooks.dispatch_holds:
        waiting = hold.exclude(waiting)
    # One batch: the due rows locked and pushed back in two statements, however many.
    # SKIP LOCKED against a second sweeper (two beats, a misconfiguration) and against a
    # worker claiming one of them right now; even a double enqueue sends once (the claim).
    with transaction.atomic():
        due = list(
            waiting.order_by("next_dispatch_at")
            .select_for_update(skip_locked=True, of=("self",))
            .values_list("pk", "status", "status_changed_at", "command__saga_id")[:limit]
        )
        if due:
            Effect.objects.filter(pk__in=[row[0] for row in due]).update(
                next_dispatch_at=redeliver_at(now)
            )
    drains_take = [row for row in due if row[1] == S.PREPARED and not row[3]]
    at_work = bool(drains_take) and _drainers_at_work()
    drained = [row[0] for row in drains_take if at_work or _first_look(now, row[2])]
    if drained:
        # One wake-up past the due flag, whoever holds it: a drainer claims every PREPARED
        # effect, in order of next_dispatch_at, until none is left.
        ledger.publish(hooks.wake_sender.send, f"sweep: {len(drained)} overdue")
    for effect_id in {row[0] for row in due} - set(drained):
        ledger.publish(hooks.dispatch_sender.send, effect_id)
    return len(due) + expired


def _drainers_at_work() -> bool:
    """Whether a drainer claimed work in the last few seconds (``hooks.drainers_at_work``);
    False when Redis cannot say: the sweep then sends what it saw before one by one."""
    try:
        return hooks.drainers_at_work.ask()
    except Exception:
        logger.warning("could not ask whether a drainer is at work", exc_info=True)
        return False


def _first_look(now: datetime, status_changed_at: datetime) -> bool:
    """Whether the sweeper sees an overdue PREPARED effect for the first time. Without a
    column for it: such an effect is due ``GATEWAY_REDELIVER_AFTER`` after its status changed
    (submission or approval), and each look pushes it back by at least as long as it has
    waited (``redeliver_at``), so at a second look it has waited at least twice that. A
    sweeper that was down longer than that sends one by one, as before: the old way is always
    correct, only dearer."""
    return now - status_changed_at < 2 * timedelta(seconds=settings.GATEWAY_REDELIVER_AFTER)
