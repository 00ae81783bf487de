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
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from gateway import audit, capabilities, deadlines, fastpath, hooks, ledger, moves, submission
from gateway.choices import APPROVER_ROLES as APPROVER_ROLES
from gateway.choices import (
    BEFORE_DISPATCH,
    DISPATCHABLE,
    OUTCOME_STATUS,
    ApprovalState,
    AttemptState,
    EffectStatus,
    EventKind,
    Outcome,
    Role,
)
from gateway.choices import OPERATOR_ROLES as OPERATOR_ROLES
from gateway.choices import SUBMITTER_ROLES as SUBMITTER_ROLES
from gateway.compensating import compensation_plan
from gateway.contracts import EffectContract, get_contract
from gateway.dispatch_gates import gated, observe_answer
from gateway.errors import (
    CompensationNotBuildable,
    DigestMismatch,
    IdempotencyKeyMismatch,
    InvalidTransition,
    NotPermitted,
    ValidationProblem,
)
from gateway.fastpath import log_claimed as log_claimed
from gateway.fastpath import log_recorded as log_recorded
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
from gateway.models import ApiToken, Attempt, Command, Effect, Principal, Receipt, new_effect_id
from gateway.provider_credentials import SendAs, attempts_note_sender, claim_sender
from gateway.providers.base import CallResult, ExecuteRequest
from gateway.providers.registry import adapter_for
from gateway.signing import SignedDecision, approval_signature, signed_data
from gateway.sweep import dispatch_sweep as dispatch_sweep

logger = logging.getLogger(__name__)

S = EffectStatus


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# --- submission -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Submission:
    effect: Effect
    created: bool


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
    token: ApiToken | None = None,
) -> Submission:
    """Freeze a command and create its effect, or return the effect this key already names.
    ``token``: the API token it came with (dispatch refuses it if that was revoked by then).

    Same key + same digest returns the existing effect (``created=False``), however many
    callers race: they collide on the (tenant, key) unique index, not on a prior SELECT.
    Same key + another digest raises IdempotencyKeyMismatch. Nothing is written otherwise,
    except what a ``hooks.command_replayed`` listener records of a replay (a new waiter).
    """
    submitted = _command_submit(
        principal=principal,
        idempotency_key=idempotency_key,
        type=type,
        resource=resource,
        payload=payload,
        intent=intent,
        context=context,
        expires_in=expires_in,
        compensates=compensates,
        saga_id=saga_id,
        saga_step=saga_step,
        token=token,
    )
    if not submitted.created:
        for listener in hooks.command_replayed:
            listener(submitted.effect, principal=principal, context=context)
    return submitted


