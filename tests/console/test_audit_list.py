"""The tenant's audit list (``/audit``): who did what to which effect, newest first, from the
audit trail's events; filtered by actor, action, effect and time; keyset pages; for
operators, approvers and admins; another tenant's events never shown."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from gateway import services
from gateway.console.audit_list import AUDIT_PAGE_SIZE
from gateway.models import EffectEvent
from tests.console.conftest import REFUND, add_notes, person, submit


def event_ids(html: str) -> list[int]:
    return [int(part.split('"')[0]) for part in html.split('data-event="')[1:]]


def test_lists_who_did_what_newest_first(oscar, bot):
    effect = submit(bot.principal, REFUND)
    services.effect_set_frozen(effect=effect, principal=oscar.principal, frozen=True, reason="hold")
    html = oscar.client.get("/audit").content.decode()
    expected = list(
        EffectEvent.objects.filter(tenant_id=oscar.principal.tenant_id)
        .order_by("-pk")
        .values_list("pk", flat=True)
    )
    assert event_ids(html) == expected
    assert "operator:oscar" in html and "frozen" in html and "hold" in html
    assert f'href="/effects/{effect.pk}"' in html and "billing.refund.create" in html
    assert 'aria-current="page">Audit' in html


def test_filters_by_actor_action_effect_and_time(oscar, bot):
    first = submit(bot.principal, REFUND)
    second = submit(bot.principal, REFUND)
    services.effect_set_frozen(effect=first, principal=oscar.principal, frozen=True, reason="a")
    services.effect_set_frozen(effect=second, principal=oscar.principal, frozen=True, reason="b")
    frozen = list(EffectEvent.objects.filter(kind="frozen").order_by("-pk"))

    def listed(**params) -> list[int]:
        return event_ids(oscar.client.get("/audit", params).content.decode())

    assert listed(action="frozen") == [e.pk for e in frozen]
    assert listed(actor="oscar") == [e.pk for e in frozen]
    assert listed(actor="operator:oscar", effect=first.pk) == [frozen[1].pk]
    assert listed(actor="agent:refund-bot", action="frozen") == []
    assert set(listed(effect=first.pk)) == set(
        EffectEvent.objects.filter(effect_id=first.pk).values_list("pk", flat=True)
    )
    later = (timezone.now() + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S")
    earlier = (timezone.now() - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M")
    assert listed(action="frozen", start=later) == []
    assert listed(action="frozen", start=earlier, end=later) == [e.pk for e in frozen]
    assert listed(action="frozen", end=earlier) == []
    # What does not parse is left out, not an error.
    assert listed(action="frozen", start="yesterday") == [e.pk for e in frozen]


def test_keyset_pages(oscar, bot):
    effect = submit(bot.principal, REFUND)
    add_notes(effect, AUDIT_PAGE_SIZE + 10)
    everything = list(
        EffectEvent.objects.filter(effect_id=effect.pk).order_by("-pk").values_list("pk", flat=True)
    )
    html = oscar.client.get("/audit", {"effect": effect.pk}).content.decode()
    assert event_ids(html) == everything[:AUDIT_PAGE_SIZE]
    assert f"after={everything[AUDIT_PAGE_SIZE - 1]}" in html
    html = oscar.client.get(
        "/audit", {"effect": effect.pk, "after": everything[AUDIT_PAGE_SIZE - 1]}
    ).content.decode()
    assert event_ids(html) == everything[AUDIT_PAGE_SIZE:]
    assert "Older" not in html and "Newest" in html


def test_a_page_costs_the_same_queries_at_any_size(oscar, bot, django_assert_max_num_queries):
    for _ in range(3):
        submit(bot.principal, REFUND)
    with django_assert_max_num_queries(12):
        oscar.client.get("/audit")


def test_other_tenants_events_never_appear(oscar, olga, bot):
    effect = submit(bot.principal, REFUND)
    theirs = person("globex", "globex-root", "admin")
    services.effect_set_frozen(effect=effect, principal=oscar.principal, frozen=True)
    html = olga.client.get("/audit").content.decode()
    assert event_ids(html) == []
    assert effect.pk not in html
    assert event_ids(olga.client.get("/audit", {"effect": effect.pk}).content.decode()) == []
    assert theirs.client.get("/audit").status_code == 200


def test_roles(oscar, alice, root, bot):
    assert alice.client.get("/audit").status_code == 200
    assert root.client.get("/audit").status_code == 200
    refused = bot.client.get("/audit")
    assert refused.status_code == 403
    # And the nav offers it only to those who may read it.
    assert 'href="/audit"' in oscar.client.get("/").content.decode()
    assert 'href="/audit"' not in bot.client.get("/").content.decode()
