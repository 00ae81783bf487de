"""The fast path (gateway.fastpath, gateway.fastpath_batch) writes what the ORM path
(gateway.services) writes: the same commands through both, every row of every table, every
log line and every answer compared (tests/support/parity.py says how). Each scenario also
checks that the fast run really took the statements it is about, so that a parity is never
two runs of the ORM path."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection

from gateway import capabilities, dispatcher, fastpath, fastpath_batch, services
from gateway.models import Capability, Command, Effect, Principal
from gateway.webhooks.services import endpoint_create
from tests.conftest import REFUND, TICKET
from tests.support.parity import differences, run_both

pytestmark = pytest.mark.django_db

STATEMENTS = {
    fastpath._SUBMIT_OR_EXISTING: "submit",
    fastpath._SUBMIT_RESERVING_OR_EXISTING: "submit reserving",
    fastpath._REPLAY: "replay",
    fastpath._CLAIM: "claim",
    fastpath._RECORD: "record",
    fastpath_batch._CLAIM_BATCH: "claim batch",
    fastpath_batch._RECORD_BATCH: "record batch",
}


@pytest.fixture
def parity(settings, sandbox):
    """``parity(scenario)``: the scenario through both paths; fails on any difference.
    Returns the names of the fast-path statements the fast run executed."""

    def check(scenario) -> list[str]:
        ran: list[str] = []

        def watch(execute, sql, params, many, context):
            if settings.GATEWAY_FAST_PATH and sql in STATEMENTS:
                ran.append(STATEMENTS[sql])
            return execute(sql, params, many, context)

        with connection.execute_wrapper(watch):
            orm, fast = run_both(scenario, settings=settings, sandbox=sandbox)
        problems = differences(orm, fast)
        assert not problems, "\n".join(problems)
        assert orm.logs or orm.rows, "the scenario did nothing"
        return ran

    return check


def submit(principal, body: dict, key: str, **extra) -> tuple:
    """Submit as a request does: with the principal as it is now."""
    submission = services.command_submit(
        principal=Principal.objects.select_related("tenant").get(pk=principal.pk),
        idempotency_key=key,
        type=body["type"],
        resource=body["resource"],
        payload=body["payload"],
        intent=body.get("intent"),
        context=body.get("context"),
        expires_in=body.get("expires_in"),
        **extra,
    )
    return submission.effect.pk, submission.effect.status, submission.created


def dispatch(effect_id: str) -> tuple:
    sent = services.effect_dispatch(effect_id=effect_id, worker="parity")
    return sent, Effect.objects.get(pk=effect_id).status


def refund(amount: int = 500, reason: str = "duplicate charge") -> dict:
    return {**REFUND, "payload": {**REFUND["payload"], "amount": amount, "reason": reason}}


def ticket(title: str) -> dict:
    return {**TICKET, "payload": {**TICKET["payload"], "title": title}}


def budgeted(agent, **budget) -> Capability:
    """The agent's only grant: one with a budget."""
    Capability.objects.filter(principal=agent.principal).delete()
    return capabilities.capability_grant(
        granted_by="test", principal=agent.principal, effect_types=["*"], **budget
    )


# --- submission -------------------------------------------------------------------------------


def test_a_submission_writes_the_same_rows(parity, agent):
    ran = parity(lambda clock: submit(agent.principal, ticket("a"), "k1"))
    assert ran == ["submit"]


def test_a_submission_with_an_expiry_and_context(parity, agent):
    body = {**ticket("b"), "expires_in": 120, "context": {"run_id": "r1"}}
    assert parity(lambda clock: submit(agent.principal, body, "k1")) == ["submit"]


def test_a_submission_that_reserves_a_budget(parity, agent):
    budgeted(agent, budget_count=3, budget_amount=10_000, budget_currency="EUR")
    assert parity(lambda clock: submit(agent.principal, refund(), "k1")) == ["submit reserving"]


def test_a_replay_and_a_known_key(parity, agent):
    def scenario(clock):
        first = submit(agent.principal, ticket("c"), "k1")
        again = submit(agent.principal, ticket("c"), "k1")  # this process knows the key
        fastpath.known_keys.clear()
        once_more = submit(agent.principal, ticket("c"), "k1")  # a key it does not know
        return first, again, once_more

    assert parity(scenario) == ["submit", "replay", "submit"]


