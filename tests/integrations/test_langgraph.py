"""A real LangGraph graph (no model, in-memory checkpointer) that refunds through the gateway,
interrupts for the approval, is resumed by the gateway's webhook, and survives a crash; the key
names the business intention, so two threads make one refund (issue 15, item 1)."""

from __future__ import annotations

from typing import Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from standardwebhooks.webhooks import WebhookVerificationError

from gateway.langgraph_tools import (
    effect_key,
    resume_command,
    resume_commands,
    resume_thread,
    resume_threads,
    submit_effect,
    wait_for_effect,
)
from gateway.models import Command as LedgerCommand
from gateway.webhooks.models import EffectWaiter

pytestmark = pytest.mark.django_db(transaction=True)


class State(TypedDict, total=False):
    order_id: str
    amount: int
    refund: dict[str, Any]


def refund_graph(client, *, crash_after_submit=(), submissions=None, **submit_options):
    crash = list(crash_after_submit)
    submissions = submissions if submissions is not None else []

    def refund(state: State) -> State:
        effect = submit_effect(
            client,
            "billing.refund.create",
            resource={"type": "order", "id": state["order_id"], "version": 17},
            payload={"amount": state["amount"], "currency": "EUR", "reason": "duplicate charge"},
            business_resource=state["order_id"],
            **submit_options,
        )
        submissions.append(effect)
        if crash and crash.pop(0):
            raise RuntimeError("the worker died after the gateway call")
        done = wait_for_effect(client, effect)
        return {"refund": {"effect_id": done.effect_id, "status": done.status}}

    builder = StateGraph(State)
    builder.add_node("refund", refund)
    builder.add_edge(START, "refund")
    builder.add_edge("refund", END)
    return builder.compile(checkpointer=InMemorySaver())


def thread(name: str) -> dict:
    return {"configurable": {"thread_id": name}}


def test_refund_waits_for_approval_is_resumed_by_the_webhook_and_survives_a_crash(
    connect, agent, approver, sandbox, eager_tasks, receiver, webhook_endpoint
):
    _, secret = webhook_endpoint
    bot = connect(agent)
    submissions: list = []
    # The resume after the approval crashes right after the gateway call.
    graph = refund_graph(
        bot, crash_after_submit=[False, False, True, False], submissions=submissions
    )

    first = graph.invoke({"order_id": "ord_881", "amount": 15_000}, thread("thread-42"))
    (pending,) = first["__interrupt__"]
    effect_id = pending.value["effect_id"]
    assert pending.value["status"] == "AWAITING_APPROVAL"
    assert sandbox.operations(type="billing.refund.create") == []
    command = LedgerCommand.objects.get(pk=effect_id)
    # The key names the intention (type, order, revision): no thread id in it.
    assert (
        command.idempotency_key
        == effect_key("billing.refund.create", "ord_881")
        == ("billing.refund.create:ord_881:v1")
    )
    assert command.context == {"runtime": "langgraph", "thread_id": "thread-42", "agent": "refund"}

    (waiting,) = receiver.wait_for(1)
    assert waiting.event["type"] == "effect.awaiting_approval"
    # Still waiting for the approver: the resume wakes the node, which interrupts again.
    assert "__interrupt__" in resume_thread(graph, waiting.body, waiting.headers, secret)

    connect(approver).approve(effect_id, submissions[0].payload_digest)
    deliveries = receiver.wait_for(4)  # + approved, approval_decided, confirmed
    approved = next(d for d in deliveries if d.event["type"] == "effect.approved")
    with pytest.raises(RuntimeError, match="died after the gateway call"):
        resume_thread(graph, approved.body, approved.headers, secret)
    assert len(sandbox.operations(type="billing.refund.create")) == 1

    confirmed = next(d for d in deliveries if d.event["type"] == "effect.confirmed")
    done = resume_thread(graph, confirmed.body, confirmed.headers, secret)
    assert done["refund"] == {"effect_id": effect_id, "status": "CONFIRMED"}
    assert "__interrupt__" not in done
    # A repeated or late delivery for a thread that moved on resumes nothing.
    assert resume_thread(graph, confirmed.body, confirmed.headers, secret) is None

    assert {s.effect_id for s in submissions} == {effect_id}
    assert [s.replayed for s in submissions] == [False, True, True, True]
    assert LedgerCommand.objects.filter(type="billing.refund.create").count() == 1
    assert len(sandbox.operations(type="billing.refund.create")) == 1


