"""Issue 13 item 8: long polls cannot starve the web tier. Open waits are capped per token
and per web process (429 + Retry-After), over a real socket and real threads."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from django.core.cache import cache

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def caps(settings):
    cache.clear()
    settings.GATEWAY_MAX_WAIT = 3
    settings.GATEWAY_MAX_WAITS_PER_TOKEN = 2
    settings.GATEWAY_MAX_WAITS_PER_PROCESS = 3
    yield settings
    cache.clear()


def get(url: str, token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(url, headers=headers, timeout=30, trust_env=False)


def test_waits_are_capped_per_token_and_per_process(
    live_server, caps, agent, other_agent, refund_body
):
    # An effect awaiting approval: its status will not change while we wait on it.
    body = {**refund_body, "payload": {**refund_body["payload"], "amount": 50_000}}
    effect_id = agent.submit(body, "big").json()["effect_id"]
    url = f"{live_server.url}/api/v1/effects/{effect_id}?wait=3"
    with ThreadPoolExecutor(max_workers=8) as pool:
        mine = [pool.submit(get, url, agent.token) for _ in range(5)]
        time.sleep(1.0)  # the two admitted waits are open now
        theirs = [pool.submit(get, url, other_agent.token) for _ in range(2)]
        time.sleep(0.3)
        started = time.monotonic()
        health = get(f"{live_server.url}/healthz")
        health_seconds = time.monotonic() - started
        mine_codes = sorted(f.result().status_code for f in mine)
        theirs_codes = sorted(f.result().status_code for f in theirs)
    assert mine_codes == [200, 200, 429, 429, 429]
    # The process cap (3) leaves one slot for the other token while two of mine are open.
    assert theirs_codes == [200, 429]
    refused = [f.result() for f in mine if f.result().status_code == 429]
    assert all(int(r.headers["Retry-After"]) >= 1 for r in refused)
    assert refused[0].json()["type"].endswith("rate-limited")
    assert health.status_code == 200
    print(f"/healthz answered in {health_seconds * 1000:.1f} ms with 3 waits open")
    # Slots are given back: the same token may wait again.
    again = get(f"{live_server.url}/api/v1/effects/{effect_id}?wait=0.2", agent.token)
    assert again.status_code == 200


@pytest.mark.parametrize("wait", ["nan", "inf", "-1", "soon"])
def test_a_bad_wait_is_400(agent, refund_body, wait):
    effect_id = agent.submit(refund_body, "k").json()["effect_id"]
    assert agent.client.get(f"/api/v1/effects/{effect_id}?wait={wait}").status_code == 400


def test_a_wait_that_would_answer_at_once_needs_no_slot(caps, agent, ticket_body):
    # No slot left on this process: every wait is 429 — except one for an effect that has
    # already left the status the caller saw, which answers without waiting at all.
    caps.GATEWAY_MAX_WAITS_PER_PROCESS = 0
    effect_id = agent.submit(ticket_body, "t").json()["effect_id"]  # PREPARED
    path = f"/api/v1/effects/{effect_id}"
    assert agent.client.get(f"{path}?wait=1&seen=PREPARED").status_code == 429
    moved_on = agent.client.get(f"{path}?wait=1&seen=DISPATCHING")
    assert moved_on.status_code == 200 and moved_on.json()["status"] == "PREPARED"
