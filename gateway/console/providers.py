"""``/providers`` (operators and admins): each provider's health over the last hour
(``gateway.providers.health``, the same numbers as the triage queue's strip), its circuit,
rate limit and cap (``gateway.providers.protection``), where its own console is, and
which credential the tenant's effects go out with (managed on ``/providers/<name>/credentials``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.http import HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET

from gateway import provider_credentials as credentials
from gateway.choices import OPERATOR_ROLES, CredentialState
from gateway.console.base import ConsoleRequest, console_view, poll_token, render_polled
from gateway.contracts import CONTRACTS
from gateway.errors import NotPermitted
from gateway.models import ProviderCredential
from gateway.providers import protection
from gateway.providers.health import WINDOW, Channel, ProviderHealth, provider_health
from gateway.templatetags.console import duration_label

# How the pages name ``WINDOW``.
WINDOW_WORDS = "last hour"


def _clock(moment: datetime) -> str:
    return timezone.localtime(moment).strftime("%H:%M")


def channel_label(channel: Channel) -> str:
    """``answering since 04:07``, ``not answering since 04:07``, ``answering, no failure in
    the last hour``, ``no call in the last hour``."""
    if channel.answering is None:
        return f"no call in the {WINDOW_WORDS}"
    if channel.since is None:
        # Only an answering channel has no start in the window (a failing one started at its
        # first failure).
        return f"answering, no failure in the {WINDOW_WORDS}"
    state = "answering" if channel.answering else "not answering"
    return f"{state} since {_clock(channel.since)}"


def _rate(channel: Channel) -> str:
    rate = channel.error_rate
    if rate is None:
        return "—"
    return f"{rate:.0%} of {channel.calls}"


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds >= 10:
        return f"{seconds:.0f} s"
    return f"{seconds * 1000:.0f} ms"


TREND_WORDS = {"rising": "↑ rising", "falling": "↓ falling", "steady": "→ steady"}


@dataclass(frozen=True)
class HealthRow:
    """One provider's health, in the words and figures the strip and the page show."""

    health: ProviderHealth
    sends: str
    lookups: str
    send_errors: str
    lookup_errors: str
    p50: str
    p99: str
    trend: str
    # ok / attention / danger: the words say it too.
    tone: str

    @property
    def provider(self) -> str:
        return self.health.provider

    def label_parts(self) -> tuple[Any, ...]:
        """What the strip and the page show of it (the polls redraw when it changes)."""
        h = self.health
        return (
            self.provider,
            self.sends,
            self.lookups,
            self.send_errors,
            self.lookup_errors,
            self.p50,
            self.p99,
            self.trend,
            h.unknown,
            h.unknown_new,
            h.unknown_settled,
        )

    @property
    def quiet(self) -> bool:
        """Nothing to say: no call in the window and no UNKNOWN."""
        h = self.health
        return h.sends.answering is None and h.lookups.answering is None and not h.unknown


def health_row(health: ProviderHealth) -> HealthRow:
    failing = health.sends.answering is False or health.lookups.answering is False
    tone = "danger" if health.lookups.answering is False else "attention" if failing else "ok"
    return HealthRow(
        health=health,
        sends=channel_label(health.sends),
        lookups=channel_label(health.lookups),
        send_errors=_rate(health.sends),
        lookup_errors=_rate(health.lookups),
        p50=_ms(health.latency_p50),
        p99=_ms(health.latency_p99),
        trend=TREND_WORDS[health.trend],
        tone=tone,
    )


def health_rows(health: dict[str, ProviderHealth]) -> list[HealthRow]:
    return [health_row(health[name]) for name in sorted(health)]


@dataclass(frozen=True)
class Circuit:
    """One provider's breaker, rate limit and cap (``gateway.providers.protection``), in words."""

    state: str
    detail: str


