"""The controls page (``/controls``): effect-type freezes, principals, capabilities. Operators
and admins only; every change calls the capabilities service the API calls and is answered
with its section in place."""

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from gateway.capabilities import capability_grant
from gateway.errors import NotPermitted
from gateway.models import Capability, EffectTypeFreeze, Principal
from tests.console.conftest import REFUND, person, submit


def post(who, path, data=None, htmx=True):
    if htmx:
        return who.htmx("post", path, data)
    return who.client.post(path, data or {})


@pytest.fixture
def grants(bot, root):
    """acme's agent has the conftest's "*" grant; add a spent one, a revoked and an expired."""
    agent = bot.principal
    budget = capability_grant(
        granted_by="admin:root",
        principal=agent,
        effect_types=["billing.refund.*"],
        resource_selector="order:ord_*",
        budget_count=10,
        budget_amount=50_000,
        budget_currency="EUR",
        expires_in=3600,
    )
    Capability.objects.filter(pk=budget.pk).update(spent_count=3, spent_amount=1_500)
    revoked = capability_grant(granted_by="admin:root", principal=agent, effect_types=["x.*"])
    Capability.objects.filter(pk=revoked.pk).update(
        revoked_at=timezone.now(), revoked_reason="leaked"
    )
    expired = capability_grant(granted_by="admin:root", principal=agent, effect_types=["y.*"])
    Capability.objects.filter(pk=expired.pk).update(
        expires_at=timezone.now() - timedelta(minutes=5)
    )
    return {
        "budget": Capability.objects.get(pk=budget.pk),
        "revoked": revoked,
        "expired": expired,
    }


def grant_row(html: str, grant: Capability) -> str:
    row = html[html.index(f'data-grant="{grant.pk}"') :]
    return row[: row.index("</tr>")]


def test_operator_sees_types_principals_and_grants(oscar, alice, grants):
    response = oscar.client.get("/controls")
    assert response.status_code == 200
    html = response.content.decode()
    for section in ('id="types"', 'id="principals"', 'id="grants"'):
        assert section in html
    assert 'data-type="billing.refund.create"' in html
    assert 'data-principal="alice"' in html and 'data-principal="refund-bot"' in html
    row = grant_row(html, grants["budget"])
    assert "3 of 10" in row
    assert "15.00 EUR of 500.00 EUR" in row
    assert "billing.refund.*" in row and "order:ord_*" in row
    assert "in 59 min" in row or "in 1 h" in row
    assert "chip-ok" in row and "Revoke" in row
    revoked = grant_row(html, grants["revoked"])
    assert "revoked" in revoked and "leaked" in revoked and "Revoke" not in revoked
    assert "expired" in grant_row(html, grants["expired"])
    # An operator revokes but does not grant.
    assert "Grant a capability" not in html
    assert 'aria-current="page">Controls' in html


@pytest.mark.parametrize("who", ["alice", "bot"])
def test_approvers_and_agents_get_a_readable_403(request, who, grants):
    someone = request.getfixturevalue(who)
    page = someone.client.get("/controls")
    assert page.status_code == 403
    html = page.content.decode()
    assert "The controls are for operators and admins" in html
    assert "Traceback" not in html
    assert 'href="/controls"' not in html  # not in the nav either
    for path, data in [
        ("/controls/types/ticket.create/freeze", {"reason": "x"}),
        ("/controls/principals/oscar/freeze", {}),
        (f"/controls/capabilities/{grants['budget'].pk}/revoke", {"reason": "x"}),
        ("/controls/capabilities", {"principal": "refund-bot", "effect_types": "*"}),
    ]:
        response = post(someone, path, data)
        assert response.status_code == 403, path
        assert response["HX-Retarget"] == "#flash"
    assert not EffectTypeFreeze.objects.exists()
    assert not Principal.objects.filter(frozen=True).exists()
    assert Capability.objects.get(pk=grants["budget"].pk).revoked_at is None