def _command_submit(
    *,
    principal: Principal,
    idempotency_key: str,
    type: Any,
    resource: Any,
    payload: Any,
    intent: Any,
    context: Any,
    expires_in: Any,
    compensates: Command | None,
    saga_id: str | None,
    saga_step: str,
    token: ApiToken | None,
) -> Submission:
    ledger.validate_idempotency_key(idempotency_key, what="command")
    contract = get_contract(type) if isinstance(type, str) else None
    resource, payload = submission.without_nulls(resource), submission.without_nulls(payload)
    errors = submission.validate(
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
    # An API token's revocation is checked again at dispatch; an OAuth access token (remote
    # MCP) is deleted when revoked, and its requests stop at once.
    token_id = token.pk if isinstance(token, ApiToken) else None
    request = _Request(principal, contract, idempotency_key, digest, resource, payload, intent,
                       context, expires_in, token_id)  # fmt: skip
    if compensates is None and not saga_id and fastpath.enabled():
        fast = _submit_fast(request)
        if fast is not None:
            return fast
    existing = _existing_command(principal, idempotency_key, digest)
    if existing is not None:
        return Submission(existing, created=False)
    try:
        with transaction.atomic():
            effect = _submit_general(request, compensates=compensates, saga_id=saga_id or "",
                                     saga_step=saga_step)  # fmt: skip
    except IntegrityError:
        # Another request with this key committed first: it is the one effect for the key.
        existing = _existing_command(principal, idempotency_key, digest)
        if existing is None:
            raise
        return Submission(existing, created=False)
    return Submission(effect, created=True)


class _Request(NamedTuple):
    """A valid submission, as both paths write it."""

    principal: Principal
    contract: EffectContract
    key: str
    digest: str
    resource: dict[str, Any]
    payload: dict[str, Any]
    intent: Any
    context: Any
    expires_in: Any
    token_id: int | None

    def rows(self, *, effect_id: str, capability_id: str | None, reserved: int, now, **saga):
        """The rows to write (``submission.new_rows``), the payload sealed and redacted."""
        digest = self.digest
        return submission.new_rows(
            effect_id=effect_id,
            principal=self.principal,
            contract=self.contract,
            idempotency_key=self.key,
            digest=digest,
            resource=self.resource,
            payload=self.payload,
            intent=self.intent,
            context=self.context,
            expires_in=self.expires_in,
            token_id=self.token_id,
            # Bound to this command: a ciphertext copied from another row won't open.
            sealed=seal_bound(
                self.payload, bound_to=payload_binding(effect_id=effect_id, digest=digest)
            ),
            redacted=redact(self.payload, self.contract),
            capability_id=capability_id,
            reserved=reserved,
            now=now,
            **saga,
        )


def _submit_general(
    request: _Request, *, compensates: Command | None, saga_id: str, saga_step: str
) -> Effect:
    """Reserve on a grant and write the command, its effect and its event, in the caller's
    transaction; a saga's step is handed to a worker on its own, any other is due."""
    principal, now = request.principal, timezone.now()
    capability, reserved = capabilities.capability_reserve(
        principal=principal,
        contract=request.contract,
        resource=request.resource,
        payload=request.payload,
    )
    wait = capabilities.approval_wait(
        principal=principal,
        contract=request.contract,
        payload=request.payload,
        capability=capability,
        compensates=compensates,
    )
    rows = request.rows(
        effect_id=new_effect_id(),
        capability_id=capability.pk if capability else None,
        reserved=reserved,
        now=now,
        wait=wait,
        compensates_id=compensates.pk if compensates else None,
        saga_id=saga_id,
        saga_step=saga_step,
    )
    command = Command(**rows.command)
    command.requested_by, command.capability = principal, capability
    command.compensates = compensates
    command.save(force_insert=True)
    effect = Effect(**rows.effect)
    effect.command = command
    effect.save(force_insert=True)
    ledger.append_event(effect, principal=principal, now=now, **rows.event)
    for listener in hooks.effect_created:
        listener(effect)
    if effect.status == S.PREPARED and saga_id:
        ledger.enqueue_dispatch(effect.pk)  # a saga's step: sent on its own
    elif effect.status == S.PREPARED:
        ledger.enqueue_due(effect.pk)
    return effect


def _submit_fast(request: _Request) -> Submission | None:
    """The one-statement submission (gateway.fastpath), for a command that belongs to no saga
    and compensates nothing; a budget is reserved in the same statement. None when the
    general path must decide."""
    principal, key, digest = request.principal, request.key, request.digest
    if (principal.tenant_id, key) in fastpath.known_keys:
        # A replay, most likely (an agent retrying): one SELECT, no seal, no insert attempt.
        existing = fastpath.replay(principal=principal, idempotency_key=key)
        if existing is not None:
            _check_replay_digest(existing.command, key, digest)
            return Submission(existing, created=False)
    if len(hooks.effect_created) and request.contract.requires_approval(request.payload):
        # A command that waits for an approver is announced (hooks.effect_created) in the
        # transaction that writes it, which is the general path's; the wait is human anyway.
        return None
    now = timezone.now()
    # A person (operator, admin) with no matching grant waits for an approver: the general
    # path says so. With one, a person is held to it exactly as an agent is.
    grant = fastpath.submission_grant(
        principal, request.contract, request.resource, request.payload, now
    )
    if grant is None:
        return None  # no grant, or an amount it refuses: the general path says why
    rows = request.rows(
        effect_id=new_effect_id(),
        capability_id=grant.capability.pk,
        reserved=grant.amount,
        now=now,
    )
    written = fastpath.submit(principal=principal, rows=rows, payload=request.payload, grant=grant)
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
    *,
    effect: Effect,
    principal: Principal,
    payload_digest: str,
    comment: str = "",
    signed: SignedDecision | None = None,
) -> Effect:
    """Approve exactly the digest the approver read; never the requester, never an agent.
    Where policy says so, only with ``signed``: the approver's key over the digest."""
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
        signature = approval_signature(effect=effect, principal=principal, signed=signed)
        if effect.status != S.AWAITING_APPROVAL or not ledger.transition(
            effect,
            to=S.PREPARED,
            actor=principal.label,
            principal=principal,
            kind="approved",
            reason=comment or "approved",
            data={"approved_digest": payload_digest, **signed_data(signature)},
            approval_state=ApprovalState.APPROVED,
            approved_by=principal,
            approved_digest=payload_digest,
            approved_at=now,
            next_dispatch_at=now + timedelta(seconds=settings.GATEWAY_REDELIVER_AFTER),
        ):
            effect.refresh_from_db()
            raise _not_awaiting_approval(effect)
        if signature is not None:
            signature.save()
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
    plan = compensation_plan(effect, contract)
    assert plan is not None  # the contract has a compensator
    if not plan.buildable:
        raise CompensationNotBuildable(
            plan.how_to_supply(effect.type), missing=list(plan.missing or plan.problems)
        )
    resource, payload = plan.resource, plan.payload
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
    # The credential the attempt names (gateway.provider_credentials): exactly it sends.
    send_as: SendAs = field(default_factory=SendAs)


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
    actor = ledger.worker_actor(worker)
    with transaction.atomic():
        effect = Effect.objects.select_related("command__requested_by").filter(pk=effect_id).first()
        if effect is None or effect.status not in DISPATCHABLE or effect.frozen:
            return None
        if any(hold.holds(effect) for hold in hooks.dispatch_holds):
            return None  # e.g. its saga is frozen: nothing of it is sent
        if _refused_before_claim(effect, now=now, actor=actor):
            return None
        payload, problem = verified_payload(effect)
        if problem:
            effect_refuse_tampered(effect=effect, problem=problem, actor=actor)
            return None
        if _attempts_spent(effect, now=now, actor=actor):
            return None
        fence = effect.fence + 1
        number = effect.attempt_count + 1
        # Compare-and-set on status and fence against a second worker holding the same
        # message (a redelivery, or the sweeper's copy): only one of them moves the fence.
        if not ledger.transition(
            effect,
            to=S.DISPATCHING,
            actor=actor,
            kind=EventKind.CLAIMED,
            reason=f"attempt {number}",
            expect_fence=effect.fence,
            data={"fence": fence},
            fence=fence,
            attempt_count=number,
            next_dispatch_at=None,
            lease_expires_at=now + timedelta(seconds=settings.GATEWAY_DISPATCH_LEASE),
        ):
            return None
        # Which adapter and credential send it; building the adapter here (once per
        # process) means one that cannot be built leaves nothing claimed.
        sender, send_as = claim_sender(effect, number)
        attempt = Attempt.objects.create(
            effect=effect,
            number=number,
            fence=fence,
            worker=worker,
            state=AttemptState.SENDING,
            started_at=now,
            **sender,
        )
    return Claim(
        effect_id=effect_id,
        fence=fence,
        attempt_id=attempt.pk,
        attempt_number=number,
        payload=payload,
        send_as=send_as,
    )


