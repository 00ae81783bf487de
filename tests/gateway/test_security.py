"""Issue 4: approvals bound to digests, capabilities, freezes, sealed payloads, an audit trail
the database refuses to rewrite, and the usual (hashed tokens, throttling, headers)."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

import pytest
from cryptography.fernet import Fernet
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from gateway import audit, services
from gateway.contracts import CONTRACTS
from gateway.lib import vault
from gateway.models import ApiToken, Capability, Command, Effect, EffectEvent
from tests.conftest import Persona

pytestmark = pytest.mark.django_db

BIG_REFUND = {
    "type": "billing.refund.create",
    "resource": {"type": "order", "id": "ord_881", "version": 17},
    "payload": {"amount": 50_000, "currency": "EUR", "reason": "duplicate charge"},
}


def dispatch(effect_id: str) -> Effect:
    services.effect_dispatch(effect_id=effect_id, worker="test")
    return Effect.objects.get(pk=effect_id)


# --- approvals ------------------------------------------------------------------------------


def test_an_agent_can_never_approve(agent, other_agent, sandbox):
    effect = agent.submit(BIG_REFUND, "big").json()
    response = other_agent.client.post(
        f"/api/v1/effects/{effect['effect_id']}/approve",
        {"payload_digest": effect["payload_digest"]},
        format="json",
    )
    assert response.status_code == 403
    assert Effect.objects.get(pk=effect["effect_id"]).status == "AWAITING_APPROVAL"


def test_an_approval_expires_before_a_late_dispatch(agent, approver, sandbox, settings):
    effect = agent.submit(BIG_REFUND, "big").json()
    approver.client.post(
        f"/api/v1/effects/{effect['effect_id']}/approve",
        {"payload_digest": effect["payload_digest"]},
        format="json",
    )
    # The effect sat (frozen, say) longer than an approval lives.
    Effect.objects.filter(pk=effect["effect_id"]).update(
        approved_at=timezone.now() - timedelta(seconds=settings.GATEWAY_APPROVAL_TTL + 5)
    )
    late = dispatch(effect["effect_id"])
    assert late.status == "AWAITING_APPROVAL"
    assert late.approval_state == "expired"
    assert sandbox.log() == []
    again = approver.client.post(
        f"/api/v1/effects/{effect['effect_id']}/approve",
        {"payload_digest": effect["payload_digest"]},
        format="json",
    )
    assert again.status_code == 200
    assert dispatch(effect["effect_id"]).status == "CONFIRMED"
    assert len(sandbox.operations()) == 1


def test_a_new_plan_revision_is_a_new_command_needing_its_own_approval(agent, approver, sandbox):
    first = agent.submit({**BIG_REFUND, "intent": {"plan_revision": 1}}, "refund:ord_881:v1")
    approver.client.post(
        f"/api/v1/effects/{first.json()['effect_id']}/approve",
        {"payload_digest": first.json()["payload_digest"]},
        format="json",
    )
    revised = {
        **BIG_REFUND,
        "payload": {**BIG_REFUND["payload"], "amount": 60_000},
        "intent": {"plan_revision": 2},
    }
    second = agent.submit(revised, "refund:ord_881:v2")
    assert second.status_code == 201
    assert second.json()["status"] == "AWAITING_APPROVAL"
    assert second.json()["approval"]["state"] == "pending"


# --- capabilities ---------------------------------------------------------------------------


@pytest.fixture
def scoped_agent(db) -> Persona:
    from tests.conftest import issue_token

    issue_token("acme", "ticket-bot", "agent")
    Capability.objects.filter(principal__name="ticket-bot").delete()
    persona = Persona("acme", "ticket-bot", "agent")
    Capability.objects.filter(principal=persona.principal).delete()
    return persona


def grant(persona: Persona, **kwargs) -> Capability:
    from gateway.capabilities import capability_grant

    return capability_grant(granted_by="test", principal=persona.principal, **kwargs)


TICKET = {
    "type": "ticket.create",
    "resource": {"type": "queue", "id": "support"},
    "payload": {"title": "x", "priority": "P3"},
}


def test_an_agent_without_a_grant_is_refused(scoped_agent):
    response = scoped_agent.submit(TICKET, "t1")
    assert response.status_code == 403
    assert "capability" in response.json()["detail"]
    assert Command.objects.count() == 0


def test_grants_are_scoped_by_type_and_resource(scoped_agent):
    grant(scoped_agent, effect_types=["ticket.*"], resource_selector="queue:support")
    assert scoped_agent.submit(TICKET, "t1").status_code == 201
    other_queue = {**TICKET, "resource": {"type": "queue", "id": "billing"}}
    assert scoped_agent.submit(other_queue, "t2").status_code == 403
    assert scoped_agent.submit(BIG_REFUND, "r1").status_code == 403


def test_an_unlimited_grant_reserves_nothing(scoped_agent):
    cap = grant(scoped_agent, effect_types=["ticket.*"])
    assert scoped_agent.submit(TICKET, "t1").status_code == 201
    assert scoped_agent.submit(TICKET, "t2").status_code == 201
    cap.refresh_from_db()
    assert (cap.spent_count, cap.spent_amount) == (0, 0)
    assert Command.objects.filter(capability=cap).count() == 2


def test_a_count_budget_is_spent_and_then_refused(scoped_agent):
    cap = grant(scoped_agent, effect_types=["ticket.create"], budget_count=2)
    assert scoped_agent.submit(TICKET, "t1").status_code == 201
    assert scoped_agent.submit(TICKET, "t1").status_code == 200  # a replay spends nothing
    assert scoped_agent.submit(TICKET, "t2").status_code == 201
    refused = scoped_agent.submit(TICKET, "t3")
    assert refused.status_code == 403 and "budget" in refused.json()["detail"]
    cap.refresh_from_db()
    assert cap.spent_count == 2


def test_an_amount_budget_counts_the_payload_amount(scoped_agent):
    cap = grant(
        scoped_agent,
        effect_types=["billing.refund.create"],
        budget_amount=1000,
        budget_currency="EUR",
    )
    small = {**BIG_REFUND, "payload": {**BIG_REFUND["payload"], "amount": 600}}
    assert scoped_agent.submit(small, "r1").status_code == 201
    assert scoped_agent.submit(small, "r2").status_code == 403
    cap.refresh_from_db()
    assert cap.spent_amount == 600


def test_a_grant_revoked_between_approval_and_dispatch_stops_it(
    scoped_agent, approver, operator, sandbox
):
    cap = grant(
        scoped_agent, effect_types=["billing.*"], budget_amount=100_000, budget_currency="EUR"
    )
    effect = scoped_agent.submit(BIG_REFUND, "big").json()
    approver.client.post(
        f"/api/v1/effects/{effect['effect_id']}/approve",
        {"payload_digest": effect["payload_digest"]},
        format="json",
    )
    revoked = operator.client.post(
        f"/api/v1/capabilities/{cap.pk}/revoke", {"reason": "agent misbehaving"}, format="json"
    )
    assert revoked.status_code == 200
    stopped = dispatch(effect["effect_id"])
    assert stopped.status == "REJECTED"  # never sent, so never UNKNOWN
    assert sandbox.log() == []
    assert (
        EffectEvent.objects.filter(effect_id=effect["effect_id"], kind="authorisation_lost").count()
        == 1
    )
    cap.refresh_from_db()
    assert (cap.spent_count, cap.spent_amount) == (0, 0)  # the reservation came back


def test_an_expired_grant_stops_dispatch(scoped_agent, sandbox):
    cap = grant(scoped_agent, effect_types=["ticket.*"])
    effect_id = scoped_agent.submit(TICKET, "t1").json()["effect_id"]
    Capability.objects.filter(pk=cap.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert dispatch(effect_id).status == "REJECTED"
    assert sandbox.log() == []


def test_a_frozen_effect_type_waits_and_goes_after_unfreeze(agent, operator, sandbox):
    url = "/api/v1/effect-types/ticket.create"
    assert agent.client.post(f"{url}/freeze").status_code == 403
    assert (
        operator.client.post(
            f"{url}/freeze", {"reason": "provider incident"}, format="json"
        ).json()["frozen"]
        is True
    )
    effect_id = agent.submit(TICKET, "t1").json()["effect_id"]
    assert dispatch(effect_id).status == "PREPARED"
    assert sandbox.log() == []
    operator.client.post(f"{url}/unfreeze")
    assert dispatch(effect_id).status == "CONFIRMED"


def test_a_frozen_principal_dispatches_nothing(agent, operator, sandbox):
    effect_id = agent.submit(TICKET, "t1").json()["effect_id"]
    frozen = operator.client.post("/api/v1/principals/refund-bot/freeze")
    assert frozen.json() == {"principal": "refund-bot", "frozen": True}
    assert dispatch(effect_id).status == "PREPARED"
    assert agent.submit(TICKET, "t2").status_code == 403
    operator.client.post("/api/v1/principals/refund-bot/unfreeze")
    assert dispatch(effect_id).status == "CONFIRMED"


def test_only_admins_grant(operator, admin):
    body = {"principal": "refund-bot", "effect_types": ["ticket.*"], "budget_count": 3}
    Persona("acme", "refund-bot", "agent")
    assert operator.client.post("/api/v1/capabilities", body, format="json").status_code == 403
    created = admin.client.post("/api/v1/capabilities", body, format="json")
    assert created.status_code == 201
    assert created.json()["budget_count"] == 3


REFUND_1000 = {**BIG_REFUND, "payload": {**BIG_REFUND["payload"], "amount": 1_000}}


def refund_grant(persona: Persona, *, amount: int, count: int) -> Capability:
    return grant(
        persona,
        effect_types=["billing.refund.create"],
        budget_amount=amount,
        budget_currency="EUR",
        budget_count=count,
    )


@pytest.mark.django_db(transaction=True)
def test_concurrent_submissions_never_overspend_a_budget(scoped_agent):
    from tests.gateway.test_concurrency import run_in_threads

    cap = refund_grant(scoped_agent, amount=5_000, count=100)
    codes = run_in_threads(20, lambda i: scoped_agent.submit(REFUND_1000, f"r{i}").status_code)
    assert sorted(codes) == [201] * 5 + [403] * 15
    cap.refresh_from_db()
    assert (cap.spent_count, cap.spent_amount) == (5, 5_000)
    assert Command.objects.count() == 5


@pytest.mark.django_db(transaction=True)
def test_racing_submissions_of_one_key_reserve_the_budget_once(scoped_agent, sandbox):
    """Twenty threads send the same first submission under a budget: one reservation, one
    effect, one operation at the provider. A loser's statement either sees the winner's key
    (and reserves nothing) or races it (its insert fails, and takes its reservation with it:
    the next test makes that happen)."""
    from tests.gateway.test_concurrency import run_in_threads

    cap = refund_grant(scoped_agent, amount=10_000, count=10)
    answers = run_in_threads(20, lambda i: scoped_agent.submit(REFUND_1000, "one-key"))
    codes = sorted(answer.status_code for answer in answers)
    assert codes == [200] * 19 + [201], [a.json() for a in answers if a.status_code >= 400]
    assert len({answer.json()["effect_id"] for answer in answers}) == 1
    cap.refresh_from_db()
    assert (cap.spent_count, cap.spent_amount) == (1, 1_000)
    command = Command.objects.get()
    assert (command.capability_id, command.budget_amount) == (cap.pk, 1_000)
    dispatch(command.effect_id)  # here, not in the racing threads: connections stay few
    assert len(sandbox.operations(idempotency_key=command.provider_key)) == 1
    assert len(sandbox.operations()) == 1


@pytest.mark.django_db(transaction=True)
def test_a_key_committed_while_the_reservation_waits_undoes_the_reservation(scoped_agent, agent):
    """The reserving statement's race, made to happen: its snapshot sees no command for the
    key, it waits on the grant's row (locked here), and meanwhile another agent of the
    tenant commits that key. The statement's insert then fails on the key's unique index,
    which takes its reservation with it; the answer is the replay of the other's effect."""
    import threading

    import psycopg
    from django.conf import settings as django_settings

    cap = grant(scoped_agent, effect_types=["ticket.create"], budget_count=5)
    dsn = django_settings.DATABASES["default"]
    holder = psycopg.connect(
        host=dsn["HOST"], port=dsn["PORT"], user=dsn["USER"], dbname=dsn["NAME"]
    )
    holder.execute("SELECT 1 FROM gateway_capability WHERE id = %s FOR UPDATE", [cap.pk])
    answer = {}

    def submit_contested() -> None:
        try:
            answer["response"] = scoped_agent.submit(TICKET, "contested")
        finally:
            connection.close()  # this thread's own

    submitting = threading.Thread(target=submit_contested)
    submitting.start()
    try:
        waiting = 0
        for _ in range(200):  # until the statement waits on the grant's row
            with connection.cursor() as cursor:
                cursor.execute(
                    # The text is cut at track_activity_query_size: its start names it.
                    # This database only: the other xdist worker's tests run the same
                    # statement in theirs, and their waits would count here.
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database() AND query LIKE 'WITH existing AS%%'"
                )
                waiting = cursor.fetchone()[0]
            if waiting:
                break
            time.sleep(0.02)
        assert waiting == 1
        first = agent.submit(TICKET, "contested")  # an unlimited grant: no wait
        assert first.status_code == 201
    finally:
        holder.commit()
        holder.close()
        submitting.join(10)
    response = answer["response"]
    assert response.status_code == 200, response.json()
    assert response.json()["effect_id"] == first.json()["effect_id"]
    cap.refresh_from_db()
    assert cap.spent_count == 0
    assert Command.objects.filter(idempotency_key="contested").count() == 1


