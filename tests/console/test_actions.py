"""The actions of SPEC §5 as console forms: same services as the API, answered in place with
the changed fragment and a flash (htmx) or with a redirect (no JavaScript); domain errors are
readable and change nothing."""

import re

import pytest
from django.test import Client
from django.utils import timezone

from gateway.models import Effect, EffectEvent
from tests.console.conftest import BIG_REFUND, REFUND, TICKET, add_receipt, set_state, submit


def action(person, effect, name, data=None, htmx=True):
    path = f"/effects/{effect.pk}/{name}"
    if htmx:
        return person.htmx("post", path, data)
    return person.client.post(path, data or {})


def events(effect) -> int:
    return EffectEvent.objects.filter(effect_id=effect.pk).count()


def buttons(person, effect) -> set[str]:
    html = person.client.get(f"/effects/{effect.pk}").content.decode()
    return set(re.findall(rf'action="/effects/{effect.pk}/([a-z]+)"', html))


def test_operator_freezes_in_place_with_a_flash(oscar, bot):
    effect = submit(bot.principal, REFUND)
    response = action(oscar, effect, "freeze", {"reason": "provider incident"})
    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="effect"')
    assert "chip-frozen" in html
    assert '<div id="flash" class="flash-region" aria-live="polite" hx-swap-oob="true">' in html
    assert "Froze" in html
    assert 'id="approvals-badge"' in html and 'hx-swap-oob="true"' in html
    assert "HX-Request" in response["Vary"]
    effect.refresh_from_db()
    assert effect.frozen
    event = EffectEvent.objects.filter(effect_id=effect.pk).latest("id")
    assert (event.kind, event.actor, event.reason) == (
        "frozen",
        "operator:oscar",
        "provider incident",
    )


def test_without_javascript_a_form_post_redirects_back_with_the_message(oscar, bot):
    effect = submit(bot.principal, REFUND)
    response = action(oscar, effect, "freeze", {"reason": "INC-7"}, htmx=False)
    assert response.status_code == 302
    assert response["Location"] == f"/effects/{effect.pk}"
    page = oscar.client.get(response["Location"]).content.decode()
    assert "Froze" in page
    response = action(oscar, effect, "unfreeze", htmx=False)
    page = oscar.client.get(response["Location"]).content.decode()
    assert "Unfroze" in page
    effect.refresh_from_db()
    assert not effect.frozen


@pytest.mark.parametrize("who", ["alice", "bot"])
def test_approvers_and_agents_cannot_freeze(request, who, bot):
    person = request.getfixturevalue(who)
    effect = submit(bot.principal, REFUND)
    before = events(effect)
    assert "freeze" not in buttons(person, effect)
    response = action(person, effect, "freeze", {"reason": "INC-7"})
    assert response.status_code == 403
    assert response["HX-Retarget"] == "#flash"
    assert response["HX-Reswap"] == "innerHTML"
    html = response.content.decode()
    assert 'role="alert"' in html and "cannot freeze" in html
    assert "Traceback" not in html
    effect.refresh_from_db()
    assert not effect.frozen and events(effect) == before


def test_a_domain_error_without_javascript_is_a_flash_after_redirect(alice, bot):
    effect = submit(bot.principal, REFUND)
    response = action(alice, effect, "freeze", {"reason": "INC-7"}, htmx=False)
    assert response.status_code == 302
    page = alice.client.get(response["Location"]).content.decode()
    assert "Not permitted" in page and "cannot freeze" in page


def test_approve_with_a_wrong_digest_shows_the_error_and_changes_nothing(alice, bot):
    effect = submit(bot.principal, BIG_REFUND)
    assert effect.status == "AWAITING_APPROVAL"
    before = events(effect)
    wrong = "sha256:" + "f" * 64
    response = action(alice, effect, "approve", {"payload_digest": wrong})
    assert response.status_code == 409
    html = response.content.decode()
    assert "The digest is not the command" in html
    assert effect.command.payload_digest in html  # what it should have been, to re-read
    effect.refresh_from_db()
    assert effect.status == "AWAITING_APPROVAL"
    assert effect.approved_by_id is None and effect.approved_digest == ""
    assert events(effect) == before


def test_approve_the_digest_read_even_when_pasted_loosely(alice, bot):
    effect = submit(bot.principal, BIG_REFUND)
    digest = effect.command.payload_digest
    pasted = "  " + digest.removeprefix("sha256:").upper() + "\n"
    response = action(alice, effect, "approve", {"payload_digest": pasted, "comment": "ok"})
    assert response.status_code == 200
    effect.refresh_from_db()
    assert effect.status == "PREPARED"
    assert effect.approved_by_id == alice.principal.pk
    assert effect.approved_digest == digest
    assert "Approved" in response.content.decode()


def test_approve_needs_a_digest(alice, bot):
    effect = submit(bot.principal, BIG_REFUND)
    response = action(alice, effect, "approve", {"payload_digest": ""})
    assert response.status_code == 400
    assert "payload_digest" in response.content.decode()
    effect.refresh_from_db()
    assert effect.status == "AWAITING_APPROVAL"


def test_the_requester_cannot_approve_its_own_command(root):
    effect = submit(root.principal, BIG_REFUND)
    assert buttons(root, effect) >= {"reject", "cancel"}
    assert "approve" not in buttons(root, effect)
    response = action(root, effect, "approve", {"payload_digest": effect.command.payload_digest})
    assert response.status_code == 403
    assert "The requester of a command cannot approve it" in response.content.decode()
    effect.refresh_from_db()
    assert effect.status == "AWAITING_APPROVAL"


