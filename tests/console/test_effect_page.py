"""The effect page: intent, command and receipt side by side with a field-level diff, the
attempt and event timelines, compensation, and tenant isolation."""

import re
from datetime import timedelta

from django.utils import timezone

from gateway import services
from tests.console.conftest import (
    EMAIL,
    REFUND,
    SHIPMENT,
    TICKET,
    add_attempt,
    add_receipt,
    set_state,
    submit,
)


def test_full_page_and_fragment(oscar, bot):
    effect = submit(bot.principal, REFUND)
    page = oscar.client.get(f"/effects/{effect.pk}")
    assert page.status_code == 200
    html = page.content.decode()
    assert "<html" in html and 'id="effect"' in html
    fragment = oscar.htmx("get", f"/effects/{effect.pk}")
    body = fragment.content.decode()
    assert "<html" not in body
    assert body.lstrip().startswith('<div id="effect"')
    for response in (page, fragment):
        assert "HX-Request" in response["Vary"]


def test_intent_command_and_full_digest(oscar, bot):
    effect = submit(bot.principal, REFUND)
    html = oscar.client.get(f"/effects/{effect.pk}").content.decode()
    assert "refund the duplicate charge of incident 120" in html
    assert "task_incident_120" in html
    assert "Plan revision</dt><dd>1</dd>" in html
    assert (
        f'<code class="digest" id="command-digest">{effect.command.payload_digest}</code>' in html
    )
    assert "order ord_881 v17" in html
    assert "5.00 EUR" in html
    assert "No receipt yet" in html
    assert "Not sent yet" in html


def test_receipt_disagreement_is_a_field_level_diff(oscar, bot):
    effect = set_state(submit(bot.principal, REFUND), status="UNKNOWN", mismatch=True)
    add_receipt(
        effect,
        payload_digest="sha256:" + "0" * 64,
        digest_matches=False,
        result={"refund_id": "re_9", "amount": 5000, "currency": "EUR", "state": "accepted"},
    )
    html = oscar.client.get(f"/effects/{effect.pk}").content.decode()
    rows = re.findall(r'<tr( class="differs")?>\s*<th scope="row" class="mono">([^<]+)</th>', html)
    assert {name for flag, name in rows if flag} == {"payload_digest", "payload.amount"}
    assert "sha256:" + "0" * 64 in html
    assert "differs from the command" in html
    # Fields the provider echoed unchanged agree; fields only it has are shown for reading.
    assert {name for _, name in rows} >= {"payload.currency", "result.refund_id", "result.state"}
    assert "re_9" in html


def test_personal_fields_are_redacted_for_roles_that_may_not_see_them(oscar, alice, bot):
    effect = submit(bot.principal, EMAIL)
    add_receipt(effect, result={"message_id": "<m1@x>", "to": "ada@example.com"})
    approver_view = alice.client.get(f"/effects/{effect.pk}").content.decode()
    assert "ada@example.com" not in approver_view
    assert services.REDACTED in approver_view
    operator_view = oscar.client.get(f"/effects/{effect.pk}").content.decode()
    assert "ada@example.com" in operator_view
    assert "shown in clear" in operator_view


def test_attempt_and_event_timelines(oscar, bot):
    effect = set_state(submit(bot.principal, REFUND), status="UNKNOWN", attempt_count=1)
    add_attempt(effect)
    html = oscar.client.get(f"/effects/{effect.pk}").content.decode()
    assert "read timeout after 10 s" in html
    assert "10.00 s" in html  # how long the attempt took
    assert "worker-1:42" in html
    assert "<strong>submitted</strong>" in html
    assert "by agent:refund-bot" in html


def test_compensation_window_time_left_and_irreversible_boundary(oscar, bot):
    effect = set_state(
        submit(bot.principal, SHIPMENT),
        status="CONFIRMED",
        confirmed_at=timezone.now() - timedelta(hours=2),
    )
    add_receipt(effect, result={"shipment_id": "shp_1", "state": "label_created"})
    html = oscar.client.get(f"/effects/{effect.pk}").content.decode()
    assert "12 h after confirmation" in html
    assert "9 h left" in html
    assert "<code>handed_to_carrier</code>, compensation is manual" in html
    assert "shipment.cancel" in html


