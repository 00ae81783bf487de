"""Every write of the webhooks app: endpoints, the outbox row written with a status change,
and its delivery (STYLE 4–8).

The ledger calls :func:`outbox_record` from ``_after_transition``, inside the transaction of
the status change: the message exists if and only if the change committed. Delivery happens
after commit (a Celery task), and again from :func:`webhook_sweep` (beat) with exponential
backoff until the receiver answers 2xx — at least once, with the same ``webhook-id``. A 410
answer disables the endpoint.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import random
import socket
import time
from collections.abc import Mapping
from datetime import timedelta
from functools import partial
from importlib import metadata
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from gateway.choices import EffectStatus, Role
from gateway.errors import NotPermitted, ValidationProblem
from gateway.lib.vault import open_json, seal_json
from gateway.models import Effect, EffectEvent, Principal
from gateway.webhooks import signing
from gateway.webhooks.choices import EVENT_FOR_STATUS, EventType, MessageState
from gateway.webhooks.models import EffectWaiter, WebhookEndpoint, WebhookMessage

logger = logging.getLogger(__name__)

S = EffectStatus
M = MessageState
# Not imported from gateway.services: the ledger imports this module to write the outbox.
OPERATOR_ROLES = frozenset({Role.OPERATOR, Role.ADMIN})
# Who may register endpoints: operators and admins for the tenant, an agent for itself.
MANAGER_ROLES = OPERATOR_ROLES | {Role.AGENT}


def user_agent() -> str:
    """``effect-gateway/<version>``: receivers can tell the gateway's requests (and its
    version) from anything else that posts to them."""
    try:
        version = metadata.version("effect-gateway")
    except metadata.PackageNotFoundError:
        version = "0"
    return f"effect-gateway/{version} (webhooks; +https://www.standardwebhooks.com)"


def _setting(name: str, default: float) -> float:
    return float(getattr(settings, name, default))


def _timeout() -> float:
    return _setting("GATEWAY_WEBHOOK_TIMEOUT", 10)


def _lease() -> timedelta:
    # Longer than one delivery can take: a sender that crashed mid-request leaves its message
    # to the sweeper after this long, never to two senders at once.
    return timedelta(seconds=max(_setting("GATEWAY_WEBHOOK_LEASE", 60), _timeout() + 5))


def _backoff(attempt: int) -> timedelta:
    base = _setting("GATEWAY_WEBHOOK_BACKOFF", 5)
    ceiling = min(_setting("GATEWAY_WEBHOOK_MAX_BACKOFF", 3600), base * 2 ** (attempt - 1))
    return timedelta(seconds=random.uniform(ceiling / 2, ceiling))


# --- endpoints --------------------------------------------------------------------------------


def _require_manager(principal: Principal) -> None:
    """Operators and admins manage the tenant's endpoints; an agent its own (the selectors
    show it no other)."""
    if principal.role not in MANAGER_ROLES:
        raise NotPermitted(f"A principal with role {principal.role} cannot manage webhooks.")
    if principal.frozen:
        raise NotPermitted(f"Principal {principal.name} is frozen.")


# Addresses a receiver may not have unless GATEWAY_WEBHOOK_ALLOW_PRIVATE: outgoing webhooks
# must not become a way to reach the gateway's own network (SSRF).
_INTERNAL = (
    "is_private",
    "is_loopback",
    "is_link_local",
    "is_reserved",
    "is_multicast",
    "is_unspecified",
)


def internal_address(host: str) -> str | None:
    """The first internal address ``host`` resolves to, or None (also when allowed)."""
    if settings.GATEWAY_WEBHOOK_ALLOW_PRIVATE:
        return None
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror:
        return None  # unresolvable: nothing can be reached; the delivery fails and retries
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if any(getattr(address, attribute) for attribute in _INTERNAL):
            return str(address)
    return None


def _validate_url(url: str) -> list[str]:
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        return ["must be an http(s) URL with a host"]
    if parts.username or parts.password:
        return ["must not carry credentials; the signature authenticates the gateway"]
    if parts.scheme == "http" and not getattr(settings, "GATEWAY_WEBHOOK_ALLOW_HTTP", False):
        host = parts.hostname
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            return ["must be https (plain http is accepted for loopback receivers only)"]
    internal = internal_address(parts.hostname)
    if internal:
        return [f"resolves to {internal}, an internal address; receivers must be public"]
    return []


def endpoint_create(
    *,
    principal: Principal,
    url: str,
    event_types: list[str] | None = None,
    description: str = "",
    principals: list[str] | None = None,
    run_ids: list[str] | None = None,
) -> tuple[WebhookEndpoint, str]:
    """Register a receiver for the principal's tenant; answers it and its secret (shown once).

    ``principals`` and ``run_ids`` narrow it to the effects those principals requested, or
    whose ``context.run_id`` is one of those (empty: all). An agent's endpoint is its own
    (``owner``): it hears of the effects the agent requested or waits on, nothing else, so an
    agent gives no ``principals``.
    """
    _require_manager(principal)
    own = principal.role == Role.AGENT
    chosen = list(dict.fromkeys(event_types)) if event_types else list(EventType.values)
    errors: dict[str, list[str]] = {}
    if own and principals:
        errors["principals"] = [
            "an agent's endpoint hears of the effects that agent requested or waits on; "
            "leave principals out"
        ]
    if url_errors := _validate_url(url):
        errors["url"] = url_errors
    unknown = sorted(set(chosen) - set(EventType.values))
    if unknown:
        errors["event_types"] = [f"{', '.join(unknown)} not one of {EventType.values}"]
    if errors:
        raise ValidationProblem("The webhook endpoint is not valid.", errors=errors)
    secret = signing.new_secret()
    now = timezone.now()
    endpoint = WebhookEndpoint.objects.create(
        tenant_id=principal.tenant_id,
        url=url,
        description=description,
        secret_sealed=seal_json(secret),
        event_types=chosen,
        principals=list(dict.fromkeys(principals or [])),
        run_ids=list(dict.fromkeys(run_ids or [])),
        owner=principal if own else None,
        created_by=principal.label,
        created_at=now,
        updated_at=now,
    )
    logger.info(
        "webhook endpoint created",
        extra={"webhook_endpoint": endpoint.pk, "actor": principal.label},
    )
    return endpoint, secret


def endpoint_set_enabled(
    *, endpoint: WebhookEndpoint, principal: Principal, enabled: bool, reason: str = ""
) -> WebhookEndpoint:
    """Enable (pending messages are then sent again by the sweeper) or disable an endpoint."""
    _require_manager(principal)
    now = timezone.now()
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(
        enabled=enabled,
        disabled_reason="" if enabled else (reason or f"disabled by {principal.label}"),
        updated_at=now,
    )
    if enabled:
        # Messages that waited while it was off are due now, not at their old backoff.
        WebhookMessage.objects.filter(endpoint=endpoint, state=M.PENDING).update(
            next_attempt_at=now
        )
    endpoint.refresh_from_db()
    return endpoint


def endpoint_delete(*, endpoint: WebhookEndpoint, principal: Principal) -> None:
    """Delete an endpoint: it is no longer listed or sent to, and its pending messages are
    given up (``failed``); the messages it had stay readable in the admin as evidence."""
    _require_manager(principal)
    now = timezone.now()
    with transaction.atomic():
        WebhookEndpoint.objects.filter(pk=endpoint.pk, deleted_at__isnull=True).update(
            enabled=False,
            disabled_reason=f"deleted by {principal.label}",
            deleted_at=now,
            updated_at=now,
        )
        WebhookMessage.objects.filter(endpoint=endpoint, state=M.PENDING).update(
            state=M.FAILED, next_attempt_at=None, last_error="the endpoint was deleted"
        )
    logger.info(
        "webhook endpoint deleted",
        extra={"webhook_endpoint": endpoint.pk, "actor": principal.label},
    )


def endpoint_secret(endpoint: WebhookEndpoint) -> str:
    return open_json(endpoint.secret_sealed)


# --- waiters ----------------------------------------------------------------------------------

# One statement, autocommit. ``FOR SHARE`` waits for a status change of the effect that is in
# flight (its transaction holds the row): that change's outbox rows were written before this
# waiter existed, so the caller must see the new status when it reads the effect next, and
# does, because the insert returns only once that change has committed.
_WAITER_INSERT = """
INSERT INTO {waiter} (effect_id, principal_id, thread_id, created_at)
SELECT e.effect_id, %(principal)s, %(thread)s, %(now)s FROM {effect} e
WHERE e.effect_id = %(effect)s AND e.tenant_id = %(tenant)s FOR SHARE
ON CONFLICT DO NOTHING
"""


def waiter_thread(context: Any) -> str | None:
    """The LangGraph thread a submission's context names, if it names one."""
    thread_id = context.get("thread_id") if isinstance(context, dict) else None
    if isinstance(thread_id, str) and 0 < len(thread_id) <= 200:
        return thread_id
    return None


