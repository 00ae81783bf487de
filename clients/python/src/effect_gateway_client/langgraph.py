"""LangGraph helpers: submit effects from a node, and wait for them with ``interrupt()``.

Inside a node (or a ``@task``)::

    def refund(state):
        effect = submit_effect(
            gateway, "billing.refund.create",
            resource={"type": "order", "id": state["order_id"], "version": 17},
            payload={"amount": 15000, "currency": "EUR", "reason": "duplicate charge"},
            business_resource=state["order_id"],
        )
        effect = wait_for_effect(gateway, effect)   # interrupts until approved and confirmed
        return {"refund_status": effect.status}

and in the webhook receiver (the gateway's ``effect.*`` events)::

    thread_id, command = resume_command(body, headers, secret)
    graph.invoke(command, {"configurable": {"thread_id": thread_id}})

Why re-running the node is safe: LangGraph resumes an interrupted node *from its start*, and
a crashed run is re-run the same way, so ``submit_effect`` runs again. Its key is derived from
the thread id, the node name and the business resource — the same on every re-run — so the
gateway answers with the effect it already has (``replayed=True``) and the provider operation
happens once. The resume value is only a wake-up call: the node re-reads the effect from the
gateway, so a late, duplicated or out-of-order webhook cannot mislead it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from langgraph.config import get_config
from langgraph.types import Command, interrupt

from effect_gateway_client import SETTLED, Effect, GatewayClient, deterministic_key

__all__ = ["effect_key", "resume_command", "submit_effect", "wait_for_effect"]


def _where() -> tuple[str, str, dict[str, Any]]:
    """(thread id, node name, config) of the running node."""
    config = get_config()
    thread_id = (config.get("configurable") or {}).get("thread_id")
    node = (config.get("metadata") or {}).get("langgraph_node")
    if not thread_id or not node:
        raise RuntimeError(
            "submit_effect runs inside a LangGraph node of a graph compiled with a "
            "checkpointer and invoked with configurable.thread_id"
        )
    return str(thread_id), str(node), config


def effect_key(
    effect_type: str, business_resource: str, *, thread_id: str, node: str, revision: str = "v1"
) -> str:
    """``<type>:<business resource>:<node>:<revision>:<thread>`` — stable across re-runs."""
    return deterministic_key(effect_type, business_resource, node, revision, thread_id)


def submit_effect(
    client: GatewayClient,
    effect_type: str,
    *,
    resource: Mapping[str, Any],
    payload: Mapping[str, Any],
    business_resource: str,
    revision: str = "v1",
    intent: Mapping[str, Any] | None = None,
    expires_in: int | None = None,
) -> Effect:
    """Submit from the running node with a key derived from thread, node and resource.

    ``revision`` is the intent revision: change it (``"v2"``) when the plan changes, so that
    the new command gets a new key and a new approval.
    """
    thread_id, node, config = _where()
    context = {"runtime": "langgraph", "thread_id": thread_id, "agent": node}
    if config.get("run_id"):
        context["run_id"] = str(config["run_id"])
    return client.submit(
        effect_type,
        resource,
        payload,
        key=effect_key(
            effect_type, business_resource, thread_id=thread_id, node=node, revision=revision
        ),
        intent=intent,
        context=context,
        expires_in=expires_in,
    )


def wait_for_effect(
    client: GatewayClient,
    effect: Effect | str,
    *,
    until: Iterable[str] = SETTLED,
    poll_first: float = 0.0,
) -> Effect:
    """Answer the effect once its status is one of ``until`` (default: settled); until then,
    ``interrupt()`` the graph. The gateway's webhook resumes it (see ``resume_command``).

    ``poll_first`` seconds of long poll come first, so that an effect that settles within
    them does not interrupt the graph at all.
    """
    targets = frozenset(until)
    effect_id = effect.effect_id if isinstance(effect, Effect) else effect
    if poll_first > 0:
        current = client.wait(effect_id, poll_first, until=targets)
    else:
        current = client.get(effect_id)
    while current.status not in targets:
        interrupt(
            {
                "effect_id": current.effect_id,
                "effect_type": current.type,
                "status": current.status,
                "idempotency_key": current.idempotency_key,
                "waiting_for": sorted(targets),
                "approval": current.approval,
            }
        )
        current = client.get(effect_id)
    return current


def resume_command(
    body: bytes | str, headers: Mapping[str, str], secret: str
) -> tuple[str, Command]:
    """Verify a gateway webhook (Standard Webhooks) and turn it into the resume of the
    LangGraph thread that submitted the effect: ``(thread_id, Command(resume=event))``.

    Raises ``standardwebhooks.webhooks.WebhookVerificationError`` for a forged or stale
    request, ``ValueError`` for an effect that no LangGraph thread submitted.
    """
    from standardwebhooks import Webhook

    event = Webhook(secret).verify(body, dict(headers))
    data = event.get("data") or {}
    thread_id = (data.get("context") or {}).get("thread_id")
    if not thread_id:
        raise ValueError(f"effect {data.get('effect_id')} was not submitted by a LangGraph thread")
    return str(thread_id), Command(resume=event)
