"""The news of status changes (gateway.moves): every path that changes a status publishes it
after commit, and a long poll wakes on it instead of polling. Real Redis (the broker's), real
threads, real commits; the pauses a wait would otherwise poll at are made longer than the
test's patience, so that only the news can end a wait in time."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from functools import partial

import pytest
import redis
from django.db import connection

from gateway import dispatcher, ledger, moves, services
from gateway.api import views
from gateway.choices import SETTLED
from gateway.lib import broker
from gateway.models import Effect
from tests.conftest import TICKET, Persona

pytestmark = pytest.mark.django_db(transaction=True)


def submit(persona: Persona, title: str) -> str:
    body = {**TICKET, "payload": {**TICKET["payload"], "title": title}}
    response = persona.submit(body, f"key:{title}")
    assert response.status_code == 201, response.json()
    return response.json()["effect_id"]


class Heard:
    """What the channel carries while the block runs, read by a subscriber of the test's own."""

    def __init__(self) -> None:
        self.client = redis.Redis.from_url(broker.url(), socket_timeout=5)
        self.pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        self.pubsub.subscribe(moves.channel())
        self.pubsub.get_message(timeout=2)  # the subscription's confirmation

    def ids(self, settle: float = 0.3) -> list[str]:
        found, deadline = [], time.monotonic() + settle
        while (left := deadline - time.monotonic()) > 0:
            message = self.pubsub.get_message(timeout=left)
            if message and message["type"] == "message":
                found += message["data"].decode().split(",")
        return found

    def close(self) -> None:
        self.pubsub.close()
        self.client.close()


@pytest.fixture(autouse=True)
def _publishing(monkeypatch):
    """Each test publishes from a fresh start: not resting after an earlier test's broker
    that was down."""
    monkeypatch.setattr(moves, "_unpublished", moves._Unpublished())


@pytest.fixture
def heard() -> Iterator[Heard]:
    listening = Heard()
    yield listening
    listening.close()


@pytest.fixture
def patient_polls(monkeypatch):
    """A wait that hears no news looks at the status only after 30 s."""
    monkeypatch.setattr(views, "FIRST_PAUSE", 30.0)
    monkeypatch.setattr(views, "LONGEST_PAUSE", 30.0)
    monkeypatch.setattr(moves, "FALLBACK_PAUSE", 30.0)


def subscribed() -> None:
    moves.listener.start()
    deadline = time.monotonic() + 5
    while not moves.listener.subscribed:
        assert time.monotonic() < deadline, "the listener did not subscribe"
        time.sleep(0.01)


def status_of(effect_id: str) -> str | None:
    """The wait's look by id: these tests are about its timing, not about its tenant (the
    request paths pass scoped reads: tests/gateway/test_effects_api.py)."""
    return Effect.objects.filter(pk=effect_id).values_list("status", flat=True).first()


class Waiting(threading.Thread):
    """``_wait_for_change`` on its own thread (and database connection), timed."""

    def __init__(self, effect_id: str, seconds: float, until: frozenset[str] | None = None) -> None:
        super().__init__(daemon=True)
        self.effect_id = effect_id
        self.seconds = seconds
        self.until = until
        self.status = ""
        self.took = float("inf")

    def run(self) -> None:
        try:
            # As the API does it: listening, then the read, then the wait.
            with moves.news_of(self.effect_id) as moved:
                effect = Effect.objects.get(pk=self.effect_id)
                started = time.monotonic()
                self.status = views._wait_for_change(
                    effect.status,
                    self.seconds,
                    moved,
                    read=partial(Effect.objects.get, pk=effect.pk),
                    look=partial(status_of, effect.pk),
                    until=self.until,
                ).status
                self.took = time.monotonic() - started
        finally:
            connection.close()

    def open(self) -> Waiting:
        self.start()
        # Registered and waiting (nothing changed yet).
        deadline = time.monotonic() + 5
        while self.effect_id not in moves.listener._waiting:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        time.sleep(0.1)
        return self


def cancelled_while_waited_on(agent: Persona, title: str) -> Waiting:
    """An effect cancelled by its agent while a wait is on it; the wait, ended (or given up)."""
    effect_id = submit(agent, title)
    waiting = Waiting(effect_id, seconds=20).open()
    services.effect_cancel(
        effect=Effect.objects.get(pk=effect_id), principal=agent.principal, reason="no longer"
    )
    waiting.join(10)
    return waiting


def test_a_wait_wakes_on_the_news_of_a_transition(agent, patient_polls):
    subscribed()
    waiting = cancelled_while_waited_on(agent, "cancelled while waited on")
    assert waiting.status == "CANCELLED"
    assert waiting.took < 5  # the news, not the 30 s pause nor the 20 s wait


