"""An incident in the console: the queue grouped by cause, one action on a whole group
(looked up now, re-armed, taken, the type frozen), escalated effects re-armed by themselves
once their provider answers again, who is on an effect, closing what a human settled.

Lookups go to the real sandbox provider over HTTP; its operation log is the oracle that
nothing was executed twice.
"""

from __future__ import annotations

import re

import pytest

from gateway.models import Effect, EffectEvent, EffectTypeFreeze
from reconciliation.models import Case, Claim
from tests.console.conftest import (
    EMAIL,
    REFUND,
    captured_at_provider,
    escalated_unknown,
    open_case,
    set_state,
    submit,
)

GROUP = {"provider": "billing", "type": "billing.refund.create", "cause": "escalated"}


def _outage(bot, count: int) -> list[Effect]:
    return [
        escalated_unknown(bot.principal, resource={"type": "order", "id": f"ord_{n}"})
        for n in range(count)
    ]


def test_triage_groups_the_queue_by_provider_type_and_cause(oscar, bot):
    _outage(bot, 3)
    set_state(submit(bot.principal, EMAIL), status="COMPENSATION_FAILED")
    html = oscar.client.get("/").content.decode()
    group = re.search(r'data-group="billing/billing.refund.create/escalated".*?</li>', html, re.S)
    assert group is not None
    assert '<strong class="group-count">3</strong>' in group.group(0)
    assert "Look up all 3 now" in group.group(0)
    assert "Re-arm lookups of 3" in group.group(0)
    assert 'data-group="mail/email.message.send/compensation_failed"' in html
    # "Show these 3" filters the queue by the group.
    filtered = oscar.client.get("/", GROUP).content.decode()
    assert "3 effects need a human" in filtered


def test_150_escalated_effects_are_settled_by_one_bulk_post(
    oscar, bot, sandbox, eager_tasks, django_capture_on_commit_callbacks
):
    effects = _outage(bot, 150)
    for effect in effects:
        captured_at_provider(sandbox, effect)
    creates_before = len([op for op in sandbox.log() if op.get("action") == "create"])
    with django_capture_on_commit_callbacks(execute=True):
        # A background job (tests/console/test_bulk_jobs.py), worked eagerly after commit.
        response = oscar.htmx("post", "/triage/bulk/reconcile", {**GROUP, "expected": 150})
    assert response.status_code == 200, response.content
    jobs = oscar.htmx("get", "/triage/jobs").content.decode()
    assert "150 settled: 150 confirmed by lookup" in jobs
    assert Effect.objects.filter(pk__in=[e.pk for e in effects], status="CONFIRMED").count() == 150
    # One "rearmed" event per effect, then the reconciler's own transition.
    assert EffectEvent.objects.filter(kind="rearmed").count() == 150
    assert not Case.objects.filter(effect__in=effects, state__in=["open", "acknowledged"]).exists()
    # Lookups only: the provider made no operation it had not made before.
    assert len([op for op in sandbox.log() if op.get("action") == "create"]) == creates_before
    assert "Nothing needs a human right now" in oscar.client.get("/").content.decode()


def test_a_group_that_changed_is_not_acted_on(oscar, bot, sandbox):
    effects = _outage(bot, 3)
    response = oscar.htmx("post", "/triage/bulk/rearm", {**GROUP, "expected": 4})
    assert response.status_code == 409
    body = response.content.decode()
    assert "it has 3 effects now, you saw 4" in body
    assert 'hx-swap-oob="outerHTML"' in body  # the queue is redrawn as it is now
    assert Effect.objects.filter(pk__in=[e.pk for e in effects], escalated=True).count() == 3
    assert not EffectEvent.objects.filter(kind="rearmed").exists()


def test_rearm_gives_a_fresh_budget_and_one_event_each(oscar, bot):
    effects = _outage(bot, 4)
    response = oscar.htmx("post", "/triage/bulk/rearm", {**GROUP, "expected": 4})
    assert "Re-armed the lookups of 4 of 4 effects" in response.content.decode()
    for effect in Effect.objects.filter(pk__in=[e.pk for e in effects]):
        assert (effect.escalated, effect.check_count) == (False, 0)
        assert effect.next_check_at is not None
        assert effect.events.filter(kind="rearmed").count() == 1