def test_a_budgeted_submission_is_one_statement(scoped_agent, settings):
    """The reservation is folded into the submission statement: a budgeted agent's command
    costs what an unlimited one costs, and a replay reserves nothing."""
    from django.test.utils import CaptureQueriesContext

    settings.GATEWAY_TOKEN_CACHE_TTL = 5
    cap = grant(scoped_agent, effect_types=["ticket.create"], budget_count=3)
    assert scoped_agent.submit(TICKET, "warm").status_code == 201  # the token and grants cached
    with CaptureQueriesContext(connection) as statements:
        assert scoped_agent.submit(TICKET, "counted").status_code == 201
    writes = [q["sql"] for q in statements.captured_queries if "SAVEPOINT" not in q["sql"]]
    assert len(writes) == 1 and "UPDATE gateway_capability" in writes[0], writes
    with CaptureQueriesContext(connection) as statements:
        assert scoped_agent.submit(TICKET, "counted").status_code == 200
    assert len([q for q in statements.captured_queries if "SAVEPOINT" not in q["sql"]]) == 1
    cap.refresh_from_db()
    assert cap.spent_count == 2
    assert scoped_agent.submit(TICKET, "third").status_code == 201
    refused = scoped_agent.submit(TICKET, "fourth")  # spent: the general path says so
    assert refused.status_code == 403 and "budget" in refused.json()["detail"]
    cap.refresh_from_db()
    assert cap.spent_count == 3