def test_a_wait_until_settled_sleeps_through_the_statuses_between(sandbox, agent, patient_polls):
    # Claimed (DISPATCHING), then recorded (CONFIRMED): two pieces of news, one answer.
    subscribed()
    effect_id = submit(agent, "settled while waited on")
    waiting = Waiting(effect_id, seconds=20, until=SETTLED).open()
    services.effect_dispatch(effect_id=effect_id, worker="test")
    waiting.join(10)
    assert waiting.status == "CONFIRMED" and waiting.took < 5


def test_a_wait_without_news_still_sees_the_change_by_looking(agent, monkeypatch):
    # The listener cannot reach Redis (and nothing is published): the wait polls as before.
    monkeypatch.setattr(moves, "published", lambda effect_ids: None)
    monkeypatch.setattr(moves.Listener, "subscribed", property(lambda self: False))
    waiting = cancelled_while_waited_on(agent, "cancelled unannounced")
    assert waiting.status == "CANCELLED"
    assert waiting.took < 3  # a look within the growing pauses (at most 0.5 s apart)


def test_news_that_never_came_costs_the_wait_its_fallback_pause(agent, monkeypatch):
    subscribed()
    monkeypatch.setattr(moves, "FALLBACK_PAUSE", 0.3)
    monkeypatch.setattr(moves, "published", lambda effect_ids: None)  # the message is lost
    waiting = cancelled_while_waited_on(agent, "cancelled with the news lost")
    assert waiting.status == "CANCELLED" and waiting.took < 3


def test_the_fast_dispatch_publishes_the_claim_and_the_record(sandbox, agent, heard):
    effect_id = submit(agent, "sent alone")
    services.effect_dispatch(effect_id=effect_id, worker="test")
    assert Effect.objects.get(pk=effect_id).status == "CONFIRMED"
    assert heard.ids() == [effect_id, effect_id]  # DISPATCHING, then CONFIRMED


def test_a_drain_publishes_its_claims_and_its_records_a_message_each(sandbox, agent, heard):
    ids = [submit(agent, f"drained {n}") for n in range(4)]
    assert dispatcher.drain(flag=None, worker="test") == 4
    assert set(Effect.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"CONFIRMED"}
    news = heard.ids()
    # Every effect twice (claimed, recorded), in fewer messages than effects × 2 when batched.
    assert sorted(news) == sorted(ids * 2)


def test_the_general_path_publishes_every_transition_after_commit(agent, heard):
    from django.db import transaction

    effect_id = submit(agent, "cancelled in a transaction")
    with transaction.atomic():
        effect = Effect.objects.select_for_update().get(pk=effect_id)
        assert ledger.transition(effect, to="CANCELLED", actor="test", reason="test")
        assert heard.ids(settle=0.2) == []  # not before the commit
    assert heard.ids() == [effect_id]


def test_a_broker_that_is_down_loses_the_news_not_the_transition(agent, monkeypatch):
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    monkeypatch.setattr(broker, "client", lambda: dead)
    effect_id = submit(agent, "cancelled with the broker down")
    services.effect_cancel(
        effect=Effect.objects.get(pk=effect_id), principal=agent.principal, reason="no longer"
    )
    assert Effect.objects.get(pk=effect_id).status == "CANCELLED"


def test_the_listener_wakes_only_the_waits_on_the_effects_named():
    listener = moves.Listener()
    listener.start = lambda: None  # type: ignore[method-assign]  (no thread, no Redis)
    with listener.watching("eff_a") as a, listener.watching("eff_b") as b:
        assert listener.wake(b"eff_a,eff_c") == 1
        assert a.is_set() and not b.is_set()
    assert listener._waiting == {}  # a wait that ended leaves nothing behind


def test_publishing_often_keeps_working(heard):
    # Each message packed on its own connection object ran out of the pool's 100 (redis-py 8)
    # after a hundred status changes in a process.
    for n in range(150):
        moves.published([f"eff_{n}"])
    assert heard.ids() == [f"eff_{n}" for n in range(150)]


def test_a_broker_that_does_not_answer_holds_one_publish_not_each(monkeypatch):
    # A partition: the connection is accepted (the backlog) and nothing ever answers. Every
    # publish waited out the socket's timeout twice (its retry), between a claim and its
    # provider call; after a failure the publishes rest, and the waits look for themselves.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    hanging = redis.Redis(
        host="127.0.0.1",
        port=silent.getsockname()[1],
        socket_timeout=0.2,
        socket_connect_timeout=0.2,
    )
    monkeypatch.setattr(broker, "client", lambda: hanging)
    try:
        for n in range(10):
            moves.published([f"eff_{n}"])
        silent.settimeout(0.2)
        tried = 0
        with contextlib.suppress(TimeoutError):
            while True:
                silent.accept()[0].close()
                tried += 1
    finally:
        silent.close()
    assert tried == 2  # the first publish and its retry; the nine after it rest
    assert moves._unpublished.lost == 10
