"""``GatewayClient``: the gateway's HTTP API for agent code, over httpx, with no Django.

Retries: a request that may not have reached the gateway (connect error), or that the gateway
could not serve right now (502, 503, 504, 429), is sent again with backoff. A submission is
re-sent with the *same* Idempotency-Key, so a retry whose first try did land is answered with
the effect already recorded (``replayed=True``), never a second command. Requests that are not
idempotent (approve, reject, cancel) are retried only when they certainly did not arrive.
"""

from __future__ import annotations

import builtins
import random
import time
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx

from effect_gateway_client.errors import GatewayError, GatewayUnavailable, RateLimited, error_for
from effect_gateway_client.models import SETTLED, Effect, EffectPage, EffectType

RETRY_STATUSES = frozenset({429, 502, 503, 504})
# The correlation keys the gateway stores on a command's context and can filter on.
CONTEXT_KEYS = ("runtime", "session_id", "run_id", "call_id", "thread_id", "agent")
# The server caps one long poll (GATEWAY_MAX_WAIT); longer waits are several polls.
MAX_POLL = 30.0


class GatewayClient:
    """A client for one gateway and one bearer token.

    >>> client = GatewayClient("http://127.0.0.1:8000", token)
    >>> effect = client.submit("ticket.create", {"type": "queue", "id": "support"},
    ...                        {"title": "Printer on fire", "priority": "P2"},
    ...                        key=deterministic_key("ticket.create", "support", "printer", "v1"))
    >>> client.wait(effect.effect_id, timeout=30).status
    'CONFIRMED'
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 10.0,
        retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 10.0,
        user_agent: str = "effect-gateway-client/2",
        transport: httpx.BaseTransport | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        if not token:
            raise ValueError("a gateway token is required (python manage.py issue_token …)")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._http = httpx.Client(
            base_url=self.base_url,
            headers={
                "Authorization": f"Bearer {token}",
                "Accept": "application/json",
                "User-Agent": user_agent,
                # Extra headers on every request, e.g. the MCP endpoint an OAuth token
                # reached (X-Gateway-Resource).
                **(headers or {}),
            },
            timeout=timeout,
            transport=transport,
            # No proxies from the environment: a gateway on loopback must not be intercepted.
            trust_env=False,
            follow_redirects=False,
        )

    # -- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- commands ------------------------------------------------------------------------

    def submit(
        self,
        type: str,
        resource: Mapping[str, Any],
        payload: Mapping[str, Any],
        *,
        key: str,
        intent: Mapping[str, Any] | None = None,
        context: Mapping[str, Any] | None = None,
        expires_in: int | None = None,
    ) -> Effect:
        """Submit a command under ``key``; the same key and payload always give one effect.

        Raises ValidationFailed (400), NotPermitted (403), IdempotencyKeyMismatch (422, the key
        names another payload), RateLimited, GatewayUnavailable.
        """
        body = command_body(type, resource, payload, key, intent, context, expires_in)
        response = self._request(
            "POST",
            "/api/v1/commands",
            json=body,
            headers={"Idempotency-Key": key},
            idempotent=True,
        )
        return Effect.from_json(
            response.json(), replayed=response.headers.get("Idempotent-Replayed") == "true"
        )

    def get(self, effect_id: str) -> Effect:
        return Effect.from_json(self._request("GET", f"/api/v1/effects/{effect_id}").json())

    def wait(
        self,
        effect: Effect | str,
        timeout: float,
        *,
        until: Iterable[str] | None = None,
    ) -> Effect:
        """Follow an effect with the gateway's long poll until its status is one of ``until``
        (default: settled — confirmed, rejected, expired, cancelled, compensated or failed) or
        ``timeout`` seconds have passed; answers the last state seen either way.

        Pass the ``Effect`` that ``submit`` answered to start from its status (one request
        fewer); an effect id is read first."""
        targets = frozenset(until) if until is not None else SETTLED
        until_param = ",".join(sorted(targets))
        deadline = time.monotonic() + max(timeout, 0.0)
        effect_id = effect.effect_id if isinstance(effect, Effect) else effect
        if not isinstance(effect, Effect):
            effect = self.get(effect_id)
        while effect.status not in targets:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            poll = min(remaining, MAX_POLL)
            response = self._request(
                "GET",
                f"/api/v1/effects/{effect_id}",
                # What it waits for: the poll answers once the effect is in one of them, past
                # any status in between. And the status this client saw, for a gateway that
                # knows no ``until``: if the effect moved on since, it answers at once.
                params={"wait": f"{poll:.2f}", "seen": effect.status, "until": until_param},
                timeout=poll + self.timeout,
            )
            effect = Effect.from_json(response.json())
        return effect

    def list(
        self,
        *,
        status: str | Iterable[str] | None = None,
        type: str | None = None,
        owner: str | None = None,
        context: Mapping[str, str] | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> EffectPage:
        """One page of the tenant's effects, newest first. ``context={"run_id": …}`` keeps the
        effects of one agent run (keys: runtime, session_id, run_id, call_id, thread_id,
        agent); pass ``cursor=page.next_cursor`` for the next page."""
        params = list_params(status, type, owner, context, limit, cursor)
        return effect_page(self._request("GET", "/api/v1/effects", params=params).json())

    def events(self, effect_id: str) -> builtins.list[dict[str, Any]]:
        """The effect's status changes, oldest first (a JSON array)."""
        return self._request("GET", f"/api/v1/effects/{effect_id}/events").json()

    def effect_types(self, *, permitted: bool = False) -> builtins.list[EffectType]:
        """The contracts; ``permitted=True``: only those this token may submit (an agent's
        live grants; people act under their role and see every type)."""
        params = {"permitted": "true"} if permitted else None
        body = self._request("GET", "/api/v1/effect-types", params=params).json()
        return [EffectType.from_json(item) for item in body.get("results", [])]

    # -- actions -------------------------------------------------------------------------

    def approve(
        self,
        effect_id: str,
        payload_digest: str,
        comment: str = "",
        *,
        signature: dict[str, str] | None = None,
    ) -> Effect:
        """Approve exactly ``payload_digest`` (approver role; never the requester). Where the
        gateway's policy signs approvals, ``signature`` is ``{"nonce", "key_id",
        "signature"}``: your registered key's signature over ``approval_challenge``."""
        body: dict[str, Any] = {"payload_digest": payload_digest, "comment": comment}
        if signature is not None:
            body["signature"] = signature
        return self._action(effect_id, "approve", body)

    def approval_challenge(self, effect_id: str, decision: str = "approve") -> dict[str, Any]:
        """A one-use challenge for your key to sign (``challenge``: 32 bytes, base64url)."""
        path = f"/api/v1/effects/{effect_id}/approval-challenge"
        return self._request("POST", path, json={"decision": decision}).json()

    def reject(self, effect_id: str, reason: str = "") -> Effect:
        return self._action(effect_id, "reject", {"reason": reason})

    def cancel(self, effect_id: str, reason: str = "") -> Effect:
        return self._action(effect_id, "cancel", {"reason": reason})

    def compensate(self, effect_id: str, reason: str) -> Effect:
        """Issue the contract's compensator as a new command; answers the compensating effect.
        Asking again replays it, so this request is retried like a submission."""
        response = self._request(
            "POST",
            f"/api/v1/effects/{effect_id}/compensate",
            json={"reason": reason},
            idempotent=True,
        )
        return Effect.from_json(
            response.json(), replayed=response.headers.get("Idempotent-Replayed") == "true"
        )

    def _action(self, effect_id: str, action: str, body: dict[str, Any]) -> Effect:
        response = self._request("POST", f"/api/v1/effects/{effect_id}/{action}", json=body)
        return Effect.from_json(response.json())

    # -- transport -----------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        *,
        idempotent: bool | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """Send one request, retrying what is safe to retry; raise the problem as an exception.

        ``idempotent`` (default: GET) allows a retry after a read timeout or a dropped
        connection, when the first try may have been processed.
        """
        if idempotent is None:
            idempotent = method == "GET"
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self._http.request(
                    method, path, timeout=timeout or self.timeout, **kwargs
                )
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
                # Nothing reached the gateway: any request may be sent again.
                if attempt > self.retries:
                    raise GatewayUnavailable(
                        f"cannot reach the gateway at {self.base_url}: {exc}"
                    ) from exc
                self._sleep(attempt)
                continue
            except httpx.TransportError as exc:
                # Sent, then the connection failed: only an idempotent request is re-sent.
                if not idempotent or attempt > self.retries:
                    raise GatewayUnavailable(
                        f"the gateway at {self.base_url} did not answer: {exc}"
                    ) from exc
                self._sleep(attempt)
                continue
            if response.status_code < 400:
                return response
            retry_after = _retry_after(response)
            if response.status_code in RETRY_STATUSES and attempt <= self.retries:
                self._sleep(attempt, retry_after)
                continue
            raise _problem(response, retry_after)

    def _sleep(self, attempt: int, retry_after: float | None = None) -> None:
        if retry_after is not None:
            time.sleep(min(retry_after, self.max_backoff * 3))
            return
        ceiling = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
        time.sleep(random.uniform(ceiling / 2, ceiling))


