"""The saga pages: the list (``/sagas``) and a run (``/sagas/<id>``) with each step, its
effect, receipt and compensation; resume, cancel, freeze, unfreeze and owners' tasks through
the sagas services; frozen and failed runs in the triage queue; tenant isolation."""

import re

import pytest
from django.test import Client
from django.utils import timezone

from gateway.services import effect_dispatch
from tests.console.conftest import add_receipt, saga_step_effect, set_state, start_saga

pytest.importorskip("sagas.services", reason="the sagas app is not there")

from sagas.models import SagaEvent, SagaRun, SagaStep, SagaTask
from sagas.services import saga_advance

ORDER_STEPS = ["reserve_inventory", "charge_payment", "create_shipment", "notify_customer"]


def saga_ids(html: str) -> list[str]:
    return re.findall(r'<tr data-saga="([^"]+)"', html)


def action(person, run, name, data=None, htmx=True):
    path = f"/sagas/{run.pk}/{name}"
    if htmx:
        return person.htmx("post", path, data)
    return person.client.post(path, data or {})


@pytest.fixture
def order(bot):
    """An order.fulfillment run of acme: its first step issued, waiting to be sent."""
    return start_saga(bot.principal)


def test_list_newest_first_with_filters(oscar, bot, order):
    release = start_saga(bot.principal, "release.production")
    SagaRun.objects.filter(pk=release.pk).update(frozen=True, frozen_reason="INC-9")
    page = oscar.client.get("/sagas")
    assert page.status_code == 200
    html = page.content.decode()
    assert saga_ids(html) == [release.pk, order.pk]
    assert "2 runs" in html and 'aria-current="page">Sagas' in html
    row = html[html.index(f'data-saga="{order.pk}"') :]
    row = row[: row.index("</tr>")]
    assert 'data-state="RUNNING"' in row and "reserve_inventory" in row and "refund-bot" in row

    def shown(query: str) -> list[str]:
        return saga_ids(oscar.client.get("/sagas?" + query).content.decode())

    assert shown("definition=order.fulfillment") == [order.pk]
    assert shown("frozen=yes") == [release.pk]
    assert shown("frozen=no") == [order.pk]
    assert shown("state=COMPLETED") == []
    assert len(shown("state=BOGUS&definition=nope")) == 2


def test_list_full_page_and_partial(oscar, order):
    page = oscar.client.get("/sagas")
    fragment = oscar.htmx("get", "/sagas")
    html = fragment.content.decode()
    assert "<html" in page.content.decode() and "<html" not in html
    assert html.lstrip().startswith('<section id="runs"')
    assert saga_ids(html) == [order.pk]
    for response in (page, fragment):
        assert "HX-Request" in response["Vary"]
    poll = re.search(r'<section id="runs"[^>]*hx-get="([^"]+)"', html).group(1)
    assert oscar.htmx("get", poll.replace("&amp;", "&")).status_code == 204


def test_run_page_shows_each_step(oscar, order):
    first = saga_step_effect(order, "reserve_inventory")
    response = oscar.client.get(f"/sagas/{order.pk}")
    assert response.status_code == 200
    html = response.content.decode()
    steps = re.findall(r'<li class="step step-([a-z]+)" data-step="([a-z_]+)"', html)
    assert [name for _, name in steps] == ORDER_STEPS
    assert {name: position for position, name in steps} == {
        "reserve_inventory": "waiting",
        "charge_payment": "pending",
        "create_shipment": "pending",
        "notify_customer": "pending",
    }
    step = html[html.index('data-step="reserve_inventory"') :]
    step = step[: step.index("</li>")]
    assert f'href="/effects/{first.pk}"' in step
    assert f'data-status="{first.status}"' in step
    assert "the run is here" in step and "fulfillment-oncall" in step
    assert "inventory.reservation.release" in step  # its compensator, from the contract
    assert "0 of 4 steps happened; at step 1" in html
    assert "not issued" in html
    # Operators see the inputs in clear; the timeline says who started it.
    assert "ada@example.com" in html
    assert "started" in html and "refund-bot" in html


def test_run_page_and_fragment(oscar, order):
    fragment = oscar.htmx("get", f"/sagas/{order.pk}")
    html = fragment.content.decode()
    assert fragment.status_code == 200 and "<html" not in html
    assert html.lstrip().startswith('<div id="saga"')
    poll = re.search(r'<div id="saga"[^>]*hx-get="([^"]+)"', html).group(1)
    assert oscar.htmx("get", poll).status_code == 204
    set_state(saga_step_effect(order, "reserve_inventory"), status="DISPATCHING")
    assert oscar.htmx("get", poll).status_code == 200