def test_a_replay_with_another_payload_is_refused_alike(parity, agent):
    def scenario(clock):
        submit(agent.principal, ticket("d"), "k1")
        return submit(agent.principal, ticket("other"), "k1")

    assert parity(scenario) == ["submit", "replay"]


def test_a_spent_budget_falls_back_and_refuses_alike(parity, agent):
    budgeted(agent, budget_count=1)

    def scenario(clock):
        submit(agent.principal, ticket("e"), "k1")
        return submit(agent.principal, ticket("f"), "k2")

    assert parity(scenario) == ["submit reserving", "submit reserving"]


def test_an_amount_over_the_budget_falls_back_alike(parity, agent):
    budgeted(agent, budget_amount=100, budget_currency="EUR")
    assert parity(lambda clock: submit(agent.principal, refund(amount=500), "k1")) == [
        "submit reserving"
    ]


def test_a_command_waiting_for_approval_is_written_the_general_way(parity, agent):
    assert parity(lambda clock: submit(agent.principal, refund(amount=50_000), "k1")) == []


def test_an_operators_submission_under_a_grant(parity, operator):
    from gateway.capabilities import capability_grant

    capability_grant(granted_by="test", principal=operator.principal, effect_types=["ticket.*"])
    assert parity(lambda clock: submit(operator.principal, ticket("g"), "k1")) == ["submit"]


def test_an_operators_submission_without_a_grant_waits_the_general_way(parity, operator):
    # A person with no grant waits for an approver: the general path writes it.
    assert parity(lambda clock: submit(operator.principal, ticket("g2"), "k1")) == []


def test_a_compensation_and_a_saga_step_are_written_the_general_way(parity, operator):
    def scenario(clock):
        return submit(operator.principal, ticket("h"), "k1", saga_id="saga_x", saga_step="one")

    assert parity(scenario) == []


# --- claim and record -------------------------------------------------------------------------


def test_a_confirmed_dispatch(parity, agent):
    def scenario(clock):
        effect_id, *_ = submit(agent.principal, ticket("i"), "k1")
        return dispatch(effect_id)

    assert parity(scenario) == ["submit", "claim", "record"]


def test_a_dispatch_that_needs_a_retry_then_confirms(parity, agent, sandbox):
    def scenario(clock):
        sandbox.add_fault("fail_before_commit", times=1)
        effect_id, *_ = submit(agent.principal, ticket("j"), "k1")
        first = dispatch(effect_id)
        clock.advance(600)  # past its backoff
        return first, dispatch(effect_id)

    assert parity(scenario) == ["submit", "claim", "record", "claim", "record"]


@pytest.mark.parametrize(
    ("fault", "params"),
    [
        ("commit_then_drop", {}),
        ("reject", {}),
        ("processing", {}),
        ("digest_mismatch", {}),
        ("fail", {}),
    ],
)
def test_each_answer_of_the_provider(parity, agent, sandbox, fault, params):
    def scenario(clock):
        sandbox.add_fault(fault, times=1, **params)
        effect_id, *_ = submit(agent.principal, ticket("k"), "k1")
        return dispatch(effect_id)

    assert parity(scenario) == ["submit", "claim", "record"]


def test_a_provider_error_settled_by_a_lookup(parity, agent, sandbox, settings):
    def scenario(clock):
        sandbox.add_fault("slow", times=1, seconds=1.0)
        effect_id, *_ = submit(agent.principal, ticket("l"), "k1")
        return dispatch(effect_id)

    settings.GATEWAY_PROVIDER_TIMEOUT = 0.3
    assert parity(scenario) == ["submit", "claim", "record"]


def test_an_approved_command(parity, agent, approver):
    def scenario(clock):
        effect_id, *_ = submit(agent.principal, refund(amount=50_000), "k1")
        effect = Effect.objects.select_related("command").get(pk=effect_id)
        services.effect_approve(
            effect=effect,
            principal=approver.principal,
            payload_digest=effect.command.payload_digest,
        )
        return dispatch(effect_id)

    assert parity(scenario) == ["claim", "record"]


