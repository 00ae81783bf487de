"""A revocation or a freeze reaches every web process at once, not at the end of the token
cache's TTL: it is published after commit, and each process that caches tokens listens.

The second web process is real (``manage.py runserver`` on the test database and broker) and
trusts what it has cached for a minute, so only the message can make it refuse in time."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from gateway.models import ApiToken
from tests.support.processes import ROOT, child_env, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


@pytest.fixture
def other_web_node(tmp_path) -> Iterator[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = (tmp_path / "web.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
        cwd=ROOT,
        env=child_env(GATEWAY_TOKEN_CACHE_TTL="60", DJANGO_DEBUG="false"),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            return httpx.get(f"{url}/healthz", timeout=1, trust_env=False).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(answers, timeout=60, what="the second web node")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=15)
        log.close()


def listed(url: str, token: str) -> int:
    response = httpx.get(
        f"{url}/api/v1/effects",
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
        trust_env=False,
    )
    return response.status_code


def refused_within(url: str, token: str, seconds: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if listed(url, token) in (401, 403):
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"the other web node still accepted the token after {seconds} s")


def test_a_revoked_token_is_refused_by_another_web_node_within_a_second(
    other_web_node, agent, admin
):
    assert listed(other_web_node, agent.token) == 200  # now cached there for a minute
    time.sleep(1.5)  # its listener subscribes when the first token is cached
    token_id = ApiToken.objects.get(principal=agent.principal, revoked_at__isnull=True).pk
    revoked = admin.client.post(f"/api/v1/tokens/{token_id}/revoke", {}, format="json")
    assert revoked.status_code == 200
    assert refused_within(other_web_node, agent.token, 1.0) < 1.0


def test_a_frozen_principal_is_refused_by_another_web_node_within_a_second(
    other_web_node, agent, operator
):
    assert listed(other_web_node, agent.token) == 200
    time.sleep(1.5)
    frozen = operator.client.post(
        f"/api/v1/principals/{agent.principal.name}/freeze", {"reason": "leak"}, format="json"
    )
    assert frozen.status_code == 200, frozen.content
    assert refused_within(other_web_node, agent.token, 1.0) < 1.0