def _refused_before_claim(effect: Effect, *, now, actor: str) -> bool:
    """Whether the claim may not send ``effect`` now: its command expired (EXPIRED), its
    grant is gone (REJECTED) or it waits (a frozen principal or type), or its approval is
    too old (asked again). Writes the transition each of those leads to, in the claim's
    transaction."""
    if effect.command.expires_at <= now:
        effect_expire(effect=effect, actor=actor)
        return True
    blocker = capabilities.dispatch_blocker(effect.command, now=now)
    if blocker is not None:
        reason, final = blocker
        if final:
            ledger.transition(
                effect,
                to=S.REJECTED,
                actor=actor,
                kind="authorisation_lost",
                reason=f"{reason}; it was never sent",
                next_dispatch_at=None,
            )
        return True
    if _approval_expired(effect, now):
        assert effect.approved_at is not None  # _approval_expired says it was approved
        ledger.transition(
            effect,
            to=S.AWAITING_APPROVAL,
            actor=actor,
            kind="approval_expired",
            reason=f"approved at {effect.approved_at.isoformat()}, more than "
            f"{settings.GATEWAY_APPROVAL_TTL:.0f}s before dispatch: approve it again",
            approval_state=ApprovalState.EXPIRED,
            next_dispatch_at=None,
        )
        return True
    return False


def _attempts_spent(effect: Effect, *, now, actor: str) -> bool:
    """Whether ``effect`` has used its contract's attempt budget; the first time it is found
    so, it is escalated to a human and taken off the dispatch schedule."""
    contract = get_contract(effect.type)
    budget = contract.recovery.max_dispatch_attempts if contract else 1
    if effect.attempt_count < budget:
        return False
    if effect.next_dispatch_at is not None:
        audit.lock_chain(effect.tenant_id)  # chain head before the row
        ledger.annotate(
            effect,
            expect_status=effect.status,
            fields={"next_dispatch_at": None, "escalated": True},
            kind="retry_budget_exhausted",
            actor=actor,
            reason=f"{effect.attempt_count} attempts, none reached the provider",
            now=now,
        )
    return True


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
                actor=ledger.worker_actor(worker),
                kind=EventKind.DISPATCHED,
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
                actor=ledger.worker_actor(worker),
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
    """Claim, send once, record, unless the provider's gates hold it (gateway.dispatch_gates)."""
    worker = worker or worker_name()
    return gated(effect_id, lambda: _effect_dispatch(effect_id, worker))