def waiter_record(effect: Effect, *, principal: Principal, context: Any) -> bool:
    """``hooks.command_replayed`` listener: the thread of a replay waits on the effect too.

    Nothing is written when the context names no thread, or names the thread (and principal)
    that submitted the command first: that one is the command's own ``context.thread_id``.
    Answers whether a new waiter was recorded."""
    thread_id = waiter_thread(context)
    if thread_id is None:
        return False
    command = effect.command
    if thread_id == waiter_thread(command.context) and principal.pk == command.requested_by_id:
        return False
    sql = _WAITER_INSERT.format(waiter=EffectWaiter._meta.db_table, effect=Effect._meta.db_table)
    params = {
        "principal": principal.pk,
        "thread": thread_id,
        "now": timezone.now(),
        "effect": effect.pk,
        "tenant": principal.tenant_id,
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount == 1


def effect_waiters(effect: Effect) -> list[tuple[str, int]]:
    """Every thread that waits on ``effect``, with its principal's id: the submitter's first
    (its ``context.thread_id``, if any), then the others in the order they came."""
    command = effect.command
    waiters: list[tuple[str, int]] = []
    first = waiter_thread(command.context)
    if first is not None:
        waiters.append((first, command.requested_by_id))
    rows = (
        EffectWaiter.objects.filter(effect_id=effect.pk)
        .order_by("id")
        .values_list("thread_id", "principal_id")
    )
    waiters.extend((thread, principal_id) for thread, principal_id in rows)
    return waiters


# --- the outbox -------------------------------------------------------------------------------


def _candidate_events(to_status: str) -> list[str]:
    """Events a change to ``to_status`` may announce, before knowing where it came from."""
    events: list[str] = []
    if to_status == S.PREPARED:
        events.append(EventType.APPROVED)  # only when it left AWAITING_APPROVAL
    if to_status in (S.PREPARED, S.REJECTED):
        events.append(EventType.APPROVAL_DECIDED)  # only when it left AWAITING_APPROVAL
    if to_status in EVENT_FOR_STATUS:
        events.append(EVENT_FOR_STATUS[to_status])
    return events


def approval_url(effect_id: str) -> str:
    """The console page where an approver signs the effect off (absolute when
    GATEWAY_CONSOLE_URL is set, which production does)."""
    base = (getattr(settings, "GATEWAY_CONSOLE_URL", "") or "").rstrip("/")
    return f"{base}/effects/{effect_id}"


def _subscribed(tenant_id: Any, candidates: list[str]) -> list[WebhookEndpoint]:
    """The tenant's enabled endpoints that subscribe to one of ``candidates`` (one query)."""
    return [
        endpoint
        for endpoint in WebhookEndpoint.objects.filter(tenant_id=tenant_id, enabled=True)
        if any(endpoint.subscribes_to(event) for event in candidates)
    ]


def _enqueue(endpoints: list[WebhookEndpoint], events: list[tuple[str, dict]], *, effect_id: str):
    now = timezone.now()
    messages = []
    for event, payload in events:
        for endpoint in endpoints:
            if endpoint.subscribes_to(event):
                messages.append(
                    WebhookMessage.objects.create(
                        endpoint=endpoint,
                        event_type=event,
                        effect_id=effect_id,
                        payload=payload,
                        # If the after-commit task is lost, the sweeper sends it after this.
                        next_attempt_at=now + _lease(),
                        created_at=now,
                    )
                )
    from gateway.webhooks.tasks import deliver_webhook

    for message in messages:
        # After commit: the receiver must never hear of a change that was rolled back, and
        # the task must find the row.
        transaction.on_commit(partial(deliver_webhook.delay, message.pk))
    return messages


def outbox_record(effect: Effect, *, to_status: str) -> list[WebhookMessage]:
    """Write the webhook messages a status change announces, in the caller's transaction.

    Called by the ledger for every transition (and by the submission of a command that waits
    for approval); most write nothing (no event for that status, or no endpoint of the
    tenant listens, or every listener filters it out), at the cost of at most one query.
    """
    candidates = _candidate_events(to_status)
    if not candidates:
        return []
    command = effect.command
    endpoints = _subscribed(effect.tenant_id, candidates)
    if not endpoints:
        return []
    waiters = effect_waiters(effect)
    waiter_ids = frozenset(principal_id for _, principal_id in waiters)
    endpoints = [
        endpoint
        for endpoint in endpoints
        if endpoint.wants(
            principal=command.requested_by.name,
            run_id=(command.context or {}).get("run_id"),
            requester_id=command.requested_by_id,
            waiter_ids=waiter_ids,
        )
    ]
    if not endpoints:
        return []
    thread_ids = list(dict.fromkeys(thread for thread, _ in waiters))
    # The event the transition appended just before calling us (same transaction).
    change = (
        EffectEvent.objects.filter(effect_id=effect.pk, to_status=to_status)
        .order_by("-id")
        .values("from_status", "kind", "actor", "reason", "created_at")
        .first()
    ) or {"from_status": "", "kind": "", "actor": "", "reason": "", "created_at": timezone.now()}
    decided = change["from_status"] == S.AWAITING_APPROVAL
    events = [
        event
        for event in candidates
        if event not in (EventType.APPROVAL_DECIDED, EventType.APPROVED) or decided
    ]
    now = timezone.now()
    return _enqueue(
        endpoints,
        [(event, _payload(effect, event, to_status, change, now, thread_ids)) for event in events],
        effect_id=effect.pk,
    )


def _payload(
    effect: Effect,
    event: str,
    to_status: str,
    change: Mapping[str, Any],
    now,
    thread_ids: list[str],
) -> dict[str, Any]:
    """Standard Webhooks body: type, timestamp, data. Ids, statuses and correlation only —
    never the command's payload. ``thread_ids``: every LangGraph thread waiting on it."""
    command = effect.command
    data: dict[str, Any] = {
        "effect_id": effect.pk,
        "effect_type": effect.type,
        "status": to_status,
        "from_status": change["from_status"],
        "to_status": to_status,
        "idempotency_key": command.idempotency_key,
        "payload_digest": command.payload_digest,
        "requested_by": command.requested_by.name,
        "context": command.context or {},
        "thread_ids": thread_ids,
        "reason": change["reason"],
        "actor": change["actor"],
        "occurred_at": change["created_at"].isoformat(),
        "links": {"effect": f"/api/v1/effects/{effect.pk}"},
    }
    if command.saga_id:
        data["saga"] = {"id": command.saga_id, "step": command.saga_step}
    if to_status == S.AWAITING_APPROVAL:
        data["approval"] = {"url": approval_url(effect.pk), "reason": change["reason"]}
        data["links"]["approval"] = approval_url(effect.pk)
    elif change["from_status"] == S.AWAITING_APPROVAL and to_status in (S.PREPARED, S.REJECTED):
        data["approval"] = {
            "decision": "approved" if to_status == S.PREPARED else "rejected",
            "decided_by": change["actor"],
        }
    return {"type": event, "timestamp": now.isoformat(), "data": data}


def saga_outbox_record(
    run: Any, *, from_state: str, to_state: str, actor: str, reason: str = ""
) -> list[WebhookMessage]:
    """Announce a saga run's state change (``saga.state_changed``), in the caller's
    transaction. Endpoints filtered by run_id do not get it: a saga has no agent run."""
    event = EventType.SAGA_STATE_CHANGED
    endpoints = [
        endpoint
        for endpoint in _subscribed(run.tenant_id, [event])
        if endpoint.wants(
            principal=run.requested_by.name, run_id=None, requester_id=run.requested_by_id
        )
    ]
    if not endpoints:
        return []
    now = timezone.now()
    data = {
        "saga_id": run.pk,
        "definition": run.definition,
        "state": to_state,
        "from_state": from_state,
        "to_state": to_state,
        "idempotency_key": run.idempotency_key,
        "requested_by": run.requested_by.name,
        "current_step": run.current_step,
        "reason": reason,
        "actor": actor,
        "occurred_at": now.isoformat(),
        "links": {"saga": f"/api/v1/sagas/{run.pk}"},
    }
    payload = {"type": event, "timestamp": now.isoformat(), "data": data}
    return _enqueue(endpoints, [(event, payload)], effect_id=run.pk)


# --- delivery ---------------------------------------------------------------------------------


def webhook_deliver(*, message_id: str) -> bool:
    """Send one pending message once; False when there was nothing to send (delivered, given
    up, endpoint disabled, or another sender holds this attempt)."""
    message = (
        WebhookMessage.objects.select_related("endpoint")
        .filter(pk=message_id, state=M.PENDING)
        .first()
    )
    if message is None or not message.endpoint.enabled:
        return False
    endpoint = message.endpoint
    attempt = message.attempts + 1
    now = timezone.now()
    # Compare-and-set on the attempt count: the after-commit task, the sweeper's copy and a
    # redelivered broker message may hold the same message; exactly one claims each attempt,
    # and the lease brings it back to the sweeper if that sender dies mid-request.
    claimed = WebhookMessage.objects.filter(
        pk=message.pk, state=M.PENDING, attempts=message.attempts
    ).update(attempts=attempt, last_attempt_at=now, next_attempt_at=now + _lease())
    if not claimed:
        return False
    body = json.dumps(message.payload, separators=(",", ":"), sort_keys=True).encode()
    headers = signing.headers(
        endpoint_secret(endpoint), msg_id=message.pk, timestamp=int(time.time()), body=body
    )
    headers["User-Agent"] = user_agent()
    status: int | None = None
    error = ""
    # Resolved again now, not only at registration: the name may point elsewhere since.
    internal = internal_address(urlsplit(endpoint.url).hostname or "")
    if internal:
        _refuse_internal(message, endpoint, attempt=attempt, address=internal)
        return True
    try:
        response = httpx.post(
            endpoint.url,
            content=body,
            headers=headers,
            timeout=_timeout(),
            follow_redirects=False,
            trust_env=False,
        )
        status = response.status_code
        if not 200 <= status < 300:
            error = response.text[:500]
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"[:500]
    _record_attempt(message, endpoint, attempt=attempt, status=status, error=error)
    return True


def _refuse_internal(
    message: WebhookMessage, endpoint: WebhookEndpoint, *, attempt: int, address: str
) -> None:
    """Nothing is sent; the endpoint is switched off until an operator looks at it."""
    now = timezone.now()
    reason = f"{endpoint.url} resolved to {address}, an internal address: not sent"
    with transaction.atomic():
        WebhookMessage.objects.filter(pk=message.pk, state=M.PENDING, attempts=attempt).update(
            state=M.GONE, next_attempt_at=None, last_status=None, last_error=reason
        )
        WebhookEndpoint.objects.filter(pk=endpoint.pk, enabled=True).update(
            enabled=False, disabled_reason=reason, updated_at=now
        )
    logger.warning("webhook refused", extra={"webhook_endpoint": endpoint.pk, "address": address})


def _record_attempt(
    message: WebhookMessage,
    endpoint: WebhookEndpoint,
    *,
    attempt: int,
    status: int | None,
    error: str,
) -> None:
    now = timezone.now()
    max_attempts = int(_setting("GATEWAY_WEBHOOK_MAX_ATTEMPTS", 12))
    fields: dict[str, Any] = {"last_status": status, "last_error": error}
    if status is not None and 200 <= status < 300:
        fields.update(state=M.DELIVERED, delivered_at=now, next_attempt_at=None)
    elif status == 410:
        fields.update(state=M.GONE, next_attempt_at=None)
    elif attempt >= max_attempts:
        fields.update(state=M.FAILED, next_attempt_at=None)
    else:
        fields.update(next_attempt_at=now + _backoff(attempt))
    with transaction.atomic():
        # Only the sender that claimed this attempt writes its outcome.
        WebhookMessage.objects.filter(pk=message.pk, state=M.PENDING, attempts=attempt).update(
            **fields
        )
        if status == 410:
            # The receiver says it is gone for good: stop sending to it until an operator
            # enables it again.
            WebhookEndpoint.objects.filter(pk=endpoint.pk, enabled=True).update(
                enabled=False,
                disabled_reason=(
                    f"the receiver answered 410 Gone to {message.pk} at {now.isoformat()}"
                ),
                updated_at=now,
            )
    logger.info(
        "webhook attempt",
        extra={
            "webhook_message": message.pk,
            "webhook_endpoint": endpoint.pk,
            "attempt": attempt,
            "http_status": status,
            "state": fields.get("state", M.PENDING),
        },
    )


def webhook_sweep(*, limit: int = 200) -> int:
    """Enqueue the pending messages whose next attempt is due; answers how many."""
    from gateway.webhooks.tasks import deliver_webhook

    now = timezone.now()
    due = list(
        WebhookMessage.objects.filter(
            state=M.PENDING, next_attempt_at__lte=now, endpoint__enabled=True
        )
        .order_by("next_attempt_at")
        .values_list("pk", "next_attempt_at")[:limit]
    )
    sent = 0
    for message_id, was_due in due:
        # Compare-and-set on the due time against an overlapping sweep (two beats, a slow
        # run): only one of them enqueues this attempt.
        if WebhookMessage.objects.filter(
            pk=message_id, state=M.PENDING, next_attempt_at=was_due
        ).update(next_attempt_at=now + _lease()):
            deliver_webhook.delay(message_id)
            sent += 1
    return sent