def test_receipt_summary_and_progress(oscar, order):
    first = set_state(
        saga_step_effect(order, "reserve_inventory"),
        status="CONFIRMED",
        confirmed_at=timezone.now(),
        provider_operation_id="op_res_1",
    )
    add_receipt(first, result={"reservation_id": "res_77", "state": "held"})
    assert saga_advance(saga_id=order.pk)  # the orchestrator issues the charge
    html = oscar.client.get(f"/sagas/{order.pk}").content.decode()
    step = html[html.index('data-step="reserve_inventory"') :]
    step = step[: step.index("</li>")]
    assert "reservation_id=res_77" in step and "digest matches" in step
    assert "window ends" in step
    assert "1 of 4 steps happened; at step 2" in html


def test_an_approver_sees_redacted_inputs(alice, order):
    html = alice.client.get(f"/sagas/{order.pk}").content.decode()
    assert "ada@example.com" not in html and "[redacted]" in html


def test_freeze_stops_the_run_in_place(oscar, order):
    response = action(oscar, order, "freeze", {"reason": "provider incident INC-7"})
    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="saga"')
    assert 'id="saga-frozen-note"' in html and "provider incident INC-7" in html
    assert "Froze" in html and 'id="flash"' in html
    assert "Unfreeze" in html and "Resume" not in html
    order.refresh_from_db()
    assert order.frozen and order.frozen_reason == "provider incident INC-7"
    assert SagaEvent.objects.filter(run=order, kind="frozen", actor="operator:oscar").exists()
    # Its waiting step is not sent; and had it been sent and happened, the frozen run would
    # issue nothing after it.
    waiting = saga_step_effect(order, "reserve_inventory")
    assert effect_dispatch(effect_id=waiting.pk, worker="test") is False
    assert saga_step_effect(order, "reserve_inventory").status == "PREPARED"
    set_state(waiting, status="CONFIRMED")
    assert saga_advance(saga_id=order.pk) is False
    assert not SagaStep.objects.filter(run=order, name="charge_payment").exists()

    response = action(oscar, order, "unfreeze", {"reason": "INC-7 over"})
    assert response.status_code == 200
    order.refresh_from_db()
    assert not order.frozen
    assert saga_advance(saga_id=order.pk)
    assert SagaStep.objects.filter(run=order, name="charge_payment").exists()


def test_without_javascript_an_action_redirects_back(oscar, order):
    response = action(oscar, order, "freeze", {"reason": "warehouse INC-31"}, htmx=False)
    assert response.status_code == 302
    assert response["Location"] == f"/sagas/{order.pk}"
    assert "Froze" in oscar.client.get(response["Location"]).content.decode()
    order.refresh_from_db()
    assert order.frozen and order.frozen_reason == "warehouse INC-31"


def test_a_freeze_without_a_reason_is_refused_and_changes_nothing(oscar, order):
    response = action(oscar, order, "freeze", {"reason": ""})
    assert response.status_code == 400
    order.refresh_from_db()
    assert not order.frozen


def test_cancel_stops_future_steps_and_cancels_the_unsent_one(oscar, order):
    response = action(oscar, order, "cancel", {"reason": "customer called"})
    assert response.status_code == 200
    assert "Cancelled" in response.content.decode()
    order.refresh_from_db()
    assert order.state == "CANCELLED"
    assert saga_step_effect(order, "reserve_inventory").status == "CANCELLED"


def test_resume_a_paused_run(oscar, order):
    SagaRun.objects.filter(pk=order.pk).update(state="PAUSED_FAILED")
    response = action(oscar, order, "resume", {"reason": "fixed upstream"})
    assert response.status_code == 200
    assert "Resumed" in response.content.decode()
    order.refresh_from_db()
    assert order.state == "RUNNING"
    assert SagaEvent.objects.filter(run=order, kind="resumed", reason="fixed upstream").exists()


def test_a_domain_error_is_readable_and_changes_nothing(oscar, order):
    SagaRun.objects.filter(pk=order.pk).update(state="COMPLETED")
    response = action(oscar, order, "resume")
    assert response.status_code == 409
    assert response["HX-Retarget"] == "#flash"
    assert "cannot be resumed" in response.content.decode()


@pytest.mark.parametrize("who", ["alice", "bot"])
def test_approvers_and_agents_cannot_freeze_or_resume(request, who, order):
    someone = request.getfixturevalue(who)
    html = someone.client.get(f"/sagas/{order.pk}").content.decode()
    assert "Freeze…" not in html and "Resume…" not in html
    for name in ("freeze", "resume", "unfreeze"):
        assert action(someone, order, name, {"reason": "INC-7"}).status_code == 403, name
    order.refresh_from_db()
    assert not order.frozen