def test_a_cancelled_command_gives_back_what_its_statement_reserved(scoped_agent):
    """The reservation written by the submission statement is the one the release reads: the
    use and the amount come back when the command ends unsent."""
    cap = refund_grant(scoped_agent, amount=5_000, count=3)
    small = {**REFUND_1000, "payload": {**REFUND_1000["payload"], "amount": 700}}
    effect = scoped_agent.submit(small, "to-cancel").json()
    assert effect["status"] == "PREPARED"  # no approval for 7 EUR: the one-statement path
    cap.refresh_from_db()
    assert (cap.spent_count, cap.spent_amount) == (1, 700)
    cancelled = scoped_agent.client.post(f"/api/v1/effects/{effect['effect_id']}/cancel")
    assert cancelled.status_code == 200, cancelled.json()
    cap.refresh_from_db()
    assert (cap.spent_count, cap.spent_amount) == (0, 0)


def test_a_spent_grant_falls_through_to_the_next_one(scoped_agent):
    """As capability_reserve always did: a spent budget is not the end while another grant
    matches."""
    first = grant(scoped_agent, effect_types=["ticket.create"], budget_count=1)
    second = grant(scoped_agent, effect_types=["ticket.*"], budget_count=5)
    assert scoped_agent.submit(TICKET, "a").status_code == 201
    assert scoped_agent.submit(TICKET, "b").status_code == 201
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.spent_count, second.spent_count) == (1, 1)
    assert Command.objects.get(idempotency_key="b").capability_id == second.pk


