"""What the dispatcher checks before a payload leaves: that it is the payload approved.

The command row is append-only except for ``payload_sealed`` (re-sealed on key rotation), and
the digest an approver signs is computed at submission. So before sending, the dispatcher
opens the sealed payload *bound to this command* (gateway.lib.vault.seal_bound: a ciphertext
copied from another command does not open) and recomputes the RFC 8785 digest from what it
opened; it must equal the command's digest and, when approval was needed, the approved one.
Anything else is tampering: the effect is frozen, flagged as a mismatch with a case for its
owner, and never sent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, cast

from django.db import transaction
from django.utils import timezone

from gateway import audit, hooks, ledger, signing
from gateway.choices import ApprovalState
from gateway.contracts import get_contract
from gateway.lib.digest import payload_digest
from gateway.lib.vault import InvalidToken, open_bound
from gateway.models import Command, Effect

logger = logging.getLogger(__name__)


def payload_binding(*, effect_id: str, digest: str) -> str:
    """The associated data a command's payload is sealed with: its effect id and digest."""
    return f"effect-gateway/command-payload\x00{effect_id}\x00{digest}"


def open_command_payload(command: Command) -> dict[str, Any]:
    return open_bound(
        command.payload_sealed,
        bound_to=payload_binding(effect_id=command.effect_id, digest=command.payload_digest),
    )


def verified_payload(effect: Effect) -> tuple[dict[str, Any] | None, str]:
    """(the payload to send, '') or (None, why it must not be sent)."""
    command = effect.command
    try:
        payload = open_command_payload(command)
    except (InvalidToken, ValueError) as exc:
        return None, f"the sealed payload does not open for this command ({exc})"
    digest = payload_digest(type=command.type, resource=command.resource, payload=payload)
    if digest != command.payload_digest:
        return None, (
            f"the sealed payload has digest {digest}, the command {command.payload_digest}"
        )
    if command.approval_required and (
        effect.approval_state != ApprovalState.APPROVED or effect.approved_digest != digest
    ):
        return None, (
            f"the approval names digest {effect.approved_digest or 'none'}, the payload {digest}"
        )
    # The approval's signature and the submitting token (gateway.signing): a refusal carries
    # the event kind and flag it is recorded with.
    refusal = signing.dispatch_refusal(effect, payload)
    if refusal is not None:
        return None, refusal
    return payload, ""


@dataclass(frozen=True)
class ShownPayload:
    """A payload as a page or an API read may show it: taken from the sealed payload after its
    digest was checked, never from a column that a database writer could edit alone."""

    payload: dict[str, Any] | None
    verified: bool
    problem: str = ""


def payload_to_show(
    command: Command, *, clear: bool, opened: dict[str, Any] | None = None
) -> ShownPayload:
    """What a reader sees of ``command``'s payload: the clear payload (``clear``: a role
    allowed to see it) or its redaction, both from the sealed payload once its digest is the
    command's. ``opened``: the clear payload in hand (just submitted, never stored unsealed).

    Anything else is a record that failed verification, shown as such with no payload: a
    payload that does not open, one whose digest is not the command's, or a stored redaction
    that is not the redaction of the sealed payload (what an approver reads would not be what
    the digest binds)."""
    payload = opened
    if payload is None:
        try:
            payload = open_command_payload(command)
        except (InvalidToken, ValueError) as exc:
            return ShownPayload(None, False, f"the sealed payload does not open ({exc})")
        found = payload_digest(type=command.type, resource=command.resource, payload=payload)
        if found != command.payload_digest:
            return ShownPayload(
                None,
                False,
                f"the sealed payload has digest {found}, the command {command.payload_digest}",
            )
    if clear:
        return ShownPayload(payload, True)
    contract = get_contract(command.type)
    redacted = ledger.redact(payload, contract) if contract else command.payload_redacted
    if redacted != command.payload_redacted:
        return ShownPayload(
            None, False, "the stored redacted payload is not the redaction of the sealed one"
        )
    return ShownPayload(redacted, True)


