"""A real LangGraph graph (no model, in-memory checkpointer) that refunds through the gateway,
interrupts for the approval, is resumed by the gateway's webhook, and survives a crash."""

from __future__ import annotations

from typing import Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from standardwebhooks.webhooks import WebhookVerificationError

from gateway.langgraph_tools import effect_key, resume_command, submit_effect, wait_for_effect
from gateway.models import Command as LedgerCommand

pytestmark = pytest.mark.django_db(transaction=True)


class State(TypedDict, total=False):
    order_id: str
    amount: int
    refund: dict[str, Any]


def refund_graph(client, *, crash_after_submit: list[bool], submissions: list):
    def refund(state: State) -> State:
        effect = submit_effect(
            client,
            "billing.refund.create",
            resource={"type": "order", "id": state["order_id"], "version": 17},
            payload={"amount": state["amount"], "currency": "EUR", "reason": "duplicate charge"},
            business_resource=state["order_id"],
        )
        submissions.append(effect)
        if crash_after_submit and crash_after_submit.pop(0):
            raise RuntimeError("the worker died after the gateway call")
        done = wait_for_effect(client, effect)
        return {"refund": {"effect_id": done.effect_id, "status": done.status}}

    builder = StateGraph(State)
    builder.add_node("refund", refund)
    builder.add_edge(START, "refund")
    builder.add_edge("refund", END)
    return builder.compile(checkpointer=InMemorySaver())


def test_refund_waits_for_approval_is_resumed_by_the_webhook_and_survives_a_crash(
    connect, agent, approver, sandbox, eager_tasks, receiver, webhook_endpoint
):
    _, secret = webhook_endpoint
    bot = connect(agent)
    submissions: list = []
    crash = [False, True, False]  # the first resume crashes right after the gateway call
    graph = refund_graph(bot, crash_after_submit=crash, submissions=submissions)
    config = {"configurable": {"thread_id": "thread-42"}}

    first = graph.invoke({"order_id": "ord_881", "amount": 15_000}, config)
    (pending,) = first["__interrupt__"]
    effect_id = pending.value["effect_id"]
    assert pending.value["status"] == "AWAITING_APPROVAL"
    assert sandbox.operations(type="billing.refund.create") == []
    command = LedgerCommand.objects.get(pk=effect_id)
    assert (
        command.idempotency_key
        == effect_key("billing.refund.create", "ord_881", thread_id="thread-42", node="refund")
        == "billing.refund.create:ord_881:refund:v1:thread-42"
    )
    assert command.context == {"runtime": "langgraph", "thread_id": "thread-42", "agent": "refund"}

    connect(approver).approve(effect_id, submissions[0].payload_digest)
    receiver.wait_for(2)  # effect.approval_decided, then effect.confirmed
    decided, confirmed = receiver.deliveries
    assert decided.event["type"] == "effect.approval_decided"

    thread_id, resume = resume_command(decided.body, decided.headers, secret)
    assert thread_id == "thread-42"
    with pytest.raises(RuntimeError, match="died after the gateway call"):
        graph.invoke(resume, {"configurable": {"thread_id": thread_id}})
    assert len(sandbox.operations(type="billing.refund.create")) == 1

    thread_id, resume = resume_command(confirmed.body, confirmed.headers, secret)
    done = graph.invoke(resume, {"configurable": {"thread_id": thread_id}})
    assert done["refund"] == {"effect_id": effect_id, "status": "CONFIRMED"}
    assert "__interrupt__" not in done

    # Three runs of the node, one command, one provider operation.
    assert [s.effect_id for s in submissions] == [effect_id] * 3
    assert [s.replayed for s in submissions] == [False, True, True]
    assert LedgerCommand.objects.filter(type="billing.refund.create").count() == 1
    assert len(sandbox.operations(type="billing.refund.create")) == 1


def test_a_small_refund_needs_no_interrupt(connect, agent, sandbox, eager_tasks):
    submissions: list = []
    graph = refund_graph(connect(agent), crash_after_submit=[], submissions=submissions)
    done = graph.invoke(
        {"order_id": "ord_7", "amount": 500}, {"configurable": {"thread_id": "t-small"}}
    )
    assert done["refund"]["status"] == "CONFIRMED"
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