def test_a_grant_in_another_currency_is_passed_over(scoped_agent):
    usd = grant(
        scoped_agent, effect_types=["billing.*"], budget_amount=100_000, budget_currency="USD"
    )
    eur = grant(
        scoped_agent, effect_types=["billing.*"], budget_amount=5_000, budget_currency="EUR"
    )
    assert scoped_agent.submit(REFUND_1000, "eur").status_code == 201
    usd.refresh_from_db()
    eur.refresh_from_db()
    assert (usd.spent_amount, eur.spent_amount) == (0, 1_000)


# --- personal data ----------------------------------------------------------------------------

EMAIL = {"type": "email.message.send", **CONTRACTS["email.message.send"].example}


def test_personal_fields_are_unreadable_in_the_database_and_absent_from_logs(
    agent, sandbox, caplog
):
    caplog.set_level(logging.DEBUG)
    effect_id = agent.submit(EMAIL, "mail-1").json()["effect_id"]
    dispatch(effect_id)
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM gateway_command WHERE effect_id = %s", [effect_id])
        row = " ".join(str(value) for value in cursor.fetchone())
    assert "ada@example.com" not in row
    assert "Your order ord_881 is on its way" not in row
    logged = " ".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert effect_id in logged
    assert "ada@example.com" not in logged
    assert sandbox.operations()[0]["payload"]["to"] == "ada@example.com"