def verified_claimed_payload(
    *, effect_id: str, sealed: str, type: str, resource: dict[str, Any], digest: str
) -> tuple[dict[str, Any] | None, str]:
    """The fast path's check (gateway.fastpath claims in one statement, then this): the
    payload opens bound to its command and has the command's digest. (The approval's
    digest is the command's by construction: the approval compares them when it is given.)"""
    try:
        payload = open_bound(sealed, bound_to=payload_binding(effect_id=effect_id, digest=digest))
    except (InvalidToken, ValueError) as exc:
        return None, f"the sealed payload does not open for this command ({exc})"
    found = payload_digest(type=type, resource=resource, payload=payload)
    if found != digest:
        return None, f"the sealed payload has digest {found}, the command {digest}"
    # A fast claim is never of an approved command of a signed type (fastpath.CLAIM_CHECKS):
    # one whose contract asks for an approval of this payload had its approval flag edited.
    contract = get_contract(type)
    if type in signing.signed_types() and contract and contract.requires_approval(payload):
        return None, signing.Refusal(
            "its contract requires an approval of this payload, the row says none: the "
            "approval is not signed by the approver's key",
            kind="approval_unverified",
            flag="mismatch",
        )
    return payload, ""


def effect_refuse_tampered_claim(
    *, effect_id: str, fence: int, attempt_id: int, problem: str, actor: str
) -> None:
    """A fast claim found the payload tampered after it claimed: nothing was sent, so the
    effect goes DISPATCHING → NOT_STARTED (at the claim's fence), frozen and flagged, and the
    attempt is closed. The reconciler's flag sweep opens the owners' case."""
    from gateway.choices import AttemptState, EffectStatus, Outcome
    from gateway.models import Attempt

    kind, flag = _recorded_as(problem)
    logger.error(kind.replace("_", " "), extra={"effect_id": effect_id, "problem": problem})
    reason = f"{problem}; frozen, never sent"
    with transaction.atomic():
        effect = Effect.objects.select_related("command").get(pk=effect_id)
        moved = ledger.transition(
            effect,
            to=EffectStatus.NOT_STARTED,
            actor=actor,
            kind=kind,
            reason=reason,
            expect_fence=fence,
            data={"payload_digest": effect.command.payload_digest},
            frozen=True,
            next_dispatch_at=None,
            lease_expires_at=None,
            **cast(dict[str, Any], {flag: True}),  # mismatch or escalated
        )
        Attempt.objects.filter(pk=attempt_id, state=AttemptState.SENDING).update(
            state=AttemptState.FINISHED,
            outcome=Outcome.NOT_STARTED,
            error=f"not sent: {problem}"[:2000],
            finished_at=timezone.now(),
        )
        if moved:
            for listener in hooks.mismatch_found:
                listener(effect, actor=actor, reason=reason)


def effect_refuse_tampered(*, effect: Effect, problem: str, actor: str) -> None:
    """Freeze a tampered effect and flag the mismatch; nothing is sent.

    Runs inside the claim's transaction, before any fence moves, so no worker can have sent
    it; a second worker holding the same message finds it frozen and does nothing. The flag
    puts it in the owners' queue (the reconciler opens a mismatch case for every flagged
    effect), and the ``mismatch_found`` listeners act as for any mismatch (a saga freezes).
    """
    kind, flag = _recorded_as(problem)
    logger.error(kind.replace("_", " "), extra={"effect_id": effect.pk, "problem": problem})
    audit.lock_chain(effect.tenant_id)  # chain head before the row (gateway.audit)
    Effect.objects.filter(pk=effect.pk, frozen=False).update(
        frozen=True, next_dispatch_at=None, updated_at=timezone.now(), **{flag: True}
    )
    effect.frozen = True
    setattr(effect, flag, True)
    reason = f"{problem}; frozen, never sent"
    ledger.append_event(
        effect,
        kind=kind,
        actor=actor,
        from_status=effect.status,
        to_status=effect.status,
        reason=reason,
        data={"payload_digest": effect.command.payload_digest},
    )
    for listener in hooks.mismatch_found:
        listener(effect, actor=actor, reason=reason)


def _recorded_as(problem: str) -> tuple[str, str]:
    """The event kind and the effect flag a refusal is recorded with: a tampered payload by
    default, or what a ``signing.Refusal`` says (a forged approval, a revoked token)."""
    if isinstance(problem, signing.Refusal):
        return problem.kind, problem.flag
    return "payload_tampered", "mismatch"