def test_the_same_refund_on_two_threads_is_one_refund(connect, agent, sandbox, eager_tasks):
    """The bug: the thread id was in every key, so two threads refunded 5.00 twice."""
    bot = connect(agent)
    submissions: list = []
    graph = refund_graph(bot, submissions=submissions)
    a = graph.invoke({"order_id": "ord_5", "amount": 500}, thread("thread-a"))
    b = graph.invoke({"order_id": "ord_5", "amount": 500}, thread("thread-b"))
    assert a["refund"] == b["refund"]
    assert a["refund"]["status"] == "CONFIRMED"
    assert [s.replayed for s in submissions] == [False, True]
    assert len(sandbox.operations(type="billing.refund.create")) == 1
    # Both threads are traceable: the first submission's context names its thread.
    command = LedgerCommand.objects.get(type="billing.refund.create")
    assert command.context["thread_id"] == "thread-a"


def test_three_threads_waiting_on_one_effect_are_all_resumed(
    connect, agent, approver, sandbox, eager_tasks, receiver, webhook_endpoint
):
    """Only the first submitter's thread used to be resumed: the webhook named one thread."""
    _, secret = webhook_endpoint
    bot = connect(agent)
    graph = refund_graph(bot)
    threads = ["t-one", "t-two", "t-three"]
    started = [graph.invoke({"order_id": "ord_77", "amount": 15_000}, thread(t)) for t in threads]
    (effect_id,) = {state["__interrupt__"][0].value["effect_id"] for state in started}
    waiters = EffectWaiter.objects.order_by("id").values_list("thread_id", flat=True)
    assert list(waiters) == ["t-two", "t-three"]  # the first is the command's own thread
    # The resume of an interrupted thread replays again: no second row.
    graph.invoke({"order_id": "ord_77", "amount": 15_000}, thread("t-two"))
    assert EffectWaiter.objects.count() == 2

    command = LedgerCommand.objects.get(pk=effect_id)
    connect(approver).approve(effect_id, command.payload_digest)
    deliveries = receiver.wait_for(4)  # awaiting_approval, approved, approval_decided, confirmed
    confirmed = next(d for d in deliveries if d.event["type"] == "effect.confirmed")
    assert confirmed.event["data"]["thread_ids"] == threads
    assert [t for t, _ in resume_commands(confirmed.body, confirmed.headers, secret)] == threads

    states = resume_threads(graph, confirmed.body, confirmed.headers, secret)
    assert sorted(states) == sorted(threads)
    for state in states.values():
        assert state["refund"] == {"effect_id": effect_id, "status": "CONFIRMED"}
        assert "__interrupt__" not in state
    # A retried delivery (same webhook-id) resumes no thread twice.
    assert resume_threads(graph, confirmed.body, confirmed.headers, secret) == {}
    assert LedgerCommand.objects.filter(type="billing.refund.create").count() == 1
    assert len(sandbox.operations(type="billing.refund.create")) == 1


