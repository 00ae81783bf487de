"""A real Redis stopped mid-run: submissions answer as with Redis up (nothing on the submission
path needs the broker), /readyz says what degraded, and the effects submitted meanwhile are
dispatched soon after the broker is back, by a real worker, each exactly once."""

from __future__ import annotations

import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.cache import caches
from django.db import connection

from gateway.celery import app as celery_app
from gateway.embedded import Valkey
from gateway.lib import broker
from gateway.models import Effect
from tests.support.processes import Celery, new_queue, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


class Broker:
    """A Valkey of the test's own, on a unix socket, that the test stops and starts again."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="eg-redis-down-"))
        self.root.chmod(0o755)
        self.server = Valkey(self.root / "valkey", self.root / "run")

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> None:
        self.server.start(fix="the test's own broker")

    def kill(self) -> None:
        self.server.stop(signal.SIGKILL)


@pytest.fixture
def own_broker(settings) -> Iterator[Broker]:
    """The app, the cache and the test's workers all on a broker the test can stop."""
    server = Broker()
    server.start()
    previous = celery_app.conf.task_default_queue, celery_app.conf.broker_url
    settings.CELERY_BROKER_URL = server.url
    settings.CACHES = {
        "default": {
            "BACKEND": "gateway.lib.cache.DegradingRedisCache",
            "LOCATION": server.url.replace("redis+socket://", "unix://"),
        }
    }
    celery_app.conf.broker_url = server.url
    celery_app.conf.task_default_queue = new_queue()
    broker.client.cache_clear()
    yield server
    server.kill()
    celery_app.conf.task_default_queue, celery_app.conf.broker_url = previous
    broker.client.cache_clear()
    caches["default"].close()
    shutil.rmtree(server.root, ignore_errors=True)


def statuses(ids: list[str]) -> set[str]:
    connection.close()  # read what the worker committed
    return set(Effect.objects.filter(pk__in=ids).values_list("status", flat=True))


def ticket(ticket_body: dict, title: str) -> dict:
    return {**ticket_body, "payload": {**ticket_body["payload"], "title": title}}


def test_submissions_answer_as_usual_while_redis_is_down(
    sandbox, agent, ticket_body, own_broker, tmp_path
):
    env = {
        "CELERY_BROKER_URL": own_broker.url,
        "GATEWAY_CACHE_URL": own_broker.url.replace("redis+socket://", "unix://"),
    }
    worker = Celery("worker", celery_app.conf.task_default_queue, tmp_path / "w.log", **env)
    try:
        before = agent.submit(ticket(ticket_body, "before"), "before")
        assert before.status_code == 201, before.content
        wait_until(
            lambda: statuses([before.json()["effect_id"]]) == {"CONFIRMED"},
            timeout=60,
            what="the first effect CONFIRMED",
        )

        own_broker.kill()
        answers = [agent.submit(ticket(ticket_body, f"down-{i}"), f"down-{i}") for i in range(8)]
        assert [a.status_code for a in answers] == [201] * 8, [a.content for a in answers]
        replay = agent.submit(ticket(ticket_body, "down-0"), "down-0")
        assert replay.status_code == 200
        mismatch = agent.submit(ticket(ticket_body, "other"), "down-0")
        assert mismatch.status_code == 422
        ready = agent.client.get("/readyz").json()
        assert ready["status"] == "degraded", ready
        assert ready["checks"]["cache"].startswith("degraded"), ready
        assert ready["checks"]["broker"].startswith("error"), ready
        ids = [a.json()["effect_id"] for a in answers]
        assert statuses(ids) == {"PREPARED"}

        own_broker.start()
        back = time.monotonic()
        wait_until(lambda: statuses(ids) == {"CONFIRMED"}, timeout=60, what="all CONFIRMED")
        settled = time.monotonic() - back
        print(f"dispatched {settled:.1f} s after the broker came back")
        # The target is 5 s; the bound leaves room for a busy two-core machine.
        assert settled < 15, f"dispatched {settled:.1f} s after the broker came back"
    finally:
        worker.stop()
    for effect in Effect.objects.filter(pk__in=ids).select_related("command"):
        assert len(sandbox.operations(idempotency_key=effect.command.provider_key)) == 1


def test_the_shared_cache_counts_in_process_while_redis_is_down_and_comes_back(own_broker):
    from gateway.lib.cache import DegradingRedisCache, cache_state

    cache = DegradingRedisCache(own_broker.url.replace("redis+socket://", "unix://"), {})
    assert cache.add("slots", 0) and cache.incr("slots") == 1
    assert cache_state(cache) == "ok"

    own_broker.kill()
    assert cache.get("slots") is None  # the shared count is out of reach: counted afresh
    assert cache.add("slots", 0) and cache.incr("slots") == 1 and cache.incr("slots") == 2
    assert cache_state(cache).startswith("degraded: per-process counters since")

    own_broker.start()
    cache.RETRY_SECONDS = 0  # ask Redis at the next call instead of two seconds later
    assert cache.get("slots") is None  # Redis (restarted empty) answers again
    assert cache_state(cache) == "ok"
    cache.close()