def test_the_requester_may_cancel_its_own_run(bot, order):
    html = bot.client.get(f"/sagas/{order.pk}").content.decode()
    assert "Cancel…" in html
    assert action(bot, order, "cancel").status_code == 200


def test_another_tenants_run_is_a_404(olga, order):
    assert olga.client.get(f"/sagas/{order.pk}").status_code == 404
    assert saga_ids(olga.client.get("/sagas").content.decode()) == []
    assert action(olga, order, "freeze").status_code == 404
    order.refresh_from_db()
    assert not order.frozen


def test_unknown_action_and_wrong_method(oscar, order):
    assert action(oscar, order, "explode").status_code == 404
    assert oscar.client.get(f"/sagas/{order.pk}/freeze").status_code == 405


def test_csrf_is_required(oscar, order):
    client = Client(enforce_csrf_checks=True)
    client.force_login(oscar.principal.user)
    assert client.post(f"/sagas/{order.pk}/freeze").status_code == 403
    order.refresh_from_db()
    assert not order.frozen


def test_owners_close_their_manual_tasks(oscar, alice, order):
    record = SagaStep.objects.get(run=order, name="reserve_inventory")
    task = SagaTask.objects.create(
        tenant_id=order.tenant_id,
        run=order,
        step=record,
        effect=record.effect,
        kind="manual_compensation",
        owner="fulfillment-oncall",
        reason="release the stock by hand: the window closed",
        created_at=timezone.now(),
    )
    SagaRun.objects.filter(pk=order.pk).update(state="MANUAL_COMPENSATION")
    html = oscar.client.get(f"/sagas/{order.pk}").content.decode()
    assert "release the stock by hand" in html and "Mark done" in html
    assert "Mark done" not in alice.client.get(f"/sagas/{order.pk}").content.decode()
    path = f"/sagas/{order.pk}/tasks/{task.pk}/done"
    assert alice.htmx("post", path, {"note": "x"}).status_code == 403
    response = oscar.htmx("post", path, {"note": "released in the WMS"})
    assert response.status_code == 200
    assert "released in the WMS" in response.content.decode()
    task.refresh_from_db()
    order.refresh_from_db()
    assert task.state == "done" and order.state == "COMPENSATED"
    other = start_saga(order.requested_by)
    assert oscar.htmx("post", f"/sagas/{other.pk}/tasks/{task.pk}/done").status_code == 404


def test_triage_shows_frozen_and_failed_sagas(oscar, olga, bot, order):
    failed = start_saga(bot.principal)
    assert "Sagas stopped for a human" not in oscar.client.get("/").content.decode()
    SagaRun.objects.filter(pk=order.pk).update(frozen=True, frozen_reason="mismatch on op_1")
    SagaRun.objects.filter(pk=failed.pk).update(state="COMPENSATION_FAILED")
    html = oscar.client.get("/").content.decode()
    section = html[html.index('class="saga-alerts"') : html.index('id="queue-heading"')]
    assert f'href="/sagas/{order.pk}"' in section and "mismatch on op_1" in section
    assert f'href="/sagas/{failed.pk}"' in section and 'data-state="COMPENSATION_FAILED"' in section
    # Inside the polled fragment: it redraws when a run is frozen or unfrozen.
    assert 'class="saga-alerts"' in oscar.htmx("get", "/").content.decode()
    assert "saga-alerts" not in olga.client.get("/").content.decode()


def test_effect_page_links_its_saga(oscar, order):
    effect = saga_step_effect(order, "reserve_inventory")
    html = oscar.client.get(f"/effects/{effect.pk}").content.decode()
    assert f'href="/sagas/{order.pk}"' in html and "reserve_inventory" in html
    SagaRun.objects.filter(pk=order.pk).update(frozen=True, frozen_reason="INC-3")
    html = oscar.client.get(f"/effects/{effect.pk}").content.decode()
    assert "is frozen (INC-3)" in html


def test_list_and_run_pages_run_a_fixed_number_of_queries(
    oscar, bot, order, django_assert_max_num_queries
):
    for _ in range(20):
        start_saga(bot.principal)
    # session, user, principal + tenant, count + latest change, the page, the nav's two
    # badges: the same for 1 run as for 21.
    with django_assert_max_num_queries(7):
        response = oscar.client.get("/sagas")
    assert len(saga_ids(response.content.decode())) == 21
    # … and a run: session, user, principal, the run, its step records with their effects
    # and commands, their receipts (and compensations, once there are any), tasks, events,
    # the nav's two badges — one query per kind, not per step.
    with django_assert_max_num_queries(10):
        assert oscar.client.get(f"/sagas/{order.pk}").status_code == 200
