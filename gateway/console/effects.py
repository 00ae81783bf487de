"""``/effects/<id>``: the effect page (intent, command and receipt side by side, timelines,
compensation) and its actions, each the call of the one service the API calls."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.http import HttpResponse
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from gateway import selectors, services
from gateway.choices import (
    APPROVER_ROLES,
    BEFORE_DISPATCH,
    OPERATOR_ROLES,
    SETTLED,
    TERMINAL,
    EffectStatus,
)
from gateway.compensating import compensation_plan
from gateway.console import extensions, verdict
from gateway.console.approvals import approval_card, blocked_reasons
from gateway.console.base import (
    Action,
    ConsoleRequest,
    badges_oob,
    console_view,
    is_partial,
    perform,
    poll_token,
    render_polled,
    role_may,
)
from gateway.console.forms import ApproveForm, ReasonForm, RequiredReasonForm
from gateway.console.passkeys import signed_from_form
from gateway.console.selectors import CORRELATION_KEYS
from gateway.contracts import EffectContract, get_contract
from gateway.errors import NotFound
from gateway.integrity import payload_to_show
from gateway.models import Command, Effect, Principal, Receipt
from gateway.templatetags.console import duration_label, money

S = EffectStatus


MISSING = object()


@dataclass(frozen=True)
class FieldRow:
    """One line of the command/receipt comparison."""

    name: str
    command: Any = MISSING
    receipt: Any = MISSING
    differs: bool = False
    # The currency amounts of this row are in (shown in major units), "" for other fields.
    currency: str = ""

    @property
    def command_missing(self) -> bool:
        return self.command is MISSING

    @property
    def receipt_missing(self) -> bool:
        return self.receipt is MISSING


def comparison(
    *,
    command: Command,
    clear_payload: dict[str, Any],
    shown_payload: dict[str, Any],
    receipt: Receipt | None,
    hidden: Iterable[str],
) -> list[FieldRow]:
    """The field-level diff of the command and the latest receipt.

    Compared on the clear values; shown with ``shown_payload`` (redacted for viewers who may
    not see the payload), and a receipt field that names a hidden field is hidden too.
    """
    hidden = set(hidden)
    result = receipt.result if receipt is not None and isinstance(receipt.result, dict) else {}
    currency = clear_payload.get("currency") or result.get("currency") or ""
    rows = [
        FieldRow(
            "payload_digest",
            command.payload_digest,
            (receipt.payload_digest or "(none)") if receipt is not None else MISSING,
            differs=receipt is not None and not receipt.digest_matches,
        )
    ]
    for name, clear in clear_payload.items():
        answered = result.get(name, MISSING)
        differs = answered is not MISSING and answered is not None and answered != clear
        if answered is not MISSING and name in hidden:
            answered = services.REDACTED
        rows.append(
            FieldRow(f"payload.{name}", shown_payload.get(name), answered, differs, currency)
        )
    for name, value in result.items():
        if name not in clear_payload:
            rows.append(FieldRow(f"result.{name}", MISSING, value, currency=currency))
    return rows


@dataclass(frozen=True)
class Compensation:
    compensator: str | None
    window: timedelta | None
    ends_at: datetime | None
    time_left: str
    open: bool | None
    boundary: str | None
    irreversible: bool
    automatic: bool
    past_boundary: bool


def _compensation(
    effect: Effect, contract: EffectContract | None, receipt: Receipt | None, now: datetime
) -> Compensation | None:
    if contract is None:
        return None
    ends_at = None
    if contract.compensation_window and effect.confirmed_at:
        ends_at = effect.confirmed_at + contract.compensation_window
    time_left, is_open = "", None
    if ends_at is not None:
        is_open = ends_at > now
        time_left = (
            f"{duration_label(ends_at - now)} left"
            if is_open
            else f"closed {duration_label(now - ends_at)} ago"
        )
    return Compensation(
        compensator=contract.compensator,
        window=contract.compensation_window,
        ends_at=ends_at,
        time_left=time_left,
        open=is_open,
        boundary=contract.irreversible_boundary,
        irreversible=contract.irreversible,
        automatic=contract.automatic_compensation,
        past_boundary=bool(
            contract.irreversible_boundary
            and receipt is not None
            and contract.irreversible_boundary
            in (receipt.provider_status, (receipt.result or {}).get("state"))
        ),
    )


def _may_compensate(effect: Effect, contract: EffectContract | None, now: datetime) -> bool:
    """Compensation could be asked for now (the contract, the status, the window); whether its
    command can be built is the plan's to say (``compensation_plan``)."""
    if contract is None or not contract.compensator or contract.compensation is None:
        return False
    if effect.status != S.CONFIRMED:
        return False
    if contract.compensation_window and effect.confirmed_at:
        return now <= effect.confirmed_at + contract.compensation_window
    return True