def circuit(
    entry: protection.ProviderProtection | None, own: ProviderCredential | None = None
) -> Circuit:
    """In words; with ``own`` (the tenant's active credential), the rate and the pause that
    credential has of its own in place of the deployment's."""
    if entry is None:
        return Circuit("not configured", "")
    parts = []
    if entry.since is not None:
        parts.append(f"since {_clock(entry.since)}")
    if entry.consecutive_failures:
        parts.append(f"{entry.consecutive_failures} / {entry.failures_to_open} failures in a row")
    if own is not None:
        parts += _own_credential(entry, own)
    elif entry.paused_until is not None and entry.paused_until > timezone.now():
        parts.append(f"paused until {_clock(entry.paused_until)} (Retry-After)")
    if entry.max_in_flight:
        parts.append(f"{entry.in_flight} / {entry.max_in_flight} in flight")
    if entry.rate_capacity and own is None:
        parts.append(f"rate {entry.rate_used} / {entry.rate_capacity} ({entry.rate_limit})")
    if not entry.shared:
        parts.append("this web process's view: Redis is not answering")
    return Circuit(entry.circuit, " · ".join(parts))


def _own_credential(entry: protection.ProviderProtection, own: ProviderCredential) -> list[str]:
    """The tenant credential's own rate use and pause (nothing counted yet: its rate)."""
    use = next((u for u in entry.credentials if u.fingerprint == own.fingerprint), None)
    parts = []
    if use is not None and use.paused_until is not None and use.paused_until > timezone.now():
        parts.append(f"your credential paused until {_clock(use.paused_until)} (Retry-After)")
    if use is not None and use.rate_capacity:
        parts.append(f"your credential's rate {use.rate_used} / {use.rate_capacity} "
                     f"({use.rate_limit})")  # fmt: skip
    elif entry.rate_capacity:
        parts.append(f"your credential's rate {own.rate_limit or entry.rate_limit}, unused")
    return parts


def console_home(provider: str) -> str:
    """Where the provider's own console is: its contracts' ``console_url`` with the base URL
    filled in, cut before its per-operation part ("" when no contract names one)."""
    base = (getattr(settings, "GATEWAY_PROVIDER_URLS", {}) or {}).get(provider, "")
    for contract in sorted(CONTRACTS.values(), key=lambda c: c.type):
        if contract.provider != provider or not contract.console_url:
            continue
        home = contract.console_url
        for cut in ("?", "{provider_key}", "{operation_id}"):
            home = home.split(cut, 1)[0]
        if "{" in home.replace("{base}", ""):
            return ""
        return home.replace("{base}", base.rstrip("/"))
    return ""


@dataclass(frozen=True)
class SendsWith:
    """The credential a provider's effects of this tenant go out with: the tenant's own active
    one (fingerprint, last 4, when it was set or rotated in) or the deployment's."""

    own: ProviderCredential | None
    deployment_fingerprint: str


def sends_with(tenant_id: int, providers: list[str]) -> dict[str, SendsWith]:
    """One query for every provider's active tenant credential."""
    active = {
        row.provider: row
        for row in ProviderCredential.objects.filter(
            tenant_id=tenant_id, provider__in=providers, state=CredentialState.ACTIVE
        )
    }
    return {
        name: SendsWith(active.get(name), credentials.deployment_fingerprint(name))
        for name in providers
    }


@require_GET
@console_view
def provider_list(request: ConsoleRequest) -> HttpResponse:
    """``/providers``: health, circuit, console and credentials per provider; polled."""
    principal = request.principal
    if principal.role not in OPERATOR_ROLES:
        raise NotPermitted(
            f"The providers page is for operators and admins; you are signed in as "
            f"{principal.role}."
        )
    now = timezone.now()
    health = provider_health(principal.tenant_id, now=now)
    snapshot = protection.snapshot()
    with_credential = sends_with(principal.tenant_id, sorted(health))
    rows: list[dict[str, Any]] = [
        {
            "health": row,
            "circuit": circuit(snapshot.get(row.provider), with_credential[row.provider].own),
            "console": console_home(row.provider),
            "credential": with_credential[row.provider],
            "types": sorted(c.type for c in CONTRACTS.values() if c.provider == row.provider),
        }
        for row in health_rows(health)
    ]
    context: dict[str, Any] = {
        "rows": rows,
        "window": duration_label(WINDOW),
        "now": now,
        "view_name": "providers",
    }
    context["token"] = poll_token(
        [(r["health"].label_parts(), r["circuit"]) for r in rows], duration_label(WINDOW)
    )
    return render_polled(request, "gateway/provider_list.html", "providers", context)