def test_reject_with_a_reason(alice, bot):
    effect = submit(bot.principal, BIG_REFUND)
    response = action(alice, effect, "reject", {"reason": "not this customer"})
    assert response.status_code == 200
    effect.refresh_from_db()
    assert effect.status == "REJECTED"
    assert EffectEvent.objects.filter(effect_id=effect.pk, reason="not this customer").exists()


def test_cancel_before_dispatch_by_an_operator_or_the_requester(oscar, bot):
    first, second = submit(bot.principal, REFUND), submit(bot.principal, TICKET)
    assert action(oscar, first, "cancel", {"reason": "duplicate"}).status_code == 200
    assert "cancel" in buttons(bot, second)
    assert action(bot, second, "cancel").status_code == 200
    assert {e.status for e in Effect.objects.filter(pk__in=[first.pk, second.pk])} == {"CANCELLED"}


def test_cancel_after_dispatch_is_a_readable_conflict(oscar, bot):
    effect = set_state(submit(bot.principal, REFUND), status="UNKNOWN")
    assert "cancel" not in buttons(oscar, effect)
    response = action(oscar, effect, "cancel")
    assert response.status_code == 409
    assert (
        "only an effect that has not been dispatched can be cancelled" in response.content.decode()
    )


def test_buttons_follow_the_role(oscar, alice, bot):
    waiting = submit(bot.principal, BIG_REFUND)
    assert buttons(alice, waiting) == {"approve", "reject"}
    assert buttons(oscar, waiting) == {"freeze", "cancel"}
    assert buttons(bot, waiting) == {"cancel"}


def test_another_tenant_cannot_act(olga, bot):
    effect = submit(bot.principal, REFUND)
    response = action(olga, effect, "freeze")
    assert response.status_code == 404
    effect.refresh_from_db()
    assert not effect.frozen


def test_unknown_action_and_wrong_method(oscar, bot):
    effect = submit(bot.principal, REFUND)
    assert action(oscar, effect, "explode").status_code == 404
    assert oscar.client.get(f"/effects/{effect.pk}/freeze").status_code == 405


def test_csrf_is_required(oscar, bot):
    effect = submit(bot.principal, REFUND)
    client = Client(enforce_csrf_checks=True)
    client.force_login(oscar.principal.user)
    response = client.post(f"/effects/{effect.pk}/freeze", HTTP_HX_REQUEST="true")
    assert response.status_code == 403
    effect.refresh_from_db()
    assert not effect.frozen
    page = client.get("/").content.decode()
    assert re.search(r"<body hx-headers='\{\"X-CSRFToken\": \"[^\"]+\"\}'>", page)


def test_reconcile_now_asks_the_provider(oscar, bot, sandbox):
    effect = set_state(submit(bot.principal, REFUND), status="UNKNOWN", attempt_count=1)
    assert "reconcile" in buttons(oscar, effect)
    response = action(oscar, effect, "reconcile")
    assert response.status_code == 200
    effect.refresh_from_db()
    # The sandbox never saw the key: within its retention that proves NOT_STARTED.
    assert effect.status == "NOT_STARTED"
    html = response.content.decode()
    assert "Asked the provider" in html and "Reconciliation" in html


def test_resolve_with_evidence(oscar, bot):
    effect = set_state(submit(bot.principal, REFUND), status="UNKNOWN", escalated=True)
    assert "resolve" in buttons(oscar, effect)
    refused = action(oscar, effect, "resolve", {"outcome": "confirmed", "evidence": ""})
    assert refused.status_code == 400
    assert "evidence" in refused.content.decode()
    effect.refresh_from_db()
    assert effect.status == "UNKNOWN"
    response = action(
        oscar, effect, "resolve", {"outcome": "confirmed", "evidence": "refund re_1 in dashboard"}
    )
    assert response.status_code == 200
    effect.refresh_from_db()
    assert effect.status == "CONFIRMED" and not effect.escalated
    assert "refund re_1 in dashboard" in response.content.decode()


def test_take_an_open_case(oscar, bot):
    case_open = pytest.importorskip("reconciliation.services").case_open
    effect = set_state(submit(bot.principal, REFUND), status="UNKNOWN", escalated=True)
    case = case_open(effect=effect, reason="escalated", text="8 lookups", actor="reconciler")
    # The page offers "Take it", which takes the open case too; the case's own action stays.
    assert "take" in buttons(oscar, effect) and "acknowledge" not in buttons(oscar, effect)
    response = action(oscar, effect, "acknowledge")
    assert response.status_code == 200
    case.refresh_from_db()
    assert case.state == "acknowledged"
    assert "taken by oscar" in response.content.decode()


def test_compensate_issues_a_new_linked_command(oscar, bot):
    effect = set_state(
        submit(bot.principal, TICKET),
        status="CONFIRMED",
        confirmed_at=timezone.now(),
        provider_operation_id="op_1",
    )
    add_receipt(effect, result={"ticket_id": "TCK-1", "state": "open"})
    assert "compensate" in buttons(oscar, effect)
    response = action(oscar, effect, "compensate", {"reason": "opened in error"})
    assert response.status_code == 200
    effect.refresh_from_db()
    assert effect.status == "COMPENSATING"
    compensation = effect.compensated_by
    assert compensation.type == "ticket.close"
    assert f'href="/effects/{compensation.pk}"' in response.content.decode()