@dataclass(frozen=True)
class CompensationPreview:
    """The compensating command as the form will send it (``payload`` redacted for a viewer
    who may not see it), or why it cannot be built (``missing``, ``how``)."""

    type: str
    payload: dict[str, Any]
    missing: tuple[str, ...]
    how: str


def compensation_preview(
    effect: Effect, contract: EffectContract | None, receipt: Receipt | None, *, may_see: bool
) -> CompensationPreview | None:
    """None unless compensation could be asked for now; else the built command or its gap."""
    if not _may_compensate(effect, contract, timezone.now()):
        return None
    plan = compensation_plan(effect, contract, receipt)
    if plan is None:
        return None
    compensator = get_contract(plan.type)
    payload = plan.payload
    if not may_see and compensator is not None:
        payload = services.redact(payload, compensator)
    how = "" if plan.buildable else plan.how_to_supply(effect.type)
    return CompensationPreview(plan.type, payload, plan.missing or tuple(plan.problems), how)


def available_actions(
    principal: Principal, effect: Effect, page: dict[str, Any] | None = None
) -> set[str]:
    """The buttons to show. The services decide again (and refuse with a reason); this only
    keeps buttons that could never work off the screen. ``page`` is what the other apps'
    panels put on the page (their buttons may depend on it, e.g. an open case)."""
    actions: set[str] = set()
    operator = role_may(principal, OPERATOR_ROLES)
    if effect.status == S.AWAITING_APPROVAL and role_may(principal, APPROVER_ROLES):
        actions.add("reject")
        if effect.command.requested_by_id != principal.pk:
            actions.add("approve")
    if operator:
        if effect.frozen:
            actions.add("unfreeze")
        elif effect.status not in TERMINAL:
            actions.add("freeze")
        # Never offered when its command cannot be built: the page says why instead.
        preview = page.get("compensation_preview") if page else None
        if preview is not None and not preview.missing:
            actions.add("compensate")
    requester = effect.command.requested_by_id == principal.pk
    if effect.status in BEFORE_DISPATCH and (operator or (requester and not principal.frozen)):
        actions.add("cancel")
    for name, extra in extensions.effect_actions.items():
        if extra.shown(principal, effect, page or {}):
            actions.add(name)
    return actions


def _payload_views(principal: Principal, effect: Effect) -> tuple[bool, dict, dict, str]:
    """(may see it in clear, the clear payload, what the viewer is shown, why the record
    failed verification or ""): both from the sealed payload once its digest is the
    command's (gateway.integrity), never from a column a database writer could edit alone."""
    command = effect.command
    clear_view = payload_to_show(command, clear=True)
    if not clear_view.verified or clear_view.payload is None:
        return False, {}, {}, clear_view.problem
    may_see = selectors.may_see_payload(principal, effect)
    if may_see:
        return True, clear_view.payload, clear_view.payload, ""
    shown = payload_to_show(command, clear=False, opened=clear_view.payload)
    if not shown.verified or shown.payload is None:
        return False, {}, {}, shown.problem
    return False, clear_view.payload, shown.payload, ""