# --- every branch where the fast claim leaves the decision to the general path -----------------


def submitted(agent, title: str = "m") -> str:
    effect_id, *_ = submit(agent.principal, ticket(title), "k1")
    return effect_id


def test_an_expired_command_is_expired_alike(parity, agent):
    def scenario(clock):
        effect_id = submitted(agent)
        clock.advance(3601)  # the default expiry
        return dispatch(effect_id)

    assert parity(scenario) == ["submit", "claim"]


def test_a_frozen_principal_holds_alike(parity, agent, operator):
    def scenario(clock):
        effect_id = submitted(agent)
        capabilities.principal_set_frozen(
            target=Principal.objects.get(pk=agent.principal.pk),
            principal=operator.principal,
            frozen=True,
        )
        return dispatch(effect_id)

    assert parity(scenario) == ["submit", "claim"]


def test_a_frozen_type_holds_alike(parity, agent, operator):
    def scenario(clock):
        effect_id = submitted(agent)
        capabilities.effect_type_set_frozen(
            tenant_id=agent.principal.tenant_id,
            effect_type=TICKET["type"],
            principal=operator.principal,
            frozen=True,
        )
        return dispatch(effect_id)

    assert parity(scenario) == ["submit", "claim"]


def test_a_frozen_effect_holds_alike(parity, agent, operator):
    def scenario(clock):
        effect_id = submitted(agent)
        services.effect_set_frozen(
            effect=Effect.objects.select_related("command").get(pk=effect_id),
            principal=operator.principal,
            frozen=True,
        )
        return dispatch(effect_id)

    assert parity(scenario) == ["submit", "claim"]


def test_a_revoked_grant_rejects_alike(parity, agent, operator):
    def scenario(clock):
        effect_id = submitted(agent)
        for grant in Capability.objects.filter(principal=agent.principal):
            capabilities.capability_revoke(
                capability=grant, principal=operator.principal, reason="gone"
            )
        return dispatch(effect_id)

    assert parity(scenario) == ["submit", "claim"]


def test_a_stale_approval_is_asked_again_alike(parity, agent, approver, settings):
    def scenario(clock):
        effect_id, *_ = submit(agent.principal, refund(amount=50_000), "k1")
        effect = Effect.objects.select_related("command").get(pk=effect_id)
        services.effect_approve(
            effect=effect,
            principal=approver.principal,
            payload_digest=effect.command.payload_digest,
        )
        clock.advance(settings.GATEWAY_APPROVAL_TTL + 1)
        return dispatch(effect_id)

    assert parity(scenario) == ["claim"]


def test_a_spent_attempt_budget_escalates_alike(parity, agent, sandbox):
    def scenario(clock):
        effect_id = submitted(agent)
        results = []
        for _ in range(12):  # more than any contract's attempt budget
            sandbox.add_fault("fail_before_commit", times=1)
            clock.advance(600)
            results.append(dispatch(effect_id))
        return results

    ran = parity(scenario)
    assert ran.count("record") >= 2 and ran[-1] == "claim", ran


@pytest.mark.xfail(
    strict=True,
    reason="the fast claim cannot open a sealed payload in SQL: it claims, then refuses "
    "(DISPATCHING -> NOT_STARTED, an attempt), where the ORM path refuses before claiming "
    "(PREPARED, no attempt); both freeze the effect and send nothing",
)
def test_a_tampered_payload_is_refused_alike(parity, agent):
    """Another command's sealed payload copied onto this one's (the only column of a command
    the database lets change): bound to another effect, it does not open."""

    def scenario(clock):
        effect_id = submitted(agent)
        other, *_ = submit(agent.principal, ticket("other"), "k2")
        sealed = Command.objects.get(pk=other).payload_sealed
        Command.objects.filter(pk=effect_id).update(payload_sealed=sealed)
        return dispatch(effect_id)

    assert parity(scenario) == ["submit", "submit", "claim"]


# --- every branch where the fast record leaves the writes to the general path ------------------