def test_freeze_and_unfreeze_an_effect_type_in_place(oscar):
    refused = post(oscar, "/controls/types/ticket.create/freeze", {"reason": ""})
    assert refused.status_code == 400 and "reason" in refused.content.decode()
    assert not EffectTypeFreeze.objects.exists()

    response = post(oscar, "/controls/types/ticket.create/freeze", {"reason": "INC-7 tickets"})
    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="types"')
    row = html[html.index('data-type="ticket.create"') :]
    row = row[: row.index("</tr>")]
    assert "chip-frozen" in row and "INC-7 tickets" in row and "by oscar" in row
    assert "Froze ticket.create" in html and 'id="flash"' in html
    freeze = EffectTypeFreeze.objects.get()
    assert (freeze.type, freeze.reason, freeze.frozen_by_id) == (
        "ticket.create",
        "INC-7 tickets",
        oscar.principal.pk,
    )
    again = post(oscar, "/controls/types/ticket.create/freeze", {"reason": "twice"})
    assert "was already frozen" in again.content.decode()

    response = post(oscar, "/controls/types/ticket.create/unfreeze")
    assert response.status_code == 200
    assert "Unfroze ticket.create" in response.content.decode()
    assert not EffectTypeFreeze.objects.exists()


def test_a_frozen_type_is_per_tenant(oscar, olga):
    post(oscar, "/controls/types/ticket.create/freeze", {"reason": "acme only"})
    html = olga.client.get("/controls").content.decode()
    row = html[html.index('data-type="ticket.create"') :]
    assert "chip-frozen" not in row[: row.index("</tr>")]


def test_unknown_type_and_verb_are_404(oscar):
    assert post(oscar, "/controls/types/nope.create/freeze", {"reason": "x"}).status_code == 404
    assert post(oscar, "/controls/types/ticket.create/melt", {"reason": "x"}).status_code == 404


def test_without_javascript_a_change_redirects_back(oscar):
    response = post(oscar, "/controls/types/ticket.create/freeze", {"reason": "INC"}, htmx=False)
    assert response.status_code == 302
    assert response["Location"] == "/controls#types"
    assert "Froze ticket.create" in oscar.client.get("/controls").content.decode()


def test_freeze_and_unfreeze_a_principal(oscar, bot):
    response = post(oscar, "/controls/principals/refund-bot/freeze", {"reason": "INC-9 loops"})
    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="principals"')
    row = html[html.index('data-principal="refund-bot"') :]
    assert "chip-frozen" in row[: row.index("</tr>")]
    bot.principal.refresh_from_db()
    assert bot.principal.frozen
    # A frozen agent submits nothing: the service says so.
    with pytest.raises(NotPermitted, match="frozen"):
        submit(bot.principal, REFUND)
    post(oscar, "/controls/principals/refund-bot/unfreeze")
    bot.principal.refresh_from_db()
    assert not bot.principal.frozen


def test_the_operator_has_no_button_to_freeze_itself(oscar):
    html = oscar.client.get("/controls").content.decode()
    row = html[html.index('data-principal="oscar"') :]
    assert "(you)" in row[: row.index("</tr>")] and "Freeze" not in row[: row.index("</tr>")]


def test_another_tenants_principal_and_grant_are_404(oscar, olga, grants):
    person("globex", "globex-bot", "agent")
    assert post(oscar, "/controls/principals/globex-bot/freeze").status_code == 404
    response = post(olga, f"/controls/capabilities/{grants['budget'].pk}/revoke", {"reason": "x"})
    assert response.status_code == 404
    assert grants["budget"].pk not in olga.client.get("/controls").content.decode()
    assert not Principal.objects.filter(frozen=True).exists()
    assert Capability.objects.get(pk=grants["budget"].pk).revoked_at is None


def test_revoke_a_grant_with_a_reason(oscar, grants):
    grant = grants["budget"]
    path = f"/controls/capabilities/{grant.pk}/revoke"
    assert post(oscar, path, {"reason": ""}).status_code == 400
    response = post(oscar, path, {"reason": "agent misbehaving"})
    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="grants"')
    assert "agent misbehaving" in grant_row(html, grant)
    grant.refresh_from_db()
    assert grant.revoked_at is not None and grant.revoked_reason == "agent misbehaving"
    again = post(oscar, path, {"reason": "twice"})
    assert again.status_code == 409 and "already revoked" in again.content.decode()


