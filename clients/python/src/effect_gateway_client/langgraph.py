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

    states = resume_threads(graph, body, headers, secret)  # {}: no thread waits for it

Every thread that waits on the effect is resumed: the first submitter's and each thread whose
submission of the same intention got the same effect back (the gateway records them and lists
them in ``data.thread_ids``).

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
    "resume_commands",
    "resume_thread",
    "resume_threads",
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
    ``interrupt()`` the graph. The gateway's webhook resumes it (see ``resume_threads``).

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


def _thread_ids(data: Mapping[str, Any]) -> list[str]:
    """Every thread the event names: ``data.thread_ids`` (all waiting threads, the submitter's
    first), else the submitter's ``context.thread_id`` (a gateway that lists no waiters)."""
    named = data.get("thread_ids")
    if not isinstance(named, list):
        named = [(data.get("context") or {}).get("thread_id")]
    return list(dict.fromkeys(str(thread) for thread in named if thread))


def resume_commands(
    body: bytes | str, headers: Mapping[str, str], secret: str
) -> list[tuple[str, Command]]:
    """Verify a gateway webhook (Standard Webhooks) and turn it into the resume of every
    LangGraph thread that waits on the effect: ``[(thread_id, Command(resume=event)), …]``,
    the submitter's thread first; empty when no thread waits on it (the tenant's other
    effects: ignore them).

    Raises ``standardwebhooks.webhooks.WebhookVerificationError`` for a forged or stale
    request.
    """
    from standardwebhooks import Webhook

    event = Webhook(secret).verify(body, dict(headers))
    data = event.get("data") or {}
    if not data.get("effect_id"):
        return []
    return [(thread_id, Command(resume=event)) for thread_id in _thread_ids(data)]


def resume_command(
    body: bytes | str, headers: Mapping[str, str], secret: str
) -> tuple[str, Command] | None:
    """The first of ``resume_commands``: the thread that submitted the effect, or None.
    Other threads may wait on the same effect: ``resume_commands`` names them all."""
    commands = resume_commands(body, headers, secret)
    return commands[0] if commands else None


def resume_threads(
    graph: Any, body: bytes | str, headers: Mapping[str, str], secret: str
) -> dict[str, dict[str, Any]]:
    """Resume every thread of ``graph`` that waits for this webhook's effect; answers each
    resumed thread's new state by thread id (empty: no thread of ``graph`` waits for it —
    another effect of the tenant, threads that have moved on, a repeated delivery). A thread
    is resumed only while it is interrupted on this effect, so a retried delivery resumes
    none twice. Verifies the signature like ``resume_commands``.
    """
    resumed: dict[str, dict[str, Any]] = {}
    for thread_id, command in resume_commands(body, headers, secret):
        event = cast(dict[str, Any], command.resume)  # resumed with the event itself
        effect_id = (event.get("data") or {}).get("effect_id")
        config = {"configurable": {"thread_id": thread_id}}
        snapshot = graph.get_state(config)
        waiting = [
            pending
            for pending in getattr(snapshot, "interrupts", ()) or ()
            if isinstance(pending.value, dict) and pending.value.get("effect_id") == effect_id
        ]
        if waiting:
            resumed[thread_id] = graph.invoke(command, config)
    return resumed


def resume_thread(
    graph: Any, body: bytes | str, headers: Mapping[str, str], secret: str
) -> dict[str, Any] | None:
    """Resume every thread of ``graph`` that waits for this webhook's effect
    (``resume_threads``) and answer the new state of the first one resumed, or None when no
    thread of ``graph`` waits for it. Use ``resume_threads`` for each thread's state.
    """
    resumed = resume_threads(graph, body, headers, secret)
    return next(iter(resumed.values()), None)