def test_only_operators_act_on_groups(alice, bot):
    effects = _outage(bot, 2)
    response = alice.htmx("post", "/triage/bulk/rearm", {**GROUP, "expected": 2})
    assert response.status_code in (403, 409)
    assert Effect.objects.filter(pk__in=[e.pk for e in effects], escalated=True).count() == 2


def test_take_all_and_freeze_the_type(oscar, bot):
    effects = _outage(bot, 2)
    oscar.htmx("post", "/triage/bulk/take", {**GROUP, "expected": 2})
    assert Claim.objects.filter(effect__in=effects, released_at=None).count() == 2
    assert Case.objects.filter(effect__in=effects, state="acknowledged").count() == 2
    html = oscar.client.get("/").content.decode()
    assert html.count('<span class="chip chip-ok">oscar</span>') == 2
    oscar.htmx("post", "/triage/bulk/freeze-type", {**GROUP, "expected": 2, "reason": "outage"})
    assert EffectTypeFreeze.objects.filter(type="billing.refund.create").exists()


@pytest.mark.django_db(transaction=True)
def test_escalated_effects_are_rearmed_when_their_provider_answers_again(bot, sandbox):
    from reconciliation.bulk import effects_probe_escalated

    effects = _outage(bot, 3)
    for effect in effects:
        captured_at_provider(sandbox, effect)
    # The provider is still down: the probe asks about the oldest one and nothing changes.
    sandbox.add_fault("lookup_unreachable", times=1, provider="billing")
    from reconciliation.models import ReconciliationRecord

    ReconciliationRecord.objects.all().delete()
    assert effects_probe_escalated() == 1
    assert Effect.objects.filter(pk__in=[e.pk for e in effects], escalated=True).count() == 3
    # It answers again: the probed effect is confirmed, the two others re-armed (due now).
    ReconciliationRecord.objects.all().delete()
    assert effects_probe_escalated() == 1
    statuses = dict(
        Effect.objects.filter(pk__in=[e.pk for e in effects]).values_list("pk", "status")
    )
    assert statuses[effects[0].pk] == "CONFIRMED"
    rearmed = Effect.objects.filter(pk__in=[e.pk for e in effects[1:]])
    assert all(not e.escalated and e.next_check_at is not None for e in rearmed)
    assert EffectEvent.objects.filter(kind="rearmed", actor="reconciler").count() == 2


def test_take_and_release_an_effect_and_who_else_looks(oscar, root, bot):
    effect = escalated_unknown(bot.principal)
    oscar.htmx("post", f"/effects/{effect.pk}/take", {})
    page = root.client.get(f"/effects/{effect.pk}").content.decode()
    assert "oscar is on it" in page
    # oscar has the page open (he just took it): root sees him looking.
    oscar.client.get(f"/effects/{effect.pk}")
    assert "Also looking: oscar" in root.client.get(f"/effects/{effect.pk}").content.decode()
    # Someone else cannot take it; the refusal says who holds it.
    response = root.htmx("post", f"/effects/{effect.pk}/take", {})
    assert response.status_code == 409
    assert "oscar (operator) took" in response.content.decode()
    assert Claim.objects.get(effect=effect, released_at=None).principal == oscar.principal
    root.htmx("post", f"/effects/{effect.pk}/release", {"reason": "oscar went home"})
    assert not Claim.objects.filter(effect=effect, released_at=None).exists()
    assert effect.events.filter(kind="released", reason="oscar went home").exists()


def test_a_409_redraws_the_effect_and_says_who_changed_what(oscar, root, bot):
    effect = set_state(submit(bot.principal, REFUND), status="UNKNOWN")
    from gateway import services

    services.effect_set_frozen(effect=effect, principal=root.principal, frozen=True, reason="x")
    set_state(effect, status="CONFIRMED")
    response = oscar.htmx(
        "post", f"/effects/{effect.pk}/resolve", {"outcome": "confirmed", "evidence": "seen"}
    )
    assert response.status_code == 409
    body = response.content.decode()
    assert 'hx-swap-oob="outerHTML"' in body
    assert "Meanwhile admin:root changed it" in body


