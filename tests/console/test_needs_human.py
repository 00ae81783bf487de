"""Who needs a human, and why: settling effects apart, cause signatures, groups in risk order,
the page title and the nav badge; and the providers page."""

from __future__ import annotations

import re
from datetime import timedelta

from django.utils import timezone

from gateway.models import Effect
from tests.console.conftest import (
    EMAIL,
    REFUND,
    TICKET,
    add_failed_lookups,
    escalated_unknown,
    set_state,
    submit,
)


def effect_ids(html: str) -> list[str]:
    return re.findall(r'<tr data-effect="([^"]+)"', html)


def group_keys(html: str) -> list[str]:
    return re.findall(r'data-group="([^"]+)"', html)


def settling_unknown(principal, body=REFUND, **changes) -> Effect:
    """An UNKNOWN effect with its next lookup scheduled: what a timeout leaves."""
    return set_state(
        submit(principal, body, **changes),
        status="UNKNOWN",
        attempt_count=1,
        check_count=1,
        next_check_at=timezone.now() + timedelta(seconds=40),
    )


def answered_lookup(effect: Effect, minutes_ago: int = 2):
    from reconciliation.models import ReconciliationRecord

    return ReconciliationRecord.objects.create(
        tenant_id=effect.tenant_id,
        effect=effect,
        kind="lookup",
        lookup_by="idempotency_key",
        lookup_status="found",
        effect_status="IN_PROGRESS",
        outcome="in_progress",
        check_number=1,
        actor="reconciler",
        evidence="processing",
        created_at=timezone.now() - timedelta(minutes=minutes_ago),
    )


def test_timeouts_at_a_provider_whose_lookups_answer_need_nobody(oscar, bot):
    effects = [
        settling_unknown(bot.principal, resource={"type": "order", "id": f"o{n}"}) for n in range(3)
    ]
    answered_lookup(effects[0])
    html = oscar.client.get("/").content.decode()
    assert "<title>Triage: 0 need a human" in html
    assert "Needs a human: 0" in html and "settling by itself: 3" in html
    assert effect_ids(html) == []
    assert 'id="triage-badge" class="count count-zero">0<' in html
    group = html[html.index('data-group="billing/billing.refund.create/settling"') :]
    group = group[: group.index("</li>")]
    assert 'data-needs-human="false"' in group
    assert "lookups answering — settling by itself, next lookup in" in group
    # Its "Show these" lists them.
    shown = oscar.client.get("/?provider=billing&type=billing.refund.create&cause=settling")
    assert set(effect_ids(shown.content.decode())) == {e.pk for e in effects}


def test_failing_lookups_send_the_same_effects_to_a_human(oscar, bot):
    effect = settling_unknown(bot.principal)
    records = add_failed_lookups(effect, 2, first_minutes_ago=20)
    html = oscar.client.get("/").content.decode()
    assert "Needs a human: 1" in html and "<title>Triage: 1 needs a human" in html
    assert effect_ids(html) == [effect.pk]
    group = html[html.index('data-group="billing/billing.refund.create/settling"') :]
    group = group[: group.index("</li>")]
    assert 'data-needs-human="true"' in group
    first = timezone.localtime(records[0].created_at).strftime("%H:%M")
    assert f"lookups unreachable since {first}" in group
    # Every other page loads the same count after the page (no health queries of its own).
    other = oscar.client.get("/approvals").content.decode()
    assert 'id="triage-badge" class="count count-zero" hx-get="/triage/badge"' in other
    badge = oscar.htmx("get", "/triage/badge").content.decode()
    assert badge.startswith('<span id="triage-badge" class="count">1<')


def test_a_late_lookup_is_not_settling(oscar, bot):
    effect = settling_unknown(bot.principal)
    set_state(effect, next_check_at=timezone.now() - timedelta(minutes=10))
    html = oscar.client.get("/").content.decode()
    assert "Needs a human: 1" in html


def test_escalated_group_says_after_how_many_lookups(oscar, bot):
    escalated_unknown(bot.principal)
    html = oscar.client.get("/").content.decode()
    assert "escalated after 8 inconclusive lookups" in html