def test_the_caller_names_the_intention_with_a_key_or_a_key_function(
    connect, agent, sandbox, eager_tasks
):
    bot = connect(agent)

    def per_incident(effect_type, resource, payload):
        return f"{effect_type}:{resource['id']}:{payload['reason']}"

    keyed = refund_graph(bot, key_fn=per_incident)
    keyed.invoke({"order_id": "ord_6", "amount": 500}, thread("t1"))
    explicit = refund_graph(bot, key="refund:ord_6:incident-9")
    explicit.invoke({"order_id": "ord_6", "amount": 500}, thread("t2"))
    # Per-thread intentions are possible, but must be asked for.
    per_thread = refund_graph(bot, revision="retry-of-t3")
    per_thread.invoke({"order_id": "ord_6", "amount": 500}, thread("t3"))
    keys = sorted(LedgerCommand.objects.values_list("idempotency_key", flat=True))
    assert keys == [
        "billing.refund.create:ord_6:duplicate charge",
        "billing.refund.create:ord_6:retry-of-t3",
        "refund:ord_6:incident-9",
    ]
    assert len(sandbox.operations(type="billing.refund.create")) == 3


def test_a_cancelled_effect_resumes_the_waiting_thread(
    connect, agent, sandbox, eager_tasks, receiver, webhook_endpoint
):
    _, secret = webhook_endpoint
    bot = connect(agent)
    graph = refund_graph(bot)
    first = graph.invoke({"order_id": "ord_9", "amount": 15_000}, thread("t-cancel"))
    effect_id = first["__interrupt__"][0].value["effect_id"]
    bot.cancel(effect_id, reason="the customer withdrew the claim")
    deliveries = receiver.wait_for(2)
    cancelled = next(d for d in deliveries if d.event["type"] == "effect.cancelled")
    done = resume_thread(graph, cancelled.body, cancelled.headers, secret)
    assert done["refund"] == {"effect_id": effect_id, "status": "CANCELLED"}
    assert sandbox.operations(type="billing.refund.create") == []


def test_other_effects_webhooks_are_ignored_not_a_crash(
    connect, agent, ticket_body, sandbox, eager_tasks, receiver, webhook_endpoint
):
    """The documented receiver crashed (ValueError) on the tenant's other effects."""
    _, secret = webhook_endpoint
    graph = refund_graph(connect(agent))
    graph.invoke({"order_id": "ord_10", "amount": 15_000}, thread("t-other"))
    agent.submit(ticket_body, "not-langgraph")  # no thread submitted it
    deliveries = receiver.wait_for(2)  # the refund awaits approval; the ticket is confirmed
    ticket = next(d for d in deliveries if d.event["data"]["effect_type"] == "ticket.create")
    assert resume_command(ticket.body, ticket.headers, secret) is None
    assert resume_thread(graph, ticket.body, ticket.headers, secret) is None


def test_a_second_run_of_the_same_intention_finishes_without_interrupt(
    connect, agent, sandbox, eager_tasks
):
    """The documented script's second run (a new process: a new checkpointer) replays the
    confirmed refund and ends at once; it used to fail with KeyError: '__interrupt__'."""
    bot = connect(agent)
    for _ in range(2):
        graph = refund_graph(bot)
        state = graph.invoke({"order_id": "ord_11", "amount": 500}, thread("incident-120"))
        assert "__interrupt__" not in state
        assert state["refund"]["status"] == "CONFIRMED"
    assert len(sandbox.operations(type="billing.refund.create")) == 1


def test_a_forged_webhook_does_not_resume(receiver):
    body = b'{"type":"effect.confirmed","data":{"context":{"thread_id":"thread-42"}}}'
    headers = {
        "webhook-id": "msg_1",
        "webhook-timestamp": "1700000000",
        "webhook-signature": "v1,AAAA",
    }
    with pytest.raises(WebhookVerificationError):
        resume_command(body, headers, "whsec_" + "MDEyMzQ1Njc4OTAxMjM0NTY3ODkwMTIzNDU2Nzg5MDE=")


def test_submit_effect_outside_a_graph_is_refused(connect, agent):
    with pytest.raises(RuntimeError):
        submit_effect(
            connect(agent),
            "ticket.create",
            resource={"type": "queue", "id": "s"},
            payload={"title": "x", "priority": "P3"},
            business_resource="s",
        )