def test_vault_key_rotation_reseals_every_payload(agent, settings):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.GATEWAY_VAULT_KEY = old
    vault._fernet.cache_clear()
    try:
        effect_id = agent.submit(EMAIL, "mail-1").json()["effect_id"]
        before = Command.objects.get(pk=effect_id).payload_sealed
        settings.GATEWAY_VAULT_KEY = f"{new},{old}"
        vault._fernet.cache_clear()
        call_command("rotate_vault_key", stdout=open("/dev/null", "w"))  # noqa: SIM115
        settings.GATEWAY_VAULT_KEY = new  # the old key is gone
        vault._fernet.cache_clear()
        command = Command.objects.get(pk=effect_id)
        assert command.payload_sealed != before
        assert services.command_payload(command)["to"] == "ada@example.com"
    finally:
        vault._fernet.cache_clear()


# --- the audit trail --------------------------------------------------------------------------


def test_the_chain_verifies_and_a_forged_event_is_reported(agent, sandbox, capsys):
    effect_id = agent.submit(TICKET, "t1").json()["effect_id"]
    dispatch(effect_id)
    call_command("verify_audit")
    assert "acme: chain intact" in capsys.readouterr().out
    forged = EffectEvent.objects.filter(effect_id=effect_id, kind="dispatched").get()
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")  # triggers off
        cursor.execute(
            "UPDATE gateway_effectevent SET to_status = 'REJECTED' WHERE id = %s", [forged.pk]
        )
        cursor.execute("SET session_replication_role = DEFAULT")
    with pytest.raises(CommandError):
        call_command("verify_audit")
    out = capsys.readouterr().out
    assert f"BROKEN at event {forged.pk}" in out
    assert "altered" in out


