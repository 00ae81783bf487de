"""The verdict at the top of the effect page: one plain sentence of what happened and the safe
next step, and the provider's own evidence (the key the provider holds, its operation id, a
link into its console) that the next step needs.

An on-call engineer reads this first; everything under it on the page is the proof.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.utils import timezone

from gateway.choices import EffectStatus
from gateway.contracts import EffectContract
from gateway.models import Effect, Receipt

S = EffectStatus


@dataclass(frozen=True)
class Evidence:
    """What the provider knows this effect by."""

    provider: str
    provider_key: str  # ``<tenant>:<key>``: the key the gateway sent, not the agent's
    operation_id: str
    console_url: str  # "" unless the contract names a URL template


@dataclass(frozen=True)
class Verdict:
    """``text``: what happened; ``next_step``: the safe thing to do now; ``tone``: a chip
    colour (the words say it too)."""

    text: str
    next_step: str
    tone: str


def provider_console_url(contract: EffectContract | None, *, key: str, operation_id: str) -> str:
    """The contract's ``console_url`` template filled in, or "" when it names none (or names
    the operation and there is none yet)."""
    if contract is None or not contract.console_url:
        return ""
    template = contract.console_url
    if "{operation_id}" in template and not operation_id:
        return ""
    base = (getattr(settings, "GATEWAY_PROVIDER_URLS", {}) or {}).get(contract.provider, "")
    return template.format(
        base=base.rstrip("/"), provider_key=quote(key, safe=""), operation_id=quote(operation_id)
    )


def evidence(effect: Effect, contract: EffectContract | None, receipt: Receipt | None) -> Evidence:
    command = effect.command
    operation = effect.provider_operation_id or (receipt.provider_operation_id if receipt else "")
    return Evidence(
        provider=command.provider,
        provider_key=command.provider_key,
        operation_id=operation or "",
        console_url=provider_console_url(
            contract, key=command.provider_key, operation_id=operation or ""
        ),
    )


def _clock(moment: datetime) -> str:
    return timezone.localtime(moment).strftime("%H:%M")


def _what(contract: EffectContract | None, effect: Effect) -> str:
    if contract is None:
        return f"this {effect.type}"
    return f"this ({contract.description[:1].lower()}{contract.description[1:].rstrip('.')})"


def verdict(
    effect: Effect,
    *,
    contract: EffectContract | None,
    receipt: Receipt | None,
    proof: Evidence,
    page: dict[str, Any],
) -> Verdict:
    """``page`` is what the other apps put on the page: ``failing_since`` (the first of the
    lookups failing in a row, from reconciliation), ``open_case``."""
    provider = proof.provider
    key = proof.provider_key
    what = _what(contract, effect)
    if effect.mismatch:
        return Verdict(
            f"{provider} answered with an operation that does not match this command: it is "
            "never re-executed and never confirmed by itself.",
            f"Compare the fields below with the owner ({effect.owner}), then resolve it with "
            f"evidence; look key {key} up at {provider}.",
            "danger",
        )
    if effect.status == S.UNKNOWN:
        return _unknown_verdict(effect, provider, key, what, page.get("failing_since"))
    if effect.status == S.CONFIRMED:
        return _confirmed_verdict(provider, key, what, proof, page)
    return _status_verdict(effect, provider, key, what)


def _unknown_verdict(
    effect: Effect, provider: str, key: str, what: str, failing_since: datetime | None
) -> Verdict:
    """An UNKNOWN effect: whether the lookups fail, were used up, or are still going."""
    if failing_since is not None:
        return Verdict(
            f"{provider} may have done {what}; lookups are failing since {_clock(failing_since)}.",
            f"Check {provider} for key {key} before you resolve: never resolve as "
            "“not started” on a guess.",
            "attention",
        )
    if effect.escalated:
        return Verdict(
            f"Nobody knows whether {provider} did {what}: the lookups were used up.",
            f"Check {provider} for key {key}, then resolve with evidence — or re-arm the "
            "lookups once the provider answers again.",
            "attention",
        )
    return Verdict(
        f"Nobody knows yet whether {provider} did {what}; it is being looked up.",
        f"Reconcile now to ask {provider} by key {key}.",
        "attention",
    )


def _confirmed_verdict(
    provider: str, key: str, what: str, proof: Evidence, page: dict[str, Any]
) -> Verdict:
    """A CONFIRMED effect, unless a later answer disagrees (an open case); whether it can be
    compensated (``_confirmed``)."""
    open_case = page.get("open_case")
    if open_case is not None:
        return Verdict(
            f"{provider} did {what}, but a later answer disagrees "
            f"({open_case.get_reason_display()}).",
            f"Check operation {proof.operation_id or key} at {provider}, then close the case "
            "with what you found.",
            "danger",
        )
    return _confirmed(provider, what, page)


def _status_verdict(effect: Effect, provider: str, key: str, what: str) -> Verdict:
    """Every other status: what the status alone says."""
    status = effect.status
    if status == S.IN_PROGRESS:
        return Verdict(
            f"{provider} accepted {what} and is still working on it.",
            "Wait for the next lookup, or reconcile now; resolve only with the provider's proof.",
            "info",
        )
    if status == S.NOT_STARTED and effect.escalated:
        return Verdict(
            f"{provider} never received {what}, and it cannot be sent again by itself.",
            "Resolve it (sent again with the same key while it is unexpired), or let it expire.",
            "attention",
        )
    if status == S.COMPENSATION_FAILED:
        return Verdict(
            f"{what[:1].upper()}{what[1:]} happened and its compensation failed: it was not "
            "undone.",
            f"Undo it by hand at {provider} (key {key}), then record the fix.",
            "danger",
        )
    if status == S.AWAITING_APPROVAL:
        return Verdict(
            f"Nothing was sent to {provider}: {what} waits for an approver.",
            "An approver reads the digest and approves or rejects it.",
            "info",
        )
    if status in (S.PREPARED, S.DISPATCHING, S.NOT_STARTED):
        return Verdict(
            f"{what[:1].upper()}{what[1:]} is on its way to {provider}.",
            "Nothing to do; freeze it to stop it before it is sent.",
            "info",
        )
    if status in (S.COMPENSATING, S.COMPENSATED):
        return Verdict(
            f"{provider} did {what}; it is {status.lower()}.",
            "Follow the compensating command below.",
            "info",
        )
    return Verdict(
        f"Nothing was done at {provider}: the command is {status.lower()}.",
        "Nothing to do.",
        "muted",
    )


def _confirmed(provider: str, what: str, page: dict[str, Any]) -> Verdict:
    """``page["compensation_preview"]`` (the effect page's; absent elsewhere): None when
    compensation cannot be asked for, else the command or the fields it lacks."""
    if "compensation_preview" not in page:
        next_step = "Nothing to do, unless it must be undone: compensate within its window."
        return Verdict(f"{provider} did {what}.", next_step, "ok")
    preview = page["compensation_preview"]
    if preview is None:
        return Verdict(f"{provider} did {what}.", "Nothing to do.", "ok")
    if preview.missing:
        names = ", ".join(preview.missing)
        return Verdict(
            f"{provider} did {what}, but its receipt has no {names}: it cannot be compensated yet.",
            f"If it must be undone, resolve it with the {names} {provider} shows.",
            "attention",
        )
    return Verdict(
        f"{provider} did {what}.",
        "Nothing to do, unless it must be undone: compensate within its window.",
        "ok",
    )