def test_admin_grants_a_capability(root, bot, oscar):
    html = root.client.get("/controls").content.decode()
    assert "Grant a capability" in html
    assert '<option value="refund-bot">refund-bot (agent)</option>' in html
    # People submit under grants too; the admin granting is never offered to themselves.
    assert '<option value="oscar">oscar (operator)</option>' in html
    assert '<option value="root">' not in html
    response = post(
        root,
        "/controls/capabilities",
        {
            "principal": "refund-bot",
            "effect_types": "ticket.create, ticket.close  email.*",
            "resource_selector": "queue:support",
            "budget_count": "20",
            "budget_amount": "10000",
            "budget_currency": "eur",
            "expires_in": "86400",
        },
    )
    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<section id="grants"')
    grant = Capability.objects.filter(resource_selector="queue:support").get()
    assert grant.effect_types == ["ticket.create", "ticket.close", "email.*"]
    assert (grant.budget_count, grant.budget_amount, grant.budget_currency) == (20, 10_000, "EUR")
    assert grant.created_by == "admin:root"
    assert timedelta(hours=23) < grant.expires_at - timezone.now() <= timedelta(days=1)
    assert "0.00 EUR of 100.00 EUR" in grant_row(body, grant)
    assert f"Granted {grant.pk} to refund-bot" in body


def test_a_grant_the_service_refuses_is_answered_in_the_form(root, alice):
    before = Capability.objects.count()
    # An approver submits nothing: capability_grant refuses it.
    response = post(root, "/controls/capabilities", {"principal": "alice", "effect_types": "*"})
    assert response.status_code == 400
    assert response["HX-Retarget"] == "#grant-error"
    assert "Capabilities are granted to those who submit" in response.content.decode()
    # No type: the form refuses it.
    response = post(root, "/controls/capabilities", {"principal": "alice", "effect_types": " , "})
    assert response.status_code == 400 and "effect_types" in response.content.decode()
    response = post(root, "/controls/capabilities", {"principal": "ghost", "effect_types": "*"})
    assert response.status_code == 404
    assert Capability.objects.count() == before


def test_csrf_is_required(oscar):
    client = Client(enforce_csrf_checks=True)
    client.force_login(oscar.principal.user)
    assert client.post("/controls/types/ticket.create/freeze", {"reason": "x"}).status_code == 403
    assert not EffectTypeFreeze.objects.exists()


def test_nav_shows_controls_to_operators_and_admins_only(oscar, root, alice):
    def has_link(who) -> bool:
        return bool(re.search(r'href="/controls"', who.client.get("/").content.decode()))

    assert has_link(oscar) and has_link(root) and not has_link(alice)


def test_controls_run_a_fixed_number_of_queries(oscar, bot, grants, django_assert_max_num_queries):
    for number in range(20):
        agent = person("acme", f"agent-{number}", "agent").principal
        capability_grant(granted_by="admin:root", principal=agent, effect_types=["ticket.*"])
    # session, user, principal + tenant, the type freezes, the principals with their live
    # grants counted, the grants with their agents, the tokens with their principals, the
    # nav's two badges, the audit chain's sealed head and backlog: the same for 2 agents as
    # for 22.
    with django_assert_max_num_queries(10):
        assert oscar.client.get("/controls").status_code == 200


def test_the_controls_page_shows_the_sealed_head_and_the_sealing_lag(oscar, grants):
    from gateway import audit

    html = oscar.client.get("/controls").content.decode()
    section = html[html.index('id="audit"') :]
    waiting = audit.seal_state(oscar.principal.tenant_id).unsealed
    assert waiting > 0  # the grants' control events are committed, not sealed yet
    assert f"{waiting} event" in section and "sealing lag" in section
    audit.seal_pending()
    html = oscar.client.get("/controls").content.decode()
    section = html[html.index('id="audit"') :]
    head = audit.seal_state(oscar.principal.tenant_id)
    assert f"link {head.length}" in section and head.last_hash[:12] in section
    assert "0 events" in section and "sealing lag" not in section


def test_the_controls_page_says_when_the_sequencer_has_stopped(oscar, grants):
    """After a logical restore into another cluster the sequencer stops (gateway.audit): the
    audit panel says so and names the fix."""
    from gateway import audit
    from gateway.models import AuditChainHead

    audit.seal_pending()
    html = oscar.client.get("/controls").content.decode()
    assert "audit_rebase" not in html[html.index('id="audit"') :]
    AuditChainHead.objects.filter(tenant_id=oscar.principal.tenant_id).update(floor_txid=10**15)
    html = oscar.client.get("/controls").content.decode()
    assert "manage.py audit_rebase" in html[html.index('id="audit"') :]