def test_a_case_on_a_confirmed_effect_is_in_triage_and_can_be_closed(oscar, bot):
    effect = set_state(submit(bot.principal, REFUND), status="CONFIRMED")
    case = open_case(effect, reason="contradiction", text="a later receipt says failed")
    assert effect.pk in oscar.client.get("/").content.decode()
    response = oscar.htmx(
        "post", f"/effects/{effect.pk}/close-case", {"reason": "billing shows it captured"}
    )
    assert response.status_code == 200
    case.refresh_from_db()
    assert case.state == "resolved"
    assert effect.events.filter(kind="case_closed").count() == 1
    assert effect.pk not in oscar.client.get("/").content.decode()


def test_a_failed_compensation_fixed_by_hand_leaves_triage(oscar, bot):
    effect = set_state(submit(bot.principal, EMAIL), status="COMPENSATION_FAILED")
    page = oscar.client.get(f"/effects/{effect.pk}").content.decode()
    assert "Record the manual fix" in page
    response = oscar.htmx(
        "post", f"/effects/{effect.pk}/record-fix", {"reason": "sent the correction by hand"}
    )
    assert response.status_code == 200
    assert Effect.objects.get(pk=effect.pk).status == "COMPENSATION_FAILED"
    assert effect.pk not in oscar.client.get("/").content.decode()


def test_triage_lists_paused_sagas_and_old_approvals(oscar, bot):
    from datetime import timedelta

    from django.utils import timezone

    from sagas.models import SagaRun
    from tests.console.conftest import BIG_REFUND, start_saga

    run = start_saga(bot.principal, order_id="ord_5")
    SagaRun.objects.filter(pk=run.pk).update(state="PAUSED_FAILED")
    waiting = submit(bot.principal, BIG_REFUND)
    html = oscar.client.get("/").content.decode()
    assert f'data-saga="{run.pk}"' in html
    assert "waiting for an approver for more than" not in html
    set_state(waiting, created_at=timezone.now() - timedelta(minutes=20))
    html = oscar.client.get("/").content.decode()
    assert "<strong>1</strong> command waiting for an approver for more than 15 min" in html


def test_every_case_can_be_closed_from_the_queue(oscar, bot):
    effect = set_state(submit(bot.principal, REFUND), status="CONFIRMED")
    case = open_case(effect, reason="contradiction", text="a later receipt says failed")
    html = oscar.client.get("/cases").content.decode()
    assert f"/cases/{case.pk}/close" in html
    response = oscar.htmx("post", f"/cases/{case.pk}/close", {"note": "the receipt was wrong"})
    assert response.status_code == 200
    case.refresh_from_db()
    assert case.state == "resolved" and "the receipt was wrong" in case.resolution
    # An uncertain effect's case is resolved with evidence, not closed.
    unknown = escalated_unknown(bot.principal)
    other = Case.objects.get(effect=unknown)
    assert f"/cases/{other.pk}/close" not in oscar.client.get("/cases").content.decode()
    response = oscar.htmx("post", f"/cases/{other.pk}/close", {"note": "x"})
    assert response.status_code == 409


def test_freeze_the_requester_of_a_group(oscar, bot):
    _outage(bot, 2)
    html = oscar.client.get("/").content.decode()
    assert "Freeze the requester" in html
    response = oscar.htmx(
        "post", "/triage/bulk/freeze-principal", {**GROUP, "expected": 2, "reason": "a loop"}
    )
    assert "Froze refund-bot" in response.content.decode()
    bot.principal.refresh_from_db()
    assert bot.principal.frozen


def test_freeze_the_requester_is_refused_for_a_group_of_several(oscar, bot, root):
    _outage(bot, 1)
    escalated_unknown(root.principal)
    response = oscar.htmx(
        "post", "/triage/bulk/freeze-principal", {**GROUP, "expected": 2, "reason": "a loop"}
    )
    assert response.status_code == 409
    assert "asked for by 2 principals" in response.content.decode()
    root.principal.refresh_from_db()
    assert not root.principal.frozen


def test_a_409_on_a_case_card_redraws_it_and_says_who(oscar, root, bot):
    effect = escalated_unknown(bot.principal)
    case = Case.objects.get(effect=effect)
    from reconciliation.services import case_acknowledge

    case_acknowledge(case=case, principal=root.principal, note="mine")
    response = oscar.htmx("post", f"/cases/{case.pk}/acknowledge", {"note": "x"})
    assert response.status_code == 409
    body = response.content.decode()
    assert f'id="case-{case.pk}"' in body and 'hx-swap-oob="outerHTML"' in body
    assert "Meanwhile admin:root changed it" in body and "case acknowledged" in body