def test_irreversible_effect_says_so(oscar, bot):
    effect = set_state(
        submit(bot.principal, EMAIL), status="CONFIRMED", confirmed_at=timezone.now()
    )
    html = oscar.client.get(f"/effects/{effect.pk}").content.decode()
    assert "Irreversible: this effect cannot be undone" in html


def test_links_between_an_effect_and_its_compensation(oscar, bot):
    original = set_state(submit(bot.principal, TICKET), status="CONFIRMED")
    compensation = services.command_submit(
        principal=oscar.principal,
        idempotency_key="comp-1",
        type="ticket.close",
        resource=TICKET["resource"],
        payload={"ticket_id": "T-1", "resolution": "opened in error"},
        compensates=original.command,
    ).effect
    html = oscar.client.get(f"/effects/{original.pk}").content.decode()
    assert f'href="/effects/{compensation.pk}"' in html
    back = oscar.client.get(f"/effects/{compensation.pk}").content.decode()
    assert f'href="/effects/{original.pk}"' in back


def test_another_tenants_effect_is_404(olga, bot):
    effect = submit(bot.principal, REFUND)
    page = olga.client.get(f"/effects/{effect.pk}")
    assert page.status_code == 404
    assert "No effect" in page.content.decode()
    assert effect.command.payload_digest not in page.content.decode()
    assert olga.htmx("get", f"/effects/{effect.pk}").status_code == 404
    assert olga.client.get("/effects/eff_nope").status_code == 404


def test_poll_answers_204_until_the_effect_changes(oscar, bot):
    effect = submit(bot.principal, REFUND)
    html = oscar.client.get(f"/effects/{effect.pk}").content.decode()
    url = re.search(r'<div id="effect"[^>]*hx-get="([^"]+)"', html).group(1)
    assert oscar.htmx("get", url).status_code == 204
    services.effect_set_frozen(effect=effect, principal=oscar.principal, frozen=True)
    changed = oscar.htmx("get", url)
    assert changed.status_code == 200
    assert "chip-frozen" in changed.content.decode()


def test_a_payload_that_fails_verification_is_shown_as_such_not_a_crash(oscar, bot):
    from gateway.models import Command

    effect = submit(bot.principal, EMAIL)
    sealed = Command.objects.get(pk=effect.pk).payload_sealed
    Command.objects.filter(pk=effect.pk).update(payload_sealed=sealed[:-8] + "AAAAAAAA")
    response = oscar.client.get(f"/effects/{effect.pk}")
    assert response.status_code == 200
    html = response.content.decode()
    assert "This record failed verification" in html
    assert "ada@example.com" not in html


def test_the_contract_version_the_command_was_submitted_under(oscar, bot, monkeypatch):
    from dataclasses import replace

    from gateway.contracts import CONTRACTS

    effect = submit(bot.principal, REFUND)
    assert effect.command.contract_version == 1
    html = oscar.client.get(f"/effects/{effect.pk}").content.decode()
    assert re.search(r'class="muted small contract-version"[^>]*>v1</span>', html)
    # The contract moved on; the command keeps the version it was submitted under.
    refund = CONTRACTS["billing.refund.create"]
    monkeypatch.setitem(CONTRACTS, refund.type, replace(refund, version=2))
    html = oscar.client.get(f"/effects/{effect.pk}").content.decode()
    assert re.search(r">v1 \(the contract is now v2\)</span>", html)


def test_the_page_says_when_the_next_lookup_is_and_when_a_lease_ends(oscar, bot):
    """The schedule the workers keep (the backoff's next lookup, a claim's lease) is shown as
    the exact UTC time it falls due."""
    at = timezone.now() + timedelta(seconds=42)
    exact = at.strftime("%Y-%m-%d %H:%M:%S UTC")
    unknown = set_state(submit(bot.principal, TICKET), status="UNKNOWN", next_check_at=at)
    html = oscar.client.get(f"/effects/{unknown.pk}").content.decode()
    assert re.search(rf'next lookup at <time datetime="[^"]+" title="{exact}">{exact}</time>', html)
    assert "lease ends at" not in html
    claimed = set_state(submit(bot.principal, TICKET), status="DISPATCHING", lease_expires_at=at)
    html = oscar.client.get(f"/effects/{claimed.pk}").content.decode()
    assert re.search(rf'lease ends at <time datetime="[^"]+" title="{exact}">{exact}</time>', html)
    assert "next lookup at" not in html