def list_params(
    status: str | Iterable[str] | None,
    type: str | None,
    owner: str | None,
    context: Mapping[str, str] | None,
    limit: int | None,
    cursor: str | None,
) -> dict[str, Any]:
    """The query of ``GET /api/v1/effects`` for ``list`` (sync and async)."""
    params: dict[str, Any] = {}
    if status:
        params["status"] = status if isinstance(status, str) else ",".join(status)
    if type:
        params["type"] = type
    if owner:
        params["owner"] = owner
    for name, value in (context or {}).items():
        if name not in CONTEXT_KEYS:
            raise ValueError(f"context filter {name!r} is not one of {CONTEXT_KEYS}")
        params[f"context.{name}"] = value
    if limit:
        params["limit"] = limit
    if cursor:
        params["cursor"] = cursor
    return params


def effect_page(body: dict[str, Any]) -> EffectPage:
    """A page of ``GET /api/v1/effects``, with the cursor of the next one."""
    next_url = body.get("next")
    next_cursor = parse_qs(urlparse(next_url).query).get("cursor", [None])[0] if next_url else None
    return EffectPage(
        results=[Effect.from_json(item) for item in body.get("results", [])],
        next_cursor=next_cursor,
    )


def command_body(
    type: str,
    resource: Mapping[str, Any],
    payload: Mapping[str, Any],
    key: str,
    intent: Mapping[str, Any] | None,
    context: Mapping[str, Any] | None,
    expires_in: int | None,
) -> dict[str, Any]:
    """The body of ``POST /api/v1/commands`` (the key travels in the Idempotency-Key header)."""
    if not key or not isinstance(key, str):
        raise ValueError("key is required: use deterministic_key(...) from the business plan")
    body: dict[str, Any] = {"type": type, "resource": dict(resource), "payload": dict(payload)}
    if intent is not None:
        body["intent"] = dict(intent)
    if context is not None:
        body["context"] = dict(context)
    if expires_in is not None:
        body["expires_in"] = expires_in
    return body


def _retry_after(response: httpx.Response) -> float | None:
    raw = response.headers.get("Retry-After")
    if not raw:
        return None
    try:
        return max(float(raw), 0.0)
    except ValueError:
        return None


def _problem(response: httpx.Response, retry_after: float | None) -> GatewayError:
    try:
        problem = response.json()
    except ValueError:
        problem = None
    if not isinstance(problem, dict):
        problem = {"status": response.status_code, "detail": response.text[:500]}
    error = error_for(response.status_code, problem, retry_after)
    if isinstance(error, RateLimited) and error.retry_after is None:
        error.retry_after = retry_after
    return error
