"""Capabilities (what an agent or a person may do, within which budget, until when) and
freezes. A person without a matching grant may still submit: the command waits for an
approver (``approval_wait``).

Checked twice: at submission, where the budget is *reserved* with one conditional UPDATE
(concurrent submissions cannot overspend it: PostgreSQL re-evaluates the WHERE clause on the
row it waited for), and again at dispatch, where a grant revoked or expired since, a frozen
principal or a frozen effect type stops the command before any byte is sent.
"""

from __future__ import annotations

from datetime import timedelta
from fnmatch import fnmatchcase
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from gateway import audit, hooks, moves, trust
from gateway.choices import BEFORE_DISPATCH, OPERATOR_ROLES, SUBMITTER_ROLES, EffectStatus, Role
from gateway.contracts import EffectContract
from gateway.errors import InvalidTransition, NotFound, NotPermitted, ValidationProblem
from gateway.lib.ids import new_id
from gateway.models import Capability, Command, Effect, EffectTypeFreeze, Principal


def _matches(capability: Capability, effect_type: str, resource: dict[str, Any]) -> bool:
    target = f"{resource.get('type')}:{resource.get('id')}"
    return any(fnmatchcase(effect_type, p) for p in capability.effect_types) and fnmatchcase(
        target, capability.resource_selector or "*"
    )


def _money(payload: dict[str, Any]) -> tuple[int, str]:
    """The amount (integer minor units) and currency the budget must count — exactly the
    values sent. A float or bool amount is refused, never counted as 0: that is how 9000.0
    once slipped past a budget (the payload schema refuses it first; this is the last line)."""
    amount = payload.get("amount", 0)
    if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
        raise ValidationProblem(
            "amount must be a non-negative whole number of minor units (cents).",
            errors={"payload.amount": ["must be an integer number of minor units"]},
        )
    currency = payload.get("currency", "")
    if not isinstance(currency, str):
        raise ValidationProblem(
            "currency must be an ISO 4217 code.", errors={"payload.currency": ["must be a string"]}
        )
    return amount, currency


def _live(now) -> Q:
    return Q(revoked_at__isnull=True) & (Q(expires_at__isnull=True) | Q(expires_at__gt=now))


def effect_types_permitted(principal: Principal) -> frozenset[str] | None:
    """The effect types ``principal`` may submit on some resource, or None for every type
    (people: under a grant, or waiting for an approver). A frozen principal may submit
    nothing. The budget is not looked at: it is checked, and reserved, at submission."""
    from gateway.contracts import CONTRACTS

    if principal.frozen:
        return frozenset()
    if principal.role != Role.AGENT:
        return None
    patterns = [
        pattern
        for capability in Capability.objects.filter(_live(timezone.now()), principal=principal)
        for pattern in capability.effect_types
    ]
    return frozenset(t for t in CONTRACTS if any(fnmatchcase(t, p) for p in patterns))


def capability_reserve(
    *, principal: Principal, contract: EffectContract, resource: dict, payload: dict
) -> tuple[Capability | None, int]:
    """The grant this submission runs under, with its budget share reserved.

    Agents need a live grant that matches the type and resource and has budget left. People
    (operators, admins) are held to the grants they have in the same way; with none that
    matches, the answer is no grant, and their command waits for an approver
    (``approval_wait``). Raises NotPermitted otherwise. Runs inside the submission's
    transaction: a rolled-back submission returns the budget.
    """
    now = timezone.now()
    amount, currency = _money(payload)
    candidates = [
        cap
        for cap in Capability.objects.filter(_live(now), principal=principal).order_by("created_at")
        if _matches(cap, contract.type, resource)
    ]
    if not candidates and principal.role != Role.AGENT:
        return None, 0  # a person under no grant: an approver decides (approval_wait)
    if not candidates:
        raise NotPermitted(
            f"No live capability lets {principal.name} submit {contract.type} on "
            f"{resource.get('type')}:{resource.get('id')}. Ask an admin for a grant."
        )
    for cap in candidates:
        if cap.budget_count is None and cap.budget_amount is None:
            # Nothing to reserve: no UPDATE, so one agent's submissions do not queue on its
            # grant's row (measured: the largest lock wait under load). A revocation racing
            # this submission is caught again at dispatch.
            return cap, 0
        moves_money = "amount" in payload or "currency" in payload
        if (
            moves_money
            and cap.budget_amount is not None
            and cap.budget_currency
            not in (
                "",
                currency,
            )
        ):
            # A grant in one currency covers no other, whatever the amount looks like.
            continue
        # Compare-and-set on the budget against concurrent submissions under this grant.
        budget = Q(budget_count__isnull=True) | Q(spent_count__lt=F("budget_count"))
        if amount and cap.budget_amount is not None:
            budget &= Q(spent_amount__lte=F("budget_amount") - amount)
        reserved = Capability.objects.filter(_live(now), budget, pk=cap.pk).update(
            spent_count=F("spent_count") + 1,
            spent_amount=F("spent_amount") + (amount if cap.budget_amount is not None else 0),
        )
        if reserved:
            return cap, amount if cap.budget_amount is not None else 0
    raise NotPermitted(
        f"The budget of {principal.name}'s capability for {contract.type} is spent "
        f"(or does not cover {amount} {currency})."
    )