def _effect_dispatch(effect_id: str, worker: str) -> bool:
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
    request = execute_request(effect, payload=claim.payload)
    started = timezone.now()
    if claim.send_as.refused:
        result = CallResult(Outcome.NOT_STARTED, f"{claim.send_as.refused}: nothing was sent")
    else:
        adapter = adapter_for(contract, claim.send_as.credential)
        result = adapter.execute(request)
    if result.outcome == Outcome.UNKNOWN and not result.mismatch and result.http_status:
        # The provider answered (a 5xx), so its request handling is over: ask it by key
        # whether it committed before deciding anything (query first, never a blind retry).
        result = _settle_by_lookup(adapter, request, contract, result)
    _observe_dispatch(
        effect.type, result, (timezone.now() - started).total_seconds(), claim.send_as
    )
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
    log_claimed(claim, worker=worker)
    send_as = attempts_note_sender([claim]).get(claim.attempt_id)
    moves.after_commit([effect_id])  # DISPATCHING, for the long polls waiting on it
    deadlines.lease_soon(timezone.now())  # a lease shorter than the waker's sleep
    failpoint("dispatch.after_claim")  # claimed and committed, nothing sent yet
    sent = fast_send(claim, send_as=send_as)
    if sent.result is None:
        fast_refuse_tampered(claim, problem=sent.problem, worker=worker)
        return True
    failpoint("dispatch.after_call")  # the provider may have committed; the ledger not yet
    now = timezone.now()
    fields = fast_fields(claim, sent.result, now)
    if fastpath.record(claim=claim, result=sent.result, worker=worker, fields=fields, now=now):
        moves.after_commit([effect_id])
        deadlines.soon(fields.get("next_check_at"))  # UNKNOWN / IN_PROGRESS: its first lookup
        log_recorded(effect_id, sent.result, worker=worker)
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


def fast_send(claim: fastpath.FastClaim, send_as: SendAs | None = None) -> Sent:
    """Open and check a fast claim's payload, send it once with ``send_as`` (what
    ``attempts_note_sender`` chose), settle a 5xx by a lookup. No database access: a drainer
    runs it on its call pool (gateway.dispatcher)."""
    send_as = send_as or SendAs()
    if send_as.refused:
        return Sent(CallResult(Outcome.NOT_STARTED, f"{send_as.refused}: nothing was sent"))
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
    adapter = adapter_for(contract, send_as.credential)
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
    _observe_dispatch(claim.type, result, (timezone.now() - started).total_seconds(), send_as)
    return Sent(result)


def fast_refuse_tampered(claim: fastpath.FastClaim, *, problem: str, worker: str) -> None:
    effect_refuse_tampered_claim(
        effect_id=claim.effect_id,
        fence=claim.fence,
        attempt_id=claim.attempt_id,
        problem=problem,
        actor=ledger.worker_actor(worker),
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


def _settle_by_lookup(adapter, request: ExecuteRequest, contract, first: CallResult) -> CallResult:
    from gateway.providers.base import LookupStatus
    from gateway.providers.http import classify_operation

    lookup = adapter.lookup(
        idempotency_key=request.idempotency_key,
        timeout=request.timeout,
        payload_digest=request.payload_digest,
    )
    if lookup.status == LookupStatus.NOT_FOUND:
        return CallResult(
            Outcome.NOT_STARTED,
            f"{first.reason}; the provider's lookup by key finds no operation",
            http_status=first.http_status,
            error=first.error,
            retry_after=first.retry_after,  # a 429's or 503's pause still stands
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


def _observe_dispatch(
    effect_type: str, result: CallResult, seconds: float, send_as: SendAs
) -> None:
    from gateway.metrics import DISPATCH_SECONDS

    DISPATCH_SECONDS.labels(type=effect_type, outcome=str(result.outcome)).observe(seconds)
    # The provider's circuit, and its Retry-After against the credential the call carried.
    credential = send_as.credential.fingerprint if send_as.credential is not None else None
    observe_answer(effect_type, result, credential)
