"""What one effect costs the database, pinned so that it cannot creep back: a submission and
its dispatch in at most 10 round trips and 3 commits; a replay in one query that writes
nothing. Counted with CaptureQueriesContext (statements) and tests.support.querycount (the BEGIN
and COMMIT round trips a transaction adds, and the commits)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from gateway import services
from gateway.models import Attempt, Command, Effect, EffectEvent, Receipt
from tests.conftest import TICKET
from tests.support.querycount import count_round_trips

pytestmark = [pytest.mark.django_db(transaction=True)]


def ticket(title: str) -> dict:
    return {**TICKET, "payload": {**TICKET["payload"], "title": title}}


@pytest.fixture
def warm(agent, settings):
    """Steady state: the token and the agent's grants are in this process's cache (5 s)."""
    settings.GATEWAY_TOKEN_CACHE_TTL = 5
    assert agent.submit(ticket("warm"), "warm").status_code == 201
    return agent


def row_counts() -> tuple[int, ...]:
    return tuple(m.objects.count() for m in (Command, Effect, EffectEvent, Attempt, Receipt))


def test_an_effect_costs_at_most_ten_round_trips_and_three_commits(warm, sandbox):
    with CaptureQueriesContext(connection) as statements, count_round_trips() as counted:
        response = warm.submit(ticket("counted"), "t1")
        assert response.status_code == 201
        effect_id = response.json()["effect_id"]
        assert services.effect_dispatch(effect_id=effect_id, worker="test")
    effect = Effect.objects.select_related("command").get(pk=effect_id)
    assert effect.status == "CONFIRMED"
    assert len(sandbox.operations(idempotency_key=effect.command.provider_key)) == 1
    assert len(statements.captured_queries) == len(counted.statements)
    report = "\n".join(query["sql"][:120] for query in statements.captured_queries)
    print(f"one effect: {counted.summary()}")
    assert counted.round_trips <= 10, f"{counted.summary()}:\n{report}"
    assert counted.commits <= 3, f"{counted.summary()}:\n{report}"


def test_a_batch_of_ten_costs_less_per_effect_than_one_effect_alone(warm, sandbox, monkeypatch):
    """A drainer's batch: one claim statement for the ten, one record statement for the
    answers that come back together, one claim that finds nothing left. One effect alone (the
    test above) costs two statements and two commits to dispatch; ten cost three of each."""
    from django.conf import settings

    from gateway import dispatcher

    _, window = dispatcher._process_state()
    monkeypatch.setattr(window, "size", settings.GATEWAY_DISPATCH_BATCH)  # a warm worker
    # The ten answers arrive within a second of the first: recorded together.
    monkeypatch.setattr(dispatcher, "GATHER_SECONDS", 1.0)
    dispatcher.drain(flag=None, worker="test")  # the warm-up's effect
    ids = [warm.submit(ticket(f"batch {i}"), f"b{i}").json()["effect_id"] for i in range(10)]
    with CaptureQueriesContext(connection) as statements, count_round_trips() as counted:
        assert dispatcher.drain(flag=None, worker="test") == 10
    assert set(Effect.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"CONFIRMED"}
    assert len(sandbox.operations()) == 11  # the warm-up's and these ten, once each
    assert len(statements.captured_queries) == len(counted.statements)
    report = "\n".join(query["sql"][:120] for query in statements.captured_queries)
    print(f"ten effects: {counted.summary()}")
    assert counted.round_trips <= 3, f"{counted.summary()}:\n{report}"
    assert counted.commits <= 3, f"{counted.summary()}:\n{report}"


def test_the_answer_to_a_submission_is_what_was_written(warm):
    response = warm.submit(ticket("answer"), "t2")
    body = response.json()
    effect = Effect.objects.select_related("command").get(pk=body["effect_id"])
    assert body["status"] == effect.status == "PREPARED"
    assert body["payload_digest"] == effect.command.payload_digest
    assert body["payload"] == ticket("answer")["payload"]
    assert body["created_at"].replace("Z", "+00:00") == effect.created_at.isoformat()
    assert body["receipt"] is None and body["requested_by"] == "refund-bot"


def test_a_replay_is_one_query_and_writes_nothing(warm, sandbox):
    first = warm.submit(ticket("replayed"), "t3").json()
    services.effect_dispatch(effect_id=first["effect_id"], worker="test")
    before = row_counts()
    with CaptureQueriesContext(connection) as statements:
        replay = warm.submit(ticket("replayed"), "t3")
    assert replay.status_code == 200
    assert replay.headers["Idempotent-Replayed"] == "true"
    body = replay.json()
    assert body["effect_id"] == first["effect_id"] and body["status"] == "CONFIRMED"
    assert body["receipt"]["provider_status"] == "succeeded"  # read in the same statement
    assert len(statements.captured_queries) == 1, statements.captured_queries
    assert row_counts() == before


def test_a_listener_the_fast_path_does_not_know_turns_it_off(warm, sandbox):
    """The claim and the record skip the after_transition listeners they account for; any
    other listener must be called, so the general path runs."""
    from gateway import fastpath, hooks

    heard: list[tuple[str, str]] = []

    def audit_listener(effect, *, from_status: str, to: str) -> None:
        heard.append((from_status, to))

    hooks.after_transition.register(audit_listener)
    try:
        assert not fastpath.enabled()
        effect_id = warm.submit(ticket("heard"), "t4").json()["effect_id"]
        assert services.effect_dispatch(effect_id=effect_id, worker="test")
    finally:
        hooks.after_transition._listeners.remove(audit_listener)
    assert fastpath.enabled()
    assert heard == [("PREPARED", "DISPATCHING"), ("DISPATCHING", "CONFIRMED")]
    assert Effect.objects.get(pk=effect_id).status == "CONFIRMED"


def test_the_dispatch_sweep_costs_the_same_for_one_due_effect_as_for_twenty(warm, monkeypatch):
    from datetime import timedelta

    from django.utils import timezone

    from gateway import hooks

    sent: list[str] = []
    monkeypatch.setattr(hooks.dispatch_sender, "send", sent.append)
    woken: list[str] = []
    monkeypatch.setattr(hooks.wake_sender, "send", woken.append)

    def sweep_statements(count: int) -> int:
        ids = [
            warm.submit(ticket(f"due {count}-{i}"), f"due:{count}:{i}").json() for i in range(count)
        ]
        Effect.objects.filter(pk__in=[i["effect_id"] for i in ids]).update(
            next_dispatch_at=timezone.now() - timedelta(seconds=1)
        )
        sent.clear()
        woken.clear()
        with CaptureQueriesContext(connection) as statements:
            assert services.dispatch_sweep() == count
        # Overdue for the first time: one wake-up for a drainer, whatever the count.
        assert (sent, woken) == ([], [f"sweep: {count} overdue"])
        return len(statements.captured_queries)

    assert sweep_statements(1) == sweep_statements(20)


def test_with_the_fast_path_off_the_general_path_does_the_same(warm, sandbox, settings):
    settings.GATEWAY_FAST_PATH = False
    with count_round_trips() as counted:
        response = warm.submit(ticket("general"), "t5")
        effect_id = response.json()["effect_id"]
        assert services.effect_dispatch(effect_id=effect_id, worker="test")
    assert response.status_code == 201
    assert Effect.objects.get(pk=effect_id).status == "CONFIRMED"
    assert counted.round_trips > 10  # what the fast path saves