def test_removing_the_last_event_is_reported(agent, sandbox, capsys):
    effect_id = agent.submit(TICKET, "t1").json()["effect_id"]
    dispatch(effect_id)
    # Sealed first: until the sequencer seals it, an event is guarded by the trigger alone
    # (docs/concepts/audit.md, "Sealed after commit").
    audit.seal_pending()
    last = EffectEvent.objects.filter(effect_id=effect_id).order_by("-id").first()
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        cursor.execute("DELETE FROM gateway_effectevent WHERE id = %s", [last.pk])
        cursor.execute("SET session_replication_role = DEFAULT")
    with pytest.raises(CommandError):
        call_command("verify_audit")
    assert "removed from the end" in capsys.readouterr().out


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE gateway_effectevent SET reason = 'nothing happened'",
        "DELETE FROM gateway_effectevent",
        "UPDATE gateway_receipt SET provider_status = 'failed'",
        "DELETE FROM gateway_receipt",
        "UPDATE gateway_command SET payload_digest = 'sha256:00'",
        "DELETE FROM gateway_command",
    ],
)
def test_the_database_refuses_to_rewrite_history(agent, sandbox, statement):
    dispatch(agent.submit(TICKET, "t1").json()["effect_id"])
    events = EffectEvent.objects.count()
    with (
        pytest.raises(DatabaseError, match=r"append-only|frozen"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(statement)
    assert EffectEvent.objects.count() == events


# --- the usual ----------------------------------------------------------------------------------


def test_tokens_are_stored_only_as_hashes(agent):
    rows = list(ApiToken.objects.values_list("prefix", "token_hash"))
    assert rows and all(agent.token not in value for row in rows for value in row)
    assert any(agent.token.startswith(prefix) for prefix, _ in rows)


def test_a_token_over_its_rate_gets_429(agent, settings):
    from django.core.cache import cache
    from rest_framework.throttling import SimpleRateThrottle

    cache.clear()
    rates = {**SimpleRateThrottle.THROTTLE_RATES, "token": "3/min"}
    original = SimpleRateThrottle.THROTTLE_RATES
    SimpleRateThrottle.THROTTLE_RATES = rates
    try:
        codes = [agent.client.get("/api/v1/effects").status_code for _ in range(4)]
        assert codes == [200, 200, 200, 429]
        limited = agent.client.get("/api/v1/effects")
        assert limited.headers["Content-Type"] == "application/problem+json"
        assert int(limited.headers["Retry-After"]) > 0
    finally:
        SimpleRateThrottle.THROTTLE_RATES = original
        cache.clear()


def test_a_rate_log_written_before_the_compact_one_still_counts(agent):
    """The log was a list before it became an array (gateway.api.auth): a web node upgraded
    while the shared cache holds lists reads them, and the rate holds across the change."""
    import time

    from django.core.cache import cache
    from rest_framework.throttling import SimpleRateThrottle

    from gateway.api.auth import TokenRateThrottle

    cache.clear()
    rates = {**SimpleRateThrottle.THROTTLE_RATES, "token": "3/min"}
    original = SimpleRateThrottle.THROTTLE_RATES
    SimpleRateThrottle.THROTTLE_RATES = rates
    try:
        token = ApiToken.objects.get(principal=agent.principal)
        key = TokenRateThrottle.cache_format % {"scope": "token", "ident": f"token:{token.pk}"}
        cache.set(key, [time.time() - 1, time.time() - 2], 60)
        assert agent.client.get("/api/v1/effects").status_code == 200
        assert agent.client.get("/api/v1/effects").status_code == 429
    finally:
        SimpleRateThrottle.THROTTLE_RATES = original
        cache.clear()


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_the_rate_is_a_burst_of_n_then_one_per_period_over_n(agent, monkeypatch):
    """GCRA (gateway.api.auth.TokenRateThrottle): 3/min lets 3 in at once, then one every
    20 s, and says in Retry-After how long until the next; the state is one number."""
    from types import SimpleNamespace

    from django.core.cache import cache
    from rest_framework.throttling import SimpleRateThrottle

    from gateway.api.auth import TokenRateThrottle

    cache.clear()
    monkeypatch.setattr(
        SimpleRateThrottle,
        "THROTTLE_RATES",
        {**SimpleRateThrottle.THROTTLE_RATES, "token": "3/min"},
    )
    clock = _Clock()
    monkeypatch.setattr(TokenRateThrottle, "timer", clock)
    token = ApiToken.objects.get(principal=agent.principal)
    request = SimpleNamespace(auth=token, user=None)

    def ask() -> tuple[bool, float | None]:
        throttle = TokenRateThrottle()
        allowed = throttle.allow_request(request, None)
        return allowed, None if allowed else throttle.wait()

    try:
        assert [ask()[0] for _ in range(3)] == [True, True, True]
        allowed, wait = ask()
        assert not allowed and wait == pytest.approx(20)
        clock.now += 19
        allowed, wait = ask()
        assert not allowed and wait == pytest.approx(1)
        clock.now += 1
        assert ask() == (True, None)
        assert not ask()[0]  # one per 20 s from here
        clock.now += 60  # at rest again: a whole burst
        assert [ask()[0] for _ in range(4)] == [True, True, True, False]
        key = TokenRateThrottle.tat_format % {"scope": "token", "ident": f"token:{token.pk}"}
        assert isinstance(cache.get(key), float)
    finally:
        cache.clear()


def test_security_headers(agent):
    response = agent.client.get("/api/v1/effects")
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["Referrer-Policy"] == "same-origin"


def test_grants_revocations_and_freezes_are_chained_audit_events(agent, operator, admin, capsys):
    granted = admin.client.post(
        "/api/v1/capabilities",
        {"principal": "refund-bot", "effect_types": ["ticket.*"]},
        format="json",
    ).json()
    operator.client.post(
        f"/api/v1/capabilities/{granted['id']}/revoke", {"reason": "rotated"}, format="json"
    )
    operator.client.post(
        "/api/v1/effect-types/ticket.create/freeze", {"reason": "incident"}, format="json"
    )
    operator.client.post(
        "/api/v1/effect-types/ticket.create/unfreeze", {"reason": "fixed"}, format="json"
    )
    operator.client.post(
        "/api/v1/principals/refund-bot/freeze", {"reason": "looping"}, format="json"
    )
    controls = list(
        EffectEvent.objects.filter(effect__isnull=True)
        .order_by("id")
        .values_list("kind", "subject", "actor", "reason")
    )
    kinds = [kind for kind, *_ in controls]
    # The first grant is issue_token's (agent fixture); then the admin's grant and the rest.
    assert kinds[-5:] == [
        "capability_granted",
        "capability_revoked",
        "type_frozen",
        "type_unfrozen",
        "principal_frozen",
    ]
    assert ("capability_revoked", f"capability:{granted['id']}", "operator:oscar", "rotated") in (
        controls
    )
    assert ("principal_frozen", "principal:refund-bot", "operator:oscar", "looping") in controls
    call_command("verify_audit")
    assert "acme: chain intact" in capsys.readouterr().out


@pytest.mark.django_db(transaction=True)
def test_an_event_appended_outside_a_transaction_is_chained(agent, capsys):
    from gateway import ledger

    effect = Effect.objects.get(pk=agent.submit(TICKET, "t1").json()["effect_id"])
    # No transaction is open here (autocommit): the append makes its own.
    ledger.append_event(effect, kind="note", actor="test", reason="outside any transaction")
    assert EffectEvent.objects.filter(effect=effect, kind="note").count() == 1
    call_command("verify_audit")
    assert "acme: chain intact" in capsys.readouterr().out


def test_pages_carry_a_strict_content_security_policy(client, agent):
    policy = client.get("/login").headers.get("Content-Security-Policy", "")
    assert "script-src 'self'" in policy
    assert "unsafe-eval" not in policy and "unsafe-inline" not in policy
    assert "frame-ancestors 'none'" in policy
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    assert "<script>" not in docs.content.decode()  # the split view serves its script as a file


@pytest.mark.parametrize(
    ("lease", "timeout", "starts"), [("15", "10", False), ("20", "10", False), ("21", "10", True)]
)
def test_a_lease_shorter_than_a_dispatch_is_refused_at_start(lease, timeout, starts):
    import subprocess
    import sys

    env = {
        **__import__("os").environ,
        "GATEWAY_DISPATCH_LEASE": lease,
        "GATEWAY_PROVIDER_TIMEOUT": timeout,
        "DJANGO_SETTINGS_MODULE": "gateway.settings",
    }
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (result.returncode == 0) is starts, result.stderr[-500:]
    if not starts:
        assert "must be longer than twice" in result.stderr