def test_a_stale_claim_is_refused_alike(parity, agent, monkeypatch):
    """Between the call and the record another actor moves the fence (lease recovery)."""
    from django.db.models import F

    def moved(effect_type, result, seconds, send_as):
        Effect.objects.update(fence=F("fence") + 1)

    monkeypatch.setattr(services, "_observe_dispatch", moved)
    assert parity(lambda clock: dispatch(submitted(agent))) == ["submit", "claim", "record"]


def test_a_tenant_with_a_webhook_endpoint_is_recorded_with_its_outbox_alike(
    parity, agent, operator
):
    def scenario(clock):
        endpoint_create(principal=operator.principal, url="http://127.0.0.1:9/hooks")
        return dispatch(submitted(agent))

    assert parity(scenario) == ["submit", "claim", "record"]


def test_a_compensation_is_recorded_the_general_way_alike(parity, agent, operator):
    def scenario(clock):
        effect_id = submitted(agent)
        dispatch(effect_id)
        compensation = services.effect_compensate(
            effect=Effect.objects.select_related("command").get(pk=effect_id),
            principal=operator.principal,
            reason="undo",
        )
        return dispatch(compensation.effect.pk), Effect.objects.get(pk=effect_id).status

    assert parity(scenario) == ["submit", "claim", "record", "claim", "record"]


# --- the drainer's batch claim and batch record ------------------------------------------------


@pytest.fixture
def full_window(settings):
    _, window = dispatcher._process_state()
    previous, window.size = window.size, settings.GATEWAY_DISPATCH_BATCH
    yield window
    window.size = previous


def test_a_drain_writes_what_one_by_one_dispatch_writes(
    parity, agent, operator, approver, sandbox, full_window, settings
):
    """Plain effects, an answer that needs a retry, a refusal the general path decides (a
    stale approval), an effect of a frozen type the drain leaves alone, and a compensation
    (claimed in the batch, recorded the general way)."""

    def scenario(clock):
        ids = [submit(agent.principal, ticket(f"t{i}"), f"k{i}")[0] for i in range(4)]
        sandbox.add_fault("fail_before_commit", times=1, provider="billing")
        retried, *_ = submit(agent.principal, refund(amount=100), "retried")
        stale, *_ = submit(agent.principal, refund(amount=50_000), "approval")
        effect = Effect.objects.select_related("command").get(pk=stale)
        services.effect_approve(
            effect=effect,
            principal=approver.principal,
            payload_digest=effect.command.payload_digest,
        )
        approved_at = clock.now - timedelta(seconds=settings.GATEWAY_APPROVAL_TTL + 1)
        Effect.objects.filter(pk=stale).update(approved_at=approved_at)
        dispatch(ids[0])
        compensation = services.effect_compensate(
            effect=Effect.objects.select_related("command").get(pk=ids[0]),
            principal=operator.principal,
            reason="undo",
        )
        sent = dispatcher.drain(flag=None, worker="parity")
        every = [*ids, retried, stale, compensation.effect.pk]
        return sent, sorted(Effect.objects.filter(pk__in=every).values_list("pk", "status"))

    ran = parity(scenario)
    assert "claim batch" in ran and "record batch" in ran, ran


def test_a_drain_in_a_tenant_with_a_webhook_endpoint(parity, agent, operator, sandbox, full_window):
    """The batch record leaves each outcome the endpoint hears of to the general record,
    which writes the outbox rows with it, and writes the one it does not (NOT_STARTED)."""

    def scenario(clock):
        endpoint_create(
            principal=operator.principal,
            url="http://127.0.0.1:9/hooks",
            event_types=["effect.confirmed"],
        )
        ids = [submit(agent.principal, ticket(f"w{i}"), f"k{i}")[0] for i in range(3)]
        sandbox.add_fault("fail_before_commit", times=1, provider="billing")
        ids.append(submit(agent.principal, refund(amount=100), "not heard of")[0])
        sent = dispatcher.drain(flag=None, worker="parity")
        return sent, sorted(Effect.objects.filter(pk__in=ids).values_list("pk", "status"))

    ran = parity(scenario)
    assert "claim batch" in ran and "record batch" in ran, ran