def approval_wait(
    *,
    principal: Principal,
    contract: EffectContract,
    payload: dict,
    capability: Capability | None,
    compensates: Command | None = None,
) -> str | None:
    """Why a submission waits for an approver, or None when it may go without one.

    The contract's policy decides for everyone. A person (operator, admin) submitting under
    no grant also waits: a role lets them act, not spend without limit, so another approver
    signs off on each such command. A compensation is not held to this: it undoes an
    effect already sent, with the compensator and the payload the contract derives from it.
    """
    if contract.requires_approval(payload):
        return "waiting for an approver: " + contract.approval.description
    if principal.role != Role.AGENT and capability is None and compensates is None:
        return (
            f"waiting for an approver: no grant lets {principal.name} submit "
            f"{contract.type} on its own"
        )
    return None


def capability_release(command: Command) -> None:
    """Give a never-sent command's reservation back to its grant (cancelled, expired,
    rejected before dispatch). Called once, when the effect reaches that end."""
    if command.capability_id is None:
        return
    budgeted = Q(budget_count__isnull=False) | Q(budget_amount__isnull=False)
    Capability.objects.filter(budgeted, pk=command.capability_id).update(
        spent_count=F("spent_count") - 1, spent_amount=F("spent_amount") - command.budget_amount
    )


@hooks.fast_path_idle("acts only on CANCELLED, EXPIRED or REJECTED before dispatch: never there")
def capability_release_unsent(effect: Effect, *, from_status: str, to: str) -> None:
    """``hooks.after_transition`` listener: a command that ends without ever being sent
    (cancelled, expired, rejected before dispatch) gives its share of the grant's budget back,
    in the transaction of that transition."""
    if to in (EffectStatus.CANCELLED, EffectStatus.EXPIRED) or (
        to == EffectStatus.REJECTED and from_status in BEFORE_DISPATCH
    ):
        capability_release(effect.command)


def dispatch_blocker(command: Command, *, now) -> tuple[str, bool] | None:
    """Why this command may not be sent now, and whether that is final.

    Final (the command is REJECTED, never sent): its grant was revoked or expired.
    Not final (it waits): its principal or its effect type is frozen.
    """
    principal = command.requested_by
    if principal.frozen:
        return f"principal {principal.name} is frozen", False
    if EffectTypeFreeze.objects.filter(tenant_id=command.tenant_id, type=command.type).exists():
        return f"effect type {command.type} is frozen", False
    if command.capability_id:
        cap = Capability.objects.get(pk=command.capability_id)
        if cap.revoked_at is not None:
            return f"capability {cap.pk} was revoked: {cap.revoked_reason or 'no reason'}", True
        if cap.expires_at is not None and cap.expires_at <= now:
            return f"capability {cap.pk} expired at {cap.expires_at.isoformat()}", True
    return None


