"""``AsyncGatewayClient``: the same API as :class:`GatewayClient`, for asyncio agents
(openai-agents, LangGraph's async nodes, an async MCP host), over ``httpx.AsyncClient``.

The same retry rules: a submission is re-sent with the *same* Idempotency-Key, so a retry
whose first try landed is answered with the recorded effect (``replayed=True``); approve,
reject and cancel are re-sent only when they certainly did not arrive.
"""

from __future__ import annotations

import asyncio
import builtins
import random
import time
from collections.abc import Iterable, Mapping
from typing import Any

import httpx

from effect_gateway_client.client import (
    MAX_POLL,
    RETRY_STATUSES,
    _problem,
    _retry_after,
    command_body,
    effect_page,
    list_params,
)
from effect_gateway_client.errors import GatewayUnavailable
from effect_gateway_client.models import SETTLED, Effect, EffectPage, EffectType


class AsyncGatewayClient:
    """An asyncio client for one gateway and one bearer token.

    >>> async with AsyncGatewayClient(url, token) as gateway:
    ...     effect = await gateway.submit("ticket.create", {"type": "queue", "id": "support"},
    ...                                   {"title": "Printer on fire", "priority": "P2"},
    ...                                   key="ticket.create:support:printer:v1")
    ...     effect = await gateway.wait(effect.effect_id, timeout=30)
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
        user_agent: str = "effect-gateway-client/2 (async)",
        transport: httpx.AsyncBaseTransport | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        if not token:
            raise ValueError("a gateway token is required (python manage.py issue_token …)")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._http = httpx.AsyncClient(
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
            trust_env=False,
            follow_redirects=False,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncGatewayClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- commands ------------------------------------------------------------------------

    async def submit(
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
        """Submit a command under ``key``; the same key and payload always give one effect."""
        body = command_body(type, resource, payload, key, intent, context, expires_in)
        response = await self._request(
            "POST",
            "/api/v1/commands",
            json=body,
            headers={"Idempotency-Key": key},
            idempotent=True,
        )
        return Effect.from_json(
            response.json(), replayed=response.headers.get("Idempotent-Replayed") == "true"
        )

    async def get(self, effect_id: str) -> Effect:
        return Effect.from_json((await self._request("GET", f"/api/v1/effects/{effect_id}")).json())

    async def wait(
        self, effect: Effect | str, timeout: float, *, until: Iterable[str] | None = None
    ) -> Effect:
        """Long poll until the status is one of ``until`` (default: settled) or ``timeout``.
        Pass the ``Effect`` that ``submit`` answered to start from its status (one request
        fewer); an effect id is read first."""
        targets = frozenset(until) if until is not None else SETTLED
        until_param = ",".join(sorted(targets))
        deadline = time.monotonic() + max(timeout, 0.0)
        effect_id = effect.effect_id if isinstance(effect, Effect) else effect
        if not isinstance(effect, Effect):
            effect = await self.get(effect_id)
        while effect.status not in targets:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            poll = min(remaining, MAX_POLL)
            response = await self._request(
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

    async def list(
        self,
        *,
        status: str | Iterable[str] | None = None,
        type: str | None = None,
        owner: str | None = None,
        context: Mapping[str, str] | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> EffectPage:
        """One page of the tenant's effects, newest first (``GatewayClient.list``)."""
        params = list_params(status, type, owner, context, limit, cursor)
        return effect_page((await self._request("GET", "/api/v1/effects", params=params)).json())

    async def events(self, effect_id: str) -> builtins.list[dict[str, Any]]:
        return (await self._request("GET", f"/api/v1/effects/{effect_id}/events")).json()

    async def effect_types(self, *, permitted: bool = False) -> builtins.list[EffectType]:
        params = {"permitted": "true"} if permitted else None
        body = (await self._request("GET", "/api/v1/effect-types", params=params)).json()
        return [EffectType.from_json(item) for item in body.get("results", [])]

    async def approve(
        self,
        effect_id: str,
        payload_digest: str,
        comment: str = "",
        *,
        signature: dict[str, str] | None = None,
    ) -> Effect:
        body: dict[str, Any] = {"payload_digest": payload_digest, "comment": comment}
        if signature is not None:
            body["signature"] = signature
        return await self._action(effect_id, "approve", body)

    async def approval_challenge(self, effect_id: str, decision: str = "approve") -> dict[str, Any]:
        path = f"/api/v1/effects/{effect_id}/approval-challenge"
        return (await self._request("POST", path, json={"decision": decision})).json()

    async def reject(self, effect_id: str, reason: str = "") -> Effect:
        return await self._action(effect_id, "reject", {"reason": reason})

    async def cancel(self, effect_id: str, reason: str = "") -> Effect:
        return await self._action(effect_id, "cancel", {"reason": reason})

    async def compensate(self, effect_id: str, reason: str) -> Effect:
        """Issue the contract's compensator as a new command; answers the compensating effect.
        Asking again replays it, so this request is retried like a submission."""
        response = await self._request(
            "POST",
            f"/api/v1/effects/{effect_id}/compensate",
            json={"reason": reason},
            idempotent=True,
        )
        return Effect.from_json(
            response.json(), replayed=response.headers.get("Idempotent-Replayed") == "true"
        )

    async def _action(self, effect_id: str, action: str, body: dict[str, Any]) -> Effect:
        response = await self._request("POST", f"/api/v1/effects/{effect_id}/{action}", json=body)
        return Effect.from_json(response.json())

    # -- transport -----------------------------------------------------------------------

    async def _request(
        self,
        method: str,
        path: str,
        *,
        idempotent: bool | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        if idempotent is None:
            idempotent = method == "GET"
        attempt = 0
        while True:
            attempt += 1
            try:
                response = await self._http.request(
                    method, path, timeout=timeout or self.timeout, **kwargs
                )
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
                if attempt > self.retries:
                    raise GatewayUnavailable(
                        f"cannot reach the gateway at {self.base_url}: {exc}"
                    ) from exc
                await self._sleep(attempt)
                continue
            except httpx.TransportError as exc:
                if not idempotent or attempt > self.retries:
                    raise GatewayUnavailable(
                        f"the gateway at {self.base_url} did not answer: {exc}"
                    ) from exc
                await self._sleep(attempt)
                continue
            if response.status_code < 400:
                return response
            retry_after = _retry_after(response)
            if response.status_code in RETRY_STATUSES and attempt <= self.retries:
                await self._sleep(attempt, retry_after)
                continue
            raise _problem(response, retry_after)

    async def _sleep(self, attempt: int, retry_after: float | None = None) -> None:
        if retry_after is not None:
            await asyncio.sleep(min(retry_after, self.max_backoff * 3))
            return
        ceiling = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
        await asyncio.sleep(random.uniform(ceiling / 2, ceiling))