def _effect_context(request: ConsoleRequest, effect: Effect) -> dict[str, Any]:
    principal = request.principal
    now = timezone.now()
    command = effect.command
    contract = get_contract(effect.type)
    may_see, clear, shown, unverified = _payload_views(principal, effect)
    receipt = selectors.effect_latest_receipt(effect)
    hidden = () if may_see or contract is None else contract.personal_fields
    events = list(selectors.effect_events(effect))
    attempts = list(effect.attempts.order_by("number"))
    compensations = list(
        Command.objects.filter(compensates_id=effect.pk).select_related("effect").order_by("pk")
    )
    # What the other apps show on the page (the open case and the reconciliation records; the
    # saga run this effect is a step of).
    panels = [panel(principal, effect) for panel in extensions.effect_panels]
    page: dict[str, Any] = {}
    for panel in panels:
        page.update(panel.context)
    token = poll_token(
        effect.updated_at,
        effect.status,
        events[-1].pk if events else None,
        receipt.pk if receipt else None,
        [(a.pk, a.state) for a in attempts],
        [c.effect.status for c in compensations if hasattr(c, "effect")],
        duration_label(now - effect.status_changed_at),
        duration_label(abs(command.expires_at - now)),
        [panel.token for panel in panels],
    )
    proof = verdict.evidence(effect, contract, receipt)
    compensation = _compensation(effect, contract, receipt, now)
    page["compensation_preview"] = compensation_preview(effect, contract, receipt, may_see=may_see)
    return page | {
        "verdict": verdict.verdict(
            effect, contract=contract, receipt=receipt, proof=proof, page=page
        ),
        "proof": proof,
        # The resolve form starts with what the provider knows the effect by: the engineer
        # adds what they saw there, not ids copied by hand.
        "resolve_evidence": resolve_evidence(proof),
        "resolve_operation_id": resolve_operation_id(proof, page.get("records") or []),
        "resolve_fields": resolve_fields(contract, receipt),
        "settled": effect.status in SETTLED,
        # Said next to the buttons, not only in the Compensation panel further down.
        "irreversible_warning": irreversible_warning(contract, compensation),
        "effect": effect,
        "command": command,
        "contract": contract,
        "may_see_payload": may_see,
        "unverified": unverified,
        "payload": shown,
        "cost": money(shown),
        "receipt": receipt,
        "receipt_count": effect.receipts.count() if receipt else 0,
        "rows": comparison(
            command=command,
            clear_payload=clear,
            shown_payload=shown,
            receipt=receipt,
            hidden=hidden,
        ),
        "attempts": attempts,
        "events": events,
        "compensation": compensation,
        "compensations": compensations,
        "correlation": correlation(command.context),
        "other_context": {
            key: value
            for key, value in (command.context or {}).items()
            if key not in CORRELATION_KEYS
        },
        # A record that failed verification has nothing an approver could sign for.
        "actions": available_actions(principal, effect, page)
        - ({"approve"} if unverified else set()),
        "in_status": duration_label(now - effect.status_changed_at),
        "token": token,
        "now": now,
        "view_name": "effect",
    }


def resolve_evidence(proof: verdict.Evidence) -> str:
    parts = [f"{proof.provider} key {proof.provider_key}"]
    if proof.operation_id:
        parts.append(f"operation {proof.operation_id}")
    return ", ".join(parts) + ": "


def resolve_operation_id(proof: verdict.Evidence, records: list[Any]) -> str:
    """The provider operation id the resolve form starts with: the effect's, else the one
    the newest lookup that named one saw."""
    if proof.operation_id:
        return proof.operation_id
    for record in reversed(records):
        if getattr(record, "provider_operation_id", ""):
            return str(record.provider_operation_id)
    return ""


def resolve_fields(
    contract: EffectContract | None, receipt: Receipt | None
) -> list[tuple[str, str]]:
    """(name, value to start with) of each receipt field the contract declares: what a
    person confirming the effect by hand supplies for its compensation and saga steps."""
    if contract is None:
        return []
    result = receipt.result if receipt is not None else {}
    return [(name, str(result.get(name) or "")) for name in contract.receipt_fields]


def irreversible_warning(contract: EffectContract | None, compensation: Compensation | None) -> str:
    if contract is None or compensation is None:
        return ""
    if compensation.past_boundary:
        return (
            f"The provider reports {compensation.boundary}: past the irreversible boundary, "
            "it can only be undone by hand."
        )
    if contract.irreversible:
        return "Irreversible: once done, this cannot be undone, only followed by a correction."
    return ""


@dataclass(frozen=True)
class Correlation:
    """One correlation id of a command's context, with the triage queue filtered by it."""

    key: str
    value: Any
    url: str  # "" when the value is not a string (the filter compares strings)


def correlation(context: Any) -> list[Correlation]:
    if not isinstance(context, dict):
        return []
    triage = reverse("console:triage")
    found = []
    for key in CORRELATION_KEYS:
        value = context.get(key)
        if value in (None, ""):
            continue
        url = f"{triage}?{urlencode({f'context.{key}': value})}" if isinstance(value, str) else ""
        found.append(Correlation(key, value, url))
    return found


def load_effect(request: ConsoleRequest, effect_id: str) -> Effect:
    # Another tenant's effect does not exist for this caller: NotFound, mapped to a 404.
    return selectors.effect_get(principal=request.principal, effect_id=effect_id)


@require_GET
@console_view
def effect_detail(request: ConsoleRequest, effect_id: str) -> HttpResponse:
    """``/effects/<id>``: intent, command and receipt side by side, timelines, compensation."""
    effect = load_effect(request, effect_id)
    return render_polled(
        request, "gateway/effect_detail.html", "effect", _effect_context(request, effect)
    )


def _approve(request: ConsoleRequest, effect: Effect, data: dict[str, Any]) -> str:
    services.effect_approve(
        effect=effect,
        principal=request.principal,
        payload_digest=data["payload_digest"],
        comment=data.get("comment", ""),
        signed=signed_from_form(request, data),
    )
    effect.refresh_from_db()
    blocked = blocked_reasons(request.principal, [effect]).get(effect.pk)
    if blocked:
        return (
            f"Approved {effect.pk} (digest {data['payload_digest'][:19]}…); it is not "
            f"dispatched yet: {blocked}, until it is unfrozen."
        )
    return f"Approved {effect.pk}: digest {data['payload_digest'][:19]}… is queued for dispatch."