def capability_grant(
    *,
    granted_by: str,
    principal: Principal,
    effect_types: list[str],
    resource_selector: str = "*",
    budget_count: int | None = None,
    budget_amount: int | None = None,
    budget_currency: str = "",
    expires_in: int | None = None,
) -> Capability:
    if principal.role not in SUBMITTER_ROLES:
        raise ValidationProblem(
            "Capabilities are granted to those who submit: agents, operators and admins.",
            errors={"principal": ["cannot submit"]},
        )
    if granted_by == principal.label:
        # Else an admin's own grant would stand in for the second person an approval is.
        raise NotPermitted("No one grants capabilities to themselves: ask another admin.")
    if not effect_types or not all(isinstance(p, str) and p for p in effect_types):
        raise ValidationProblem(
            "Name the effect types (patterns allowed).", errors={"effect_types": ["required"]}
        )
    with transaction.atomic():
        capability = Capability.objects.create(
            id=new_id("cap"),
            tenant_id=principal.tenant_id,
            principal=principal,
            effect_types=effect_types,
            resource_selector=resource_selector or "*",
            budget_count=budget_count,
            budget_amount=budget_amount,
            budget_currency=budget_currency,
            expires_at=timezone.now() + timedelta(seconds=expires_in) if expires_in else None,
            created_by=granted_by,
        )
        audit.record_control(
            tenant_id=principal.tenant_id,
            kind="capability_granted",
            subject=f"capability:{capability.pk}",
            actor=granted_by,
            data={
                "principal": principal.name,
                "effect_types": effect_types,
                "resource_selector": capability.resource_selector,
                "budget_count": budget_count,
                "budget_amount": budget_amount,
                "budget_currency": budget_currency,
                "expires_in": expires_in,
            },
        )
    return capability


def capability_revoke(*, capability: Capability, principal: Principal, reason: str) -> Capability:
    if principal.role not in OPERATOR_ROLES:
        raise NotPermitted(f"A principal with role {principal.role} cannot revoke grants.")
    with transaction.atomic():
        changed = Capability.objects.filter(pk=capability.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now(), revoked_reason=reason or f"revoked by {principal.name}"
        )
        if not changed:
            raise InvalidTransition(f"Capability {capability.pk} is already revoked.")
        audit.record_control(
            tenant_id=capability.tenant_id,
            kind="capability_revoked",
            subject=f"capability:{capability.pk}",
            actor=principal.label,
            principal=principal,
            reason=reason,
        )
    capability.refresh_from_db()
    # This process now; the others when the message reaches them (the TTL at worst).
    trust.forget_principal(capability.principal_id)
    moves.distrust_everywhere(principal_id=capability.principal_id)
    return capability


def effect_type_set_frozen(
    *, tenant_id: int, effect_type: str, principal: Principal, frozen: bool, reason: str = ""
) -> bool:
    """Freeze or unfreeze a whole effect type for a tenant; True when something changed."""
    if principal.role not in OPERATOR_ROLES:
        raise NotPermitted(f"A principal with role {principal.role} cannot freeze effect types.")
    with transaction.atomic():
        if frozen:
            try:
                with transaction.atomic():  # a savepoint: it may be frozen already
                    EffectTypeFreeze.objects.create(
                        tenant_id=tenant_id, type=effect_type, reason=reason, frozen_by=principal
                    )
            except IntegrityError:
                return False
        else:
            deleted, _ = EffectTypeFreeze.objects.filter(
                tenant_id=tenant_id, type=effect_type
            ).delete()
            if not deleted:
                return False
        audit.record_control(
            tenant_id=tenant_id,
            kind="type_frozen" if frozen else "type_unfrozen",
            subject=f"type:{effect_type}",
            actor=principal.label,
            principal=principal,
            reason=reason,
        )
    return True


def principal_set_frozen(
    *, target: Principal, principal: Principal, frozen: bool, reason: str = ""
) -> Principal:
    if principal.role not in OPERATOR_ROLES:
        raise NotPermitted(f"A principal with role {principal.role} cannot freeze principals.")
    if target.tenant_id != principal.tenant_id:
        raise NotFound(f"No principal {target.name}.")
    with transaction.atomic():
        if Principal.objects.filter(pk=target.pk, frozen=not frozen).update(frozen=frozen):
            audit.record_control(
                tenant_id=target.tenant_id,
                kind="principal_frozen" if frozen else "principal_unfrozen",
                subject=f"principal:{target.name}",
                actor=principal.label,
                principal=principal,
                reason=reason,
            )
    target.frozen = frozen
    # This process at once; the others when the message reaches them (the TTL at worst).
    trust.forget_principal(target.pk)
    moves.distrust_everywhere(principal_id=target.pk)
    return target