def test_groups_sort_by_risk(oscar, bot):
    now = timezone.now()
    agent = bot.principal
    # Oldest first among equals; created in the reverse of the risk order.
    set_state(
        submit(agent, TICKET), status="UNKNOWN", created_at=now - timedelta(hours=5)
    )  # external write, no money
    set_state(
        submit(agent, EMAIL), status="UNKNOWN", created_at=now - timedelta(hours=4)
    )  # irreversible
    set_state(submit(agent, REFUND), status="UNKNOWN", created_at=now - timedelta(hours=3))  # money
    set_state(
        submit(agent, TICKET),
        status="CONFIRMED",
        mismatch=True,
        created_at=now - timedelta(hours=1),
    )  # receipt disagrees
    html = oscar.client.get("/").content.decode()
    assert group_keys(html) == [
        "tickets/ticket.create/mismatch",
        "billing/billing.refund.create/unknown",
        "mail/email.message.send/unknown",
        "tickets/ticket.create/unknown",
    ]


def test_the_strip_shows_the_providers_with_something_to_say(oscar, bot):
    effect = settling_unknown(bot.principal)
    add_failed_lookups(effect, 2, first_minutes_ago=20)
    html = oscar.client.get("/").content.decode()
    strip = html[html.index('class="provider-strip"') :]
    strip = strip[: strip.index("</section>")]
    assert 'data-provider="billing"' in strip and 'data-provider="deploy"' not in strip
    assert "lookups <span" in strip and "not answering since" in strip
    assert "other providers: no call and no UNKNOWN in the last hour" in strip


def test_providers_page_for_operators(oscar, alice, bot, monkeypatch):
    effect = settling_unknown(bot.principal)
    add_failed_lookups(effect, 2, first_minutes_ago=20)
    response = oscar.client.get("/providers")
    assert response.status_code == 200
    html = response.content.decode()
    row = html[html.index('<tr data-provider="billing"') :]
    row = row[: row.index("</tr>")]
    assert 'data-label="Lookups" data-answering="no"' in row
    assert "100% of 2" in row
    assert 'data-circuit="closed"' in row  # the breaker has seen no failure to connect
    assert "/billing/_operations" in html  # where billing's own console is
    sent = html[html.index('data-credential-of="billing"') :]
    sent = sent[: sent.index("</div>")]
    assert "/providers/billing/credentials" in sent
    assert "this tenant's credential" not in sent  # none of its own: the deployment's, or none
    assert 'aria-current="page">Providers' in html
    assert alice.client.get("/providers").status_code == 403
    assert "/providers" not in alice.client.get("/approvals").content.decode()


def test_providers_page_names_the_tenants_own_credential(oscar, root):
    from gateway import provider_credentials

    row = provider_credentials.credential_set(
        actor=root.principal, provider="billing", secret="sk_test_tenant_own_key_7781"
    )
    html = oscar.client.get("/providers").content.decode()
    sent = html[html.index('data-credential-of="billing"') :]
    sent = sent[: sent.index("</div>")]
    assert "this tenant's credential" in sent and row.fingerprint in sent and "…7781" in sent
    assert "sk_test_tenant_own_key" not in html


def test_providers_page_shows_each_circuit_as_the_workers_share_it(oscar, settings):
    from gateway.choices import Outcome
    from gateway.providers import protection
    from gateway.providers.base import CallResult

    refused = CallResult(outcome=Outcome.NOT_STARTED, reason="connection refused")
    for _ in range(settings.GATEWAY_CIRCUIT_FAILURES):
        protection.observe("billing", [refused])
    html = oscar.client.get("/providers").content.decode()
    row = html[html.index('<tr data-provider="billing"') :]
    row = row[: row.index("</tr>")]
    assert 'data-circuit="open"' in row and "failures in a row" in row
    other = html[html.index('<tr data-provider="tickets"') :]
    assert 'data-circuit="closed"' in other[: other.index("</tr>")]


def test_phone_filters_button_and_skip_link(oscar, bot):
    effect = set_state(submit(bot.principal, REFUND), status="UNKNOWN")
    html = oscar.client.get("/").content.decode()
    assert 'class="btn filters-button" aria-expanded="false" aria-controls="filters"' in html
    assert '<a class="skip-link" href="#first-row">' in html
    assert f'href="/effects/{effect.pk}" id="first-row"' in html