def _reject(request: ConsoleRequest, effect: Effect, data: dict[str, Any]) -> str:
    services.effect_reject(effect=effect, principal=request.principal, reason=data["reason"])
    return f"Rejected {effect.pk}."


def _freeze(request: ConsoleRequest, effect: Effect, data: dict[str, Any]) -> str:
    services.effect_set_frozen(
        effect=effect, principal=request.principal, frozen=True, reason=data["reason"]
    )
    return f"Froze {effect.pk}: nothing of it will be dispatched until it is unfrozen."


def _unfreeze(request: ConsoleRequest, effect: Effect, data: dict[str, Any]) -> str:
    services.effect_set_frozen(
        effect=effect, principal=request.principal, frozen=False, reason=data["reason"]
    )
    return f"Unfroze {effect.pk}."


def _cancel(request: ConsoleRequest, effect: Effect, data: dict[str, Any]) -> str:
    services.effect_cancel(effect=effect, principal=request.principal, reason=data["reason"])
    return f"Cancelled {effect.pk} before dispatch."


def _compensate(request: ConsoleRequest, effect: Effect, data: dict[str, Any]) -> str:
    submission = services.effect_compensate(
        effect=effect, principal=request.principal, reason=data["reason"]
    )
    issued = submission.effect
    return (
        f"Issued compensation {issued.pk} ({issued.type}), {issued.status}; "
        f"{effect.pk} is now COMPENSATING."
    )


ACTIONS: dict[str, Action] = {
    "approve": Action(ApproveForm, _approve),
    "reject": Action(ReasonForm, _reject),
    "freeze": Action(RequiredReasonForm, _freeze),
    "unfreeze": Action(ReasonForm, _unfreeze),
    "cancel": Action(ReasonForm, _cancel),
    "compensate": Action(RequiredReasonForm, _compensate),
}


@require_POST
@console_view
def effect_action(request: ConsoleRequest, effect_id: str, action: str) -> HttpResponse:
    """POST ``/effects/<id>/<action>``: validate the form, call the one service the API calls,
    answer with the changed fragment and a flash (htmx) or redirect back (no JavaScript).
    The actions of other apps (``extensions.effect_actions``) are served the same way."""
    spec: Action | extensions.EffectAction | None = ACTIONS.get(action)
    if spec is None:
        spec = extensions.effect_actions.get(action)
    if spec is None:
        raise NotFound(f"No action {action!r}.")
    effect = load_effect(request, effect_id)
    from_inbox = request.POST.get("view") == "approvals"
    back = (
        reverse("console:approvals") if from_inbox else reverse("console:effect", args=[effect.pk])
    )
    target = f"#approval-{effect.pk}-error" if from_inbox else "#flash"

    def answer() -> str:
        fresh = load_effect(request, effect_id)
        if from_inbox:
            card = approval_card(request.principal, fresh)
            html = render_to_string(
                "gateway/effect_approvals.html#card", {"card": card}, request=request
            )
        else:
            html = render_to_string(
                "gateway/effect_detail.html#effect",
                _effect_context(request, fresh),
                request=request,
            )
        # The nav's counts may have changed too (an approval, a case taken or settled).
        return html + badges_oob(request)

    run = spec.run
    response = perform(
        request,
        form=spec.form(request.POST),
        run=lambda data: run(request, effect, data),
        back=back,
        target=target,
        answer=answer,
    )
    if response.status_code == 409 and is_partial(request) and not from_inbox:
        # Someone else changed the effect first: redraw it (out of band) with who did what,
        # so that the engineer decides again on what is there now.
        fresh = load_effect(request, effect_id)
        context = _effect_context(request, fresh)
        context.update(oob=True, changed_by=changed_by(context["events"]))
        html = render_to_string("gateway/effect_detail.html#effect", context, request=request)
        response.content = response.content + html.encode()
    return response


def changed_by(events: list[Any]) -> str:
    """What the latest event of the effect says, as a sentence: who changed what, when."""
    if not events:
        return ""
    last = events[-1]
    change = (
        f"{last.from_status} → {last.to_status}"
        if last.from_status != last.to_status
        else last.kind.replace("_", " ")
    )
    reason = f" ({last.reason})" if last.reason else ""
    when = timezone.localtime(last.created_at).strftime("%H:%M:%S")
    return f"Meanwhile {last.actor} changed it at {when}: {change}{reason}."
