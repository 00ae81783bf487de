"""LangGraph helpers: submit effects from a node, and wait for them with ``interrupt()``.

Inside a node (or a ``@task``)::

    def refund(state):
        effect = submit_effect(
            gateway, "billing.refund.create",
            resource={"type": "order", "id": state["order_id"], "version": 17},
            payload={"amount": 15000, "currency": "EUR", "reason": "duplicate charge"},
            business_resource=state["order_id"],
            revision=state["incident_id"],          # the intention: this incident's refund
        )
        effect = wait_for_effect(gateway, effect)   # interrupts until it is settled
        return {"refund_status": effect.status}

and in the webhook receiver (the gateway's ``effect.*`` events)::

    state = resume_thread(graph, body, headers, secret)   # None: not for a waiting thread

**The key names the business intention, not the thread.** The default key is
``<type>:<business resource>:<revision>`` — the same for every thread, run and re-run that
carries out the same intention, so two threads (a retried conversation, a second worker) that
refund the same order for the same incident make *one* refund. Give ``key=`` (a string) or
``key_fn=`` (a function of the type, resource and payload) when the intention is named by
something else; put a thread id into a key only when each thread really is a separate
intention. A changed plan (another amount) is a new intention: change ``revision``.

Why re-running the node is safe: LangGraph resumes an interrupted node *from its start*, and
a crashed run is re-run the same way, so ``submit_effect`` runs again with the same key, and
the gateway answers with the effect it already has (``replayed=True``). The resume value is
only a wake-up call: the node re-reads the effect from the gateway, so a late, duplicated or
out-of-order webhook cannot mislead it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

from langgraph.config import get_config
from langgraph.types import Command, interrupt

from effect_gateway_client import SETTLED, Effect, GatewayClient, deterministic_key

__all__ = [
    "effect_key",
    "resume_command",
    "resume_thread",
    "submit_effect",
    "wait_for_effect",
]

KeyFunction = Callable[[str, Mapping[str, Any], Mapping[str, Any]], str]


def _where() -> tuple[str, str, Mapping[str, Any]]:
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


def effect_key(effect_type: str, business_resource: str, revision: str = "v1") -> str:
    """``<type>:<business resource>:<revision>`` — the intention, whatever thread runs it."""
    return deterministic_key(effect_type, business_resource, revision)


def submit_effect(
    client: GatewayClient,
    effect_type: str,
    *,
    resource: Mapping[str, Any],
    payload: Mapping[str, Any],
    business_resource: str | None = None,
    revision: str = "v1",
    key: str | None = None,
    key_fn: KeyFunction | None = None,
    intent: Mapping[str, Any] | None = None,
    expires_in: int | None = None,
) -> Effect:
    """Submit from the running node under the key of the business intention.

    The key is ``key`` if given, else ``key_fn(effect_type, resource, payload)``, else
    ``effect_key(effect_type, business_resource or resource["id"], revision)``. The thread
    id goes into the command's ``context`` (that is how the webhook finds the thread), never
    into the default key. ``revision`` is the intent revision: change it when the plan
    changes, so that the new command gets a new key and a new approval.
    """
    thread_id, node, config = _where()
    if key is None and key_fn is not None:
        key = key_fn(effect_type, resource, payload)
    if key is None:
        key = effect_key(effect_type, business_resource or str(resource.get("id")), revision)
    context = {"runtime": "langgraph", "thread_id": thread_id, "agent": node}
    if config.get("run_id"):
        context["run_id"] = str(config["run_id"])
    return client.submit(
        effect_type,
        resource,
        payload,
        key=key,
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
        # By id: a graph resumed hours later holds a stale Effect; read where it is now.
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
) -> tuple[str, Command] | None:
    """Verify a gateway webhook (Standard Webhooks) and turn it into the resume of the
    LangGraph thread that submitted the effect: ``(thread_id, Command(resume=event))``, or
    None when no LangGraph thread submitted it (the tenant's other effects: ignore them).

    Raises ``standardwebhooks.webhooks.WebhookVerificationError`` for a forged or stale
    request.
    """
    from standardwebhooks import Webhook

    event = Webhook(secret).verify(body, dict(headers))
    data = event.get("data") or {}
    thread_id = (data.get("context") or {}).get("thread_id")
    if not thread_id or not data.get("effect_id"):
        return None
    return str(thread_id), Command(resume=event)


def resume_thread(
    graph: Any, body: bytes | str, headers: Mapping[str, str], secret: str
) -> dict[str, Any] | None:
    """Resume the thread that waits for this webhook's effect; answers the graph's new state,
    or None when no thread of ``graph`` waits for it (another effect of the tenant, a thread
    that has moved on, a repeated delivery). Verifies the signature like ``resume_command``.
    """
    target = resume_command(body, headers, secret)
    if target is None:
        return None
    thread_id, command = target
    event = cast(dict[str, Any], command.resume)  # resume_command resumes with the event
    effect_id = (event.get("data") or {}).get("effect_id")
    config = {"configurable": {"thread_id": thread_id}}
    snapshot = graph.get_state(config)
    waiting = [
        pending
        for pending in getattr(snapshot, "interrupts", ()) or ()
        if isinstance(pending.value, dict) and pending.value.get("effect_id") == effect_id
    ]
    if not waiting:
        return None
    return graph.invoke(command, config)
