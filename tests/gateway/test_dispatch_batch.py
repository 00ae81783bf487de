"""Batch dispatch (gateway.dispatcher, gateway.fastpath_batch): a drainer claims many due
effects per statement, sends them concurrently and records their answers in batches. The
sandbox's operation log is the oracle for "sent once"; the single claim of gateway.fastpath is
the oracle for "the same checks"."""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime, timedelta
from types import SimpleNamespace
from zoneinfo import ZoneInfo

import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from gateway import capabilities, dispatcher, fastpath, fastpath_batch, hooks, services
from gateway.checkpoints import receipt_seal
from gateway.choices import Outcome
from gateway.lib import broker
from gateway.models import Attempt, Capability, Effect, EffectEvent, Principal, Receipt
from gateway.providers.base import CallResult, ProviderOperation
from tests.conftest import REFUND, TICKET, Persona

pytestmark = pytest.mark.django_db


def ticket(title: str, **extra) -> dict:
    return {**TICKET, "payload": {**TICKET["payload"], "title": title}, **extra}


def submit(persona: Persona, title: str, **extra) -> str:
    response = persona.submit(ticket(title, **extra), f"key:{title}")
    assert response.status_code == 201, response.json()
    return response.json()["effect_id"]


def approved_refund(agent: Persona, approver: Persona, title: str, *, age: float = 0) -> str:
    """A refund over the approval threshold, approved ``age`` seconds ago."""
    body = {**REFUND, "payload": {**REFUND["payload"], "amount": 50_000, "reason": title}}
    response = agent.submit(body, f"key:{title}")
    assert response.json()["status"] == "AWAITING_APPROVAL"
    effect = Effect.objects.select_related("command").get(pk=response.json()["effect_id"])
    services.effect_approve(
        effect=effect, principal=approver.principal, payload_digest=effect.command.payload_digest
    )
    Effect.objects.filter(pk=effect.pk).update(approved_at=timezone.now() - timedelta(seconds=age))
    return effect.pk


def status(effect_id: str) -> str:
    return Effect.objects.get(pk=effect_id).status


def sent_keys(sandbox) -> Counter[str]:
    return Counter(op["idempotency_key"] for op in sandbox.operations())


def key_of(effect_id: str) -> str:
    return Effect.objects.select_related("command").get(pk=effect_id).command.provider_key


@pytest.fixture
def full_window():
    """A worker process that has recorded a few batches: its window is at full width."""
    _, window = dispatcher._process_state()
    previous, window.size = window.size, django_settings.GATEWAY_DISPATCH_BATCH
    yield window
    window.size = previous


def test_a_drain_sends_every_due_effect_once_and_claims_them_in_one_statement(
    sandbox, agent, full_window
):
    ids = [submit(agent, f"t{i}") for i in range(12)]
    with CaptureQueriesContext(connection) as statements:
        assert dispatcher.drain(flag=None, worker="test") == 12
    assert {status(effect_id) for effect_id in ids} == {"CONFIRMED"}
    assert sent_keys(sandbox) == Counter({key_of(effect_id): 1 for effect_id in ids})
    for effect_id in ids:
        assert Attempt.objects.filter(effect_id=effect_id).count() == 1
        assert EffectEvent.objects.filter(effect_id=effect_id, kind="claimed").count() == 1
        assert EffectEvent.objects.filter(effect_id=effect_id, kind="dispatched").count() == 1
    claims = [q for q in statements.captured_queries if "WITH due AS" in q["sql"]]
    # One claim for the twelve, one that finds nothing left.
    assert len(claims) == 2, [q["sql"][:60] for q in statements.captured_queries]


def test_the_window_opens_one_effect_at_a_time(sandbox, agent):
    """A fresh worker process claims one effect, then more as answers come back: a worker
    that keeps dying strands one claim per life, not a batch."""
    _, window = dispatcher._process_state()
    previous, window.size = window.size, 1
    try:
        ids = [submit(agent, f"t{i}") for i in range(7)]
        assert dispatcher.drain(flag=None, worker="test") == 7
        claims = Counter(
            Attempt.objects.filter(effect_id__in=ids).values_list("started_at", flat=True)
        )
        sizes = [claims[started] for started in sorted(claims)]
        assert sizes[0] == 1 and sizes[1] <= 2, sizes
        assert window.size == 8  # one more per answer
    finally:
        window.size = previous
    assert {status(effect_id) for effect_id in ids} == {"CONFIRMED"}


def test_a_batch_sends_what_it_may_and_leaves_or_hands_over_the_rest(
    sandbox, agent, approver, operator, full_window, settings
):
    plain = [submit(agent, "plain 1"), submit(agent, "plain 2")]
    approved = approved_refund(agent, approver, "approved")
    frozen = submit(agent, "frozen")
    services.effect_set_frozen(
        effect=Effect.objects.select_related("command").get(pk=frozen),
        principal=operator.principal,
        frozen=True,
    )
    over_budget = submit(agent, "over budget")
    Effect.objects.filter(pk=over_budget).update(
        status="NOT_STARTED", attempt_count=5, next_dispatch_at=timezone.now()
    )
    expired = submit(agent, "expired", expires_in=1)
    approval_old = approved_refund(
        agent, approver, "approval too old", age=settings.GATEWAY_APPROVAL_TTL + 5
    )
    saga_step = services.command_submit(
        principal=agent.principal,
        idempotency_key="saga step",
        type="ticket.create",
        resource=TICKET["resource"],
        payload={"title": "saga step", "priority": "P3"},
        saga_id="saga_none",
        saga_step="notify",
    ).effect.pk
    revoked_agent = Persona("acme", "revoked-bot", "agent")
    revoked = submit(revoked_agent, "revoked")
    Capability.objects.filter(principal=revoked_agent.principal).update(revoked_at=timezone.now())
    frozen_agent = Persona("acme", "frozen-bot", "agent")
    held = submit(frozen_agent, "principal frozen")
    capabilities.principal_set_frozen(
        target=frozen_agent.principal, principal=operator.principal, frozen=True
    )
    time.sleep(1.1)  # "expired" runs out

    assert dispatcher.drain(flag=None, worker="test") == 3

    assert [status(e) for e in [*plain, approved]] == ["CONFIRMED"] * 3
    assert status(frozen) == "PREPARED"  # held: not even locked
    assert status(held) == "PREPARED"
    assert status(saga_step) == "PREPARED"  # a saga's steps are sent one by one
    # Picked, not claimed: the general path decided each.
    assert status(expired) == "EXPIRED"
    assert status(revoked) == "REJECTED"
    assert status(approval_old) == "AWAITING_APPROVAL"
    budget = Effect.objects.get(pk=over_budget)
    assert (budget.status, budget.escalated, budget.next_dispatch_at) == ("NOT_STARTED", True, None)
    assert sent_keys(sandbox) == Counter({key_of(e): 1 for e in [*plain, approved]})


REFUSALS = {
    # held: not picked at all
    "frozen": True,
    "principal frozen": True,
    "type frozen": True,
    "saga step": True,
    # picked, and handed to the general path
    "over budget": False,
    "expired": False,
    "revoked": False,
    "approval too old": False,
}


@pytest.mark.parametrize("case", REFUSALS)
def test_the_batch_claim_refuses_what_the_single_claim_refuses(
    case, sandbox, agent, approver, operator, full_window, settings
):
    if case == "approval too old":
        effect_id = approved_refund(agent, approver, case, age=settings.GATEWAY_APPROVAL_TTL + 5)
    elif case == "saga step":
        effect_id = services.command_submit(
            principal=agent.principal,
            idempotency_key=case,
            type="ticket.create",
            resource=TICKET["resource"],
            payload={"title": case, "priority": "P3"},
            saga_id="saga_none",
            saga_step="notify",
        ).effect.pk
    else:
        effect_id = submit(agent, case, **({"expires_in": 1} if case == "expired" else {}))
    before = status(effect_id)
    if case == "frozen":
        Effect.objects.filter(pk=effect_id).update(frozen=True)
    elif case == "principal frozen":
        Principal.objects.filter(pk=agent.principal.pk).update(frozen=True)
    elif case == "type frozen":
        capabilities.effect_type_set_frozen(
            tenant_id=agent.principal.tenant_id,
            effect_type="ticket.create",
            principal=operator.principal,
            frozen=True,
        )
    elif case == "over budget":
        Effect.objects.filter(pk=effect_id).update(attempt_count=5)
    elif case == "expired":
        time.sleep(1.1)
    elif case == "revoked":
        Capability.objects.filter(principal=agent.principal).update(revoked_at=timezone.now())
    assert fastpath.claim(effect_id=effect_id, worker="single") is None
    batch = fastpath_batch.claim_batch(limit=16, worker="batch")
    assert batch.claims == []
    assert batch.refused == ([] if REFUSALS[case] else [effect_id])
    assert status(effect_id) == before == "PREPARED"
    assert sandbox.log() == []


def test_a_not_started_effect_waits_for_its_backoff(sandbox, agent, full_window):
    effect_id = submit(agent, "retry later")
    later = timezone.now() + timedelta(seconds=60)
    Effect.objects.filter(pk=effect_id).update(status="NOT_STARTED", next_dispatch_at=later)
    assert fastpath_batch.claim_batch(limit=16, worker="test").picked == 0
    Effect.objects.filter(pk=effect_id).update(next_dispatch_at=timezone.now())
    assert dispatcher.drain(flag=None, worker="test") == 1
    assert status(effect_id) == "CONFIRMED"


def test_a_stale_batch_record_writes_nothing_and_the_refusal_is_recorded(sandbox, agent):
    from gateway.choices import Outcome
    from gateway.providers.base import CallResult

    effect_id = submit(agent, "slow worker")
    (claim,) = fastpath_batch.claim_batch(limit=1, worker="slow").claims
    # Meanwhile the lease ran out: recovery made it UNKNOWN and moved the fence on.
    Effect.objects.filter(pk=effect_id).update(status="UNKNOWN", fence=claim.fence + 1)
    late = CallResult(Outcome.CONFIRMED, "provider status succeeded", http_status=201)
    answer = fastpath_batch.Answer(claim, late, {"confirmed_at": timezone.now()})
    assert fastpath_batch.record_batch(answers=[answer], worker="slow", now=timezone.now()) == set()
    services.fast_record_general(claim, late, worker="slow")
    assert status(effect_id) == "UNKNOWN"
    assert EffectEvent.objects.filter(effect_id=effect_id, kind="stale_write_refused").exists()
    assert Attempt.objects.get(pk=claim.attempt_id).state == "stale"


# The outcomes a batch record binds, each with the values that bind differently: a nested
# result object, a null http status, a mismatch, a retry time; times at the microsecond in a
# zone that is not the database's.
_KOLKATA = ZoneInfo("Asia/Kolkata")
_AT = datetime(2026, 3, 4, 5, 6, 7, 123457, tzinfo=_KOLKATA)
_OUTCOMES = {
    "confirmed": (
        Outcome.CONFIRMED,
        {"ticket": {"id": "T-1", "tags": ["a", "é"], "n": 1.5}, "ok": True, "none": None},
        201,
        "",
        {"confirmed_at": _AT},
    ),
    "in progress, no status": (
        Outcome.IN_PROGRESS,
        None,
        None,
        "read timed out\nafter 5 s",
        {"next_check_at": _AT + timedelta(microseconds=1)},
    ),
    "mismatch": (Outcome.UNKNOWN, {}, 200, "", {"mismatch": True}),
    "not started": (
        Outcome.NOT_STARTED,
        None,
        503,
        "busy 'quoted' \"too\"",
        {"next_dispatch_at": _AT - timedelta(days=1)},
    ),
}


def _answer(claim: fastpath_batch.BatchClaim, name: str) -> fastpath_batch.Answer:
    outcome, result, http_status, error, fields = _OUTCOMES[name]
    operation = None
    if result is not None:
        digest = "sha256:other" if name == "mismatch" else claim.payload_digest
        operation = ProviderOperation(f"op-{claim.effect_id}", "succeeded", digest, result)
    call = CallResult(
        outcome, f"because {name}", operation, http_status, error, mismatch=name == "mismatch"
    )
    return fastpath_batch.Answer(claim, call, fields)


def _written(effect_id: str) -> dict:
    """What a record wrote for the effect, without what names the effect or its attempt."""
    effect = Effect.objects.get(pk=effect_id)
    event = EffectEvent.objects.get(effect_id=effect_id, kind="dispatched")
    attempt = Attempt.objects.get(effect_id=effect_id)
    receipt = Receipt.objects.filter(effect_id=effect_id).first()
    written = {
        "effect": [getattr(effect, name) for name in _EFFECT_FIELDS],
        "event": [event.to_status, event.actor, event.reason, event.data, event.created_at],
        "attempt": [attempt.state, attempt.outcome, attempt.http_status, attempt.error],
        "attempt finished": attempt.finished_at,
        "receipt": None,
    }
    written["event"][3] = {**event.data, "provider_operation_id": None}
    if effect.provider_operation_id:
        assert effect.provider_operation_id == attempt.provider_operation_id == f"op-{effect_id}"
    if receipt is not None:
        assert receipt.seal == receipt_seal(receipt) and receipt.attempt_id == attempt.pk
        written["receipt"] = [
            receipt.source,
            receipt.provider,
            receipt.provider_status,
            receipt.payload_digest == effect.command.payload_digest,
            receipt.digest_matches,
            receipt.result,
            receipt.result_digest,
            receipt.received_at,
        ]
    return written


_EFFECT_FIELDS = [
    "status",
    "status_changed_at",
    "updated_at",
    "lease_expires_at",
    "next_check_at",
    "next_dispatch_at",
    "mismatch",
    "confirmed_at",
]


def test_a_batch_record_writes_what_the_single_record_writes(sandbox, agent):
    """The single record (``fastpath.record``, one parameter per value) is the oracle for
    what the batch record's JSON rows bind."""
    ids = [submit(agent, f"oracle {n}") for n in range(2 * len(_OUTCOMES))]
    claims = {
        claim.effect_id: claim
        for claim in fastpath_batch.claim_batch(limit=len(ids), worker="w").claims
    }
    assert set(claims) == set(ids)
    now = timezone.now()  # in UTC, as the worker's: the seal covers its text
    batch, single = ids[::2], ids[1::2]
    answers = [_answer(claims[eid], name) for eid, name in zip(batch, _OUTCOMES, strict=True)]
    assert fastpath_batch.record_batch(answers=answers, worker="w", now=now) == set(batch)
    for effect_id, name in zip(single, _OUTCOMES, strict=True):
        answer = _answer(claims[effect_id], name)
        assert fastpath.record(
            claim=answer.claim, result=answer.result, worker="w", fields=answer.fields, now=now
        )
    for name, by_batch, by_single in zip(_OUTCOMES, batch, single, strict=True):
        assert _written(by_batch) == _written(by_single), name
    confirmed, in_progress, mismatch, not_started = map(_written, batch)
    assert confirmed["effect"][7] == _AT and confirmed["event"][4] == now
    assert confirmed["receipt"][5] == _OUTCOMES["confirmed"][1]
    assert in_progress["effect"][4] == _AT + timedelta(microseconds=1)
    assert in_progress["attempt"][2] is None and in_progress["receipt"] is None
    assert mismatch["effect"][6] is True and mismatch["receipt"][3:5] == [False, False]
    assert not_started["effect"][5] == _AT - timedelta(days=1)
    assert not_started["attempt"][3] == _OUTCOMES["not started"][3]


def test_a_compensation_claimed_in_a_batch_settles_its_original(
    sandbox, agent, operator, full_window
):
    original = submit(agent, "to compensate")
    assert dispatcher.drain(flag=None, worker="test") == 1
    effect = Effect.objects.select_related("command").get(pk=original)
    compensation = services.effect_compensate(
        effect=effect, principal=operator.principal, reason="opened by mistake"
    ).effect.pk
    assert dispatcher.drain(flag=None, worker="test") == 1
    assert status(compensation) == "CONFIRMED"
    assert status(original) == "COMPENSATED"


@pytest.fixture
def busy_call_pool(monkeypatch):
    """This process's call pool with all but one slot held (as other drainers would hold
    them), and its ``take`` calls counted."""
    pool, _ = dispatcher._process_state()
    held = pool.take(django_settings.GATEWAY_DISPATCH_CALLS - 1, wait_for_one=False)
    assert held == django_settings.GATEWAY_DISPATCH_CALLS - 1
    takes: list[int] = []
    real_take = pool.take

    def counting_take(*args, **kwargs) -> int:
        takes.append(real_take(*args, **kwargs))
        return takes[-1]

    monkeypatch.setattr(pool, "take", counting_take)
    busy = SimpleNamespace(pool=pool, held=held, takes=takes)
    yield busy
    pool.give(busy.held)


def test_a_drainer_that_finds_no_free_call_thread_waits_instead_of_polling(
    sandbox, agent, full_window, settings, busy_call_pool
):
    """Calls out, room in its window, but every other call thread busy: the drainer waits
    for an answer or a freed thread. It used to try for a slot again and again, without
    blocking, until one of its calls answered."""
    settings.GATEWAY_PROVIDER_TIMEOUT = 5
    sandbox.add_fault("slow", times=None, seconds=0.3)
    ids = [submit(agent, f"t{i}") for i in range(3)]
    with CaptureQueriesContext(connection) as statements:
        assert dispatcher.drain(flag=None, worker="test") == 3
    assert {status(effect_id) for effect_id in ids} == {"CONFIRMED"}
    # One effect at a time on the one free thread: per answer a take that claims and one
    # that finds the pool busy (then it waits), and the empty claim that ends the drain.
    assert len(busy_call_pool.takes) <= 4 * len(ids), Counter(busy_call_pool.takes)
    claims = [q for q in statements.captured_queries if "WITH due AS" in q["sql"]]
    assert len(claims) == len(ids) + 1


@pytest.mark.django_db(transaction=True)
def test_a_call_thread_that_comes_free_wakes_the_drainer_waiting_for_one(
    sandbox, agent, full_window, settings, busy_call_pool, monkeypatch
):
    """A slot given back by another drainer's call, not its own answer, lets a waiting
    drainer claim: new work does not wait behind its slow call."""
    import threading

    monkeypatch.setattr(hooks.due_sender, "_send", lambda effect_id: None)
    settings.GATEWAY_PROVIDER_TIMEOUT = 5
    sandbox.add_fault("slow", times=1, seconds=1.0)  # the first call sent
    ids = [submit(agent, f"t{i}") for i in range(2)]
    pool = busy_call_pool.pool

    def another_drainer_answers() -> None:
        # Only once the first call is out (the sandbox logs it before its slow answer) and
        # the drainer waits for a slot. The drainer registers as waiting before each try for
        # a slot, its first included: a slot given back then was taken with the first, both
        # calls left together, and which of them the sandbox slowed down was a coin toss.
        deadline = time.monotonic() + 10
        while (not sandbox.log() or not pool._hungry) and time.monotonic() < deadline:
            time.sleep(0.005)
        busy_call_pool.held -= 1
        pool.give(1)

    helper = threading.Thread(target=another_drainer_answers)
    helper.start()
    try:
        assert dispatcher.drain(flag=None, worker="test") == 2
    finally:
        helper.join()
        connection.close()
    slow_key = sandbox.log()[0]["idempotency_key"]  # the call the sandbox slowed down
    attempts = {
        key: (started, finished)
        for key, started, finished in Attempt.objects.filter(effect_id__in=ids).values_list(
            "effect__command__provider_key", "started_at", "finished_at"
        )
    }
    (_, slow_done) = attempts.pop(slow_key)
    [(fast_started, fast_done)] = attempts.values()
    assert fast_started < slow_done and fast_done < slow_done, (slow_done, attempts)


def test_the_batched_statements_fit_psycopgs_parse_cache():
    from psycopg import _queries

    for statement in (fastpath_batch._CLAIM_BATCH, fastpath_batch._RECORD_BATCH):
        assert len(statement.encode()) <= _queries.MAX_CACHED_STATEMENT_LENGTH


# --- the due signal ----------------------------------------------------------------------------


class FakeTask:
    """dispatch_due as announce_due sees it: an app's queue, and delay() (eager mode only)."""

    def __init__(self, queue: str, *, eager: bool = False) -> None:
        self.app = SimpleNamespace(
            conf=SimpleNamespace(task_always_eager=eager, task_default_queue=queue)
        )
        self.ran = 0

    def delay(self) -> None:
        self.ran += 1


@pytest.fixture
def queue():
    from tests.support.processes import new_queue

    name = new_queue()
    yield name
    flag = dispatcher.DueFlag(name)
    flag.clear()
    broker.client().delete(flag.wake_key)


def wake_ups(queue: str) -> list[bytes]:
    """The wake-ups waiting for the queue's drainers, oldest first."""
    return broker.client().lrange(dispatcher.DueFlag(queue).wake_key, 0, -1)


def test_while_the_flag_stands_submissions_wake_nobody(queue):
    task = FakeTask(queue)
    for index in range(5):
        dispatcher.announce_due(task, f"eff_{index}")
    assert wake_ups(queue) == [b"due"]
    dispatcher.DueFlag(queue).clear()  # a drainer ran out of work
    dispatcher.announce_due(task, "eff_next")
    assert wake_ups(queue) == [b"due", b"due"]
    assert task.ran == 0  # no broker message: the drainer threads pop the list


def test_a_redis_that_lost_its_scripts_still_gets_the_announce(queue):
    broker.client().script_flush()  # as after a restart
    assert dispatcher.DueFlag(queue).announce("after flush")
    assert wake_ups(queue) == [b"after flush"]


def test_a_connection_cut_under_the_flag_is_replaced(queue):
    """The thread's own connection to Redis broke (Redis restarted, a proxy timed it out):
    the next command reconnects instead of failing a submission."""
    flag = dispatcher.DueFlag(queue)
    client_id = broker.run(flag._command("CLIENT", "ID"))  # this thread's connection
    broker.client().client_kill_filter(_id=client_id)
    assert flag.announce("after the cut")
    assert wake_ups(queue) == [b"after the cut"]


def test_the_flag_and_its_wake_up_expire(queue, settings):
    settings.GATEWAY_DUE_FLAG_TTL = 0.2
    flag = dispatcher.DueFlag(queue)
    assert flag.announce("first")
    assert not flag.announce("second")
    assert 0 < broker.client().pttl(flag.key) <= 200
    # Nobody listening for a minute: the list goes, a starting worker announces anyway.
    assert 0 < broker.client().pttl(flag.wake_key) <= 60_000
    time.sleep(0.3)
    assert flag.announce("third")
    assert wake_ups(queue) == [b"first", b"third"]


def test_the_wake_up_list_keeps_the_newest_few(queue):
    flag = dispatcher.DueFlag(queue)
    for index in range(dispatcher._WAKE_KEEP + 10):
        flag.wake(f"help {index}")
    kept = wake_ups(queue)
    assert len(kept) == dispatcher._WAKE_KEEP
    assert kept[-1] == f"help {dispatcher._WAKE_KEEP + 9}".encode()


def test_in_eager_mode_the_drain_runs_in_process(queue):
    task = FakeTask(queue, eager=True)
    dispatcher.announce_due(task, "eff_1")
    assert task.ran == 1 and wake_ups(queue) == []


def test_a_broker_that_is_down_raises_and_sets_nothing(queue, monkeypatch):
    import redis

    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    monkeypatch.setattr(broker, "client", lambda: dead)
    dispatcher._announce_script.cache_clear()
    try:
        with pytest.raises(redis.ConnectionError):
            dispatcher.announce_due(FakeTask(queue), "eff_1")
    finally:
        monkeypatch.undo()
        dispatcher._announce_script.cache_clear()
    assert dispatcher.DueFlag(queue).announce("eff_2")  # nothing was left standing
    assert wake_ups(queue) == [b"eff_2"]


@pytest.mark.django_db(transaction=True)
def test_a_commit_that_finds_the_flag_set_is_claimed_by_the_drainer_that_clears_it(
    sandbox, agent, queue, monkeypatch, full_window
):
    """The coalescing argument of gateway.dispatcher, in its tightest spot: a submission
    commits just before the drainer clears the flag. It finds the flag set and publishes
    nothing; the drainer's claim after that clear must take it — no sweeper, no message."""
    task = FakeTask(queue)
    monkeypatch.setattr(hooks.due_sender, "_send", lambda effect_id: None)
    first = submit(agent, "first")
    dispatcher.announce_due(task, first)
    assert len(wake_ups(queue)) == 1  # the wake-up a drainer now answers
    flag = dispatcher.DueFlag(queue)
    racing: list[str] = []
    real_clear = flag.clear

    def commit_then_clear() -> None:
        if len(racing) < 2:  # the clears before its first claim and before its next to last
            racing.append(submit(agent, f"racing {len(racing)}"))
            dispatcher.announce_due(task, racing[-1])
        real_clear()

    monkeypatch.setattr(flag, "clear", commit_then_clear)
    dispatcher.drain(flag=flag, worker="test")
    assert len(wake_ups(queue)) == 1  # the racing submissions found the flag set
    effects = [first, *racing]
    assert [status(effect_id) for effect_id in effects] == ["CONFIRMED"] * 3
    assert sent_keys(sandbox) == Counter({key_of(effect_id): 1 for effect_id in effects})


@pytest.mark.django_db(transaction=True)
def test_a_broker_that_is_down_for_the_flag_still_answers_201(sandbox, agent, monkeypatch):
    import redis

    from gateway.celery import app

    # The flag's Redis refuses connections (not in eager mode, where no flag is used).
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    monkeypatch.setattr(broker, "client", lambda: dead)
    created = agent.submit(ticket("flag down"), "flag-down")
    assert created.status_code == 201, created.content
    effect_id = created.json()["effect_id"]
    assert status(effect_id) == "PREPARED"
    assert sandbox.log() == []
    # The sweeper sends it once it is due (one by one, no flag involved), here in process.
    previous, app.conf.task_always_eager = app.conf.task_always_eager, True
    try:
        Effect.objects.filter(pk=effect_id).update(next_dispatch_at=timezone.now())
        assert services.dispatch_sweep() == 1
    finally:
        app.conf.task_always_eager = previous
    assert status(effect_id) == "CONFIRMED"
    assert sent_keys(sandbox) == Counter({key_of(effect_id): 1})


# --- races on real threads ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_drainers_and_single_dispatches_send_each_effect_once(
    sandbox, agent, monkeypatch, full_window, settings
):
    import random
    import threading
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setattr(hooks.due_sender, "_send", lambda effect_id: None)
    sandbox.add_fault("slow", times=None, seconds=0.05)  # calls overlap the other claims
    settings.GATEWAY_PROVIDER_TIMEOUT = 5
    ids = [submit(agent, f"race {i}") for i in range(40)]
    barrier = threading.Barrier(8)
    flag = dispatcher.DueFlag(f"race-{random.random()}")

    def drainer(index: int) -> int:
        try:
            barrier.wait()
            return dispatcher.drain(flag=flag if index % 2 else None, worker=f"drainer{index}")
        finally:
            connection.close()

    def single(index: int) -> int:
        try:
            barrier.wait()
            order = random.Random(index).sample(ids, len(ids))
            return sum(
                services.effect_dispatch(effect_id=e, worker=f"single{index}") for e in order
            )
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=8) as pool:
        drained = [pool.submit(drainer, i) for i in range(4)]
        singles = [pool.submit(single, i) for i in range(4)]
        claimed = sum(f.result() for f in drained) + sum(f.result() for f in singles)
    assert claimed == len(ids)  # each effect claimed by exactly one of them
    assert {status(effect_id) for effect_id in ids} == {"CONFIRMED"}
    assert sent_keys(sandbox) == Counter({key_of(effect_id): 1 for effect_id in ids})
    for effect_id in ids:
        assert Attempt.objects.filter(effect_id=effect_id).count() == 1
        assert EffectEvent.objects.filter(effect_id=effect_id, kind="claimed").count() == 1


def test_with_the_fast_path_off_a_drain_sends_each_due_effect_the_general_way(
    sandbox, agent, settings
):
    settings.GATEWAY_FAST_PATH = False
    ids = [submit(agent, f"general {i}") for i in range(3)]
    with CaptureQueriesContext(connection) as statements:
        assert dispatcher.drain(flag=None, worker="test") == 3
    assert not [q for q in statements.captured_queries if "WITH due AS" in q["sql"]]
    assert {status(effect_id) for effect_id in ids} == {"CONFIRMED"}
    assert sent_keys(sandbox) == Counter({key_of(effect_id): 1 for effect_id in ids})


def test_a_drain_that_fails_hands_its_flag_over(queue, monkeypatch):
    """A drain that raised (the database went away mid-drain) may have left the flag
    standing for submissions that count on its next claim: after a pause, its thread clears
    the flag and announces again, so the next drain claims them without the sweeper."""
    import threading

    calls: list[str] = []
    twice = threading.Event()

    def failing_then_fine(*, flag, stopping) -> int:
        calls.append(flag.key)
        if len(calls) == 1:
            flag.hold()  # as a drain that found work does
            raise RuntimeError("the database went away")
        twice.set()
        return 0

    monkeypatch.setattr(dispatcher, "drain", failing_then_fine)
    drainers = dispatcher.Drainers(queue, 1).start()
    try:
        assert dispatcher.DueFlag(queue).announce("first")
        assert twice.wait(10), calls
    finally:
        drainers.stop(timeout=5)
    assert wake_ups(queue) == []  # the hand-over's wake-up was popped by the same thread


def test_a_streak_of_failures_backs_off_and_logs_a_line_a_minute(caplog):
    """PostgreSQL down for ten minutes: the drainer's pause doubles to 8 s, and the log has
    the first traceback, a reminder a minute, and the end of the streak, not 600 tracebacks."""
    import logging

    now = [1000.0]
    streak = dispatcher._FailureStreak("a drain", clock=lambda: now[0])
    pauses = []
    with caplog.at_level(logging.INFO, logger="gateway.dispatcher"):
        for _ in range(120):  # ten minutes of failures, 5 s apart
            try:
                raise ConnectionError("the database is down")
            except ConnectionError:
                pauses.append(streak.failed())
            now[0] += 5
        streak.succeeded()
        streak.succeeded()  # nothing to say the second time
    assert pauses[:5] == [1, 2, 4, 8, 8] and set(pauses[3:]) == {8}
    lines = [(r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert lines[0] == ("a drain failed; retrying with a growing pause", True)
    assert [line for line, _ in lines[1:-1]] == ["a drain still failing"] * 9
    assert lines[-1] == ("a drain works again", False)
    assert caplog.records[-1].failures == 120 and caplog.records[-1].seconds == 600


# --- the dispatch sweep and the drainers -------------------------------------------------------


def overdue(effect_ids: list[str], *, waited: float, status: str | None = None) -> None:
    """Make the effects look as the sweeper finds them after ``waited`` seconds in their status
    (``status``, or the one they have) without a dispatch."""
    now = timezone.now()
    changes = {"next_dispatch_at": now - timedelta(seconds=1)}
    changes["status_changed_at"] = now - timedelta(seconds=waited)
    if status is not None:
        changes["status"] = status
    Effect.objects.filter(pk__in=effect_ids).update(**changes)


@pytest.fixture
def swept(monkeypatch, queue):
    """What the dispatch sweep hands over: its one-by-one messages, and its wake-ups (pushed
    for real, onto ``queue``'s list, where a drainer of that queue pops them)."""
    one_by_one: list[str] = []
    flag = dispatcher.DueFlag(queue)
    monkeypatch.setattr(hooks.dispatch_sender, "_send", one_by_one.append)
    monkeypatch.setattr(hooks.wake_sender, "_send", flag.wake)
    monkeypatch.setattr(hooks.drainers_at_work, "_ask", flag.someone_at_work)
    yield one_by_one
    broker.client().delete(flag.work_key)


@pytest.mark.django_db(transaction=True)
def test_the_sweeper_wakes_one_drainer_for_what_waits_behind_a_backlog(
    sandbox, agent, queue, swept, full_window
):
    """Effects past their dispatch time for the first time are most likely queued behind a
    backlog: the sweep pushes one wake-up for all of them, not a message each, and a drainer
    that pops it sends each once."""
    ids = [submit(agent, f"behind a backlog {index}") for index in range(5)]
    overdue(ids, waited=django_settings.GATEWAY_REDELIVER_AFTER + 1)
    assert services.dispatch_sweep() == 5
    assert swept == []
    assert wake_ups(queue) == [b"sweep: 5 overdue"]
    drainers = dispatcher.Drainers(queue, 1).start()
    try:
        deadline = time.monotonic() + 20
        while {status(effect_id) for effect_id in ids} != {"CONFIRMED"}:
            assert time.monotonic() < deadline, [status(effect_id) for effect_id in ids]
            time.sleep(0.05)
    finally:
        drainers.stop(timeout=10)
    # The sweep's wake-up was taken. A drainer stopped before its last, empty claim hands the
    # drain over (announces once more), as a stopping worker does.
    assert [wake for wake in wake_ups(queue) if wake != b"handed over"] == []
    assert sent_keys(sandbox) == Counter({key_of(effect_id): 1 for effect_id in ids})


def test_the_sweeper_sends_one_by_one_what_a_wake_up_did_not_get_sent(agent, queue, swept):
    """A second look at an effect (nobody answered the wake-up: no drainer threads, or Redis
    lost it), a NOT_STARTED effect (a drain respects the retry time the sweep has just pushed
    back) and one the sweeper was too late to see the first time each get their own message,
    as before the wake-ups."""
    after = django_settings.GATEWAY_REDELIVER_AFTER
    first_look = submit(agent, "first look")
    overdue([first_look], waited=after + 1)
    seen_before = submit(agent, "seen before")
    overdue([seen_before], waited=2 * after + 1)  # a first look pushes back by at least `after`
    retry = submit(agent, "retry due")
    overdue([retry], waited=after + 1, status="NOT_STARTED")
    assert services.dispatch_sweep() == 3
    assert sorted(swept) == sorted([seen_before, retry])
    assert wake_ups(queue) == [b"sweep: 1 overdue"]
    # Each was pushed back: the next sweep finds none of them.
    swept.clear()
    assert services.dispatch_sweep() == 0
    assert swept == [] and wake_ups(queue) == [b"sweep: 1 overdue"]


def test_while_a_drainer_is_at_work_the_sweep_leaves_the_backlog_to_the_drains(agent, queue, swept):
    """A backlog older than the sweep's second look: while a drainer has claimed in the last
    few seconds, the overdue effects a drain takes get a wake-up, never a message each; once
    nobody is at work, the sweep sends them one by one again."""
    after = django_settings.GATEWAY_REDELIVER_AFTER
    ids = [submit(agent, f"long backlog {index}") for index in range(3)]
    overdue(ids, waited=4 * after)  # long past a second look
    flag = dispatcher.DueFlag(queue)
    flag.at_work()
    assert services.dispatch_sweep() == 3
    assert swept == [] and wake_ups(queue) == [b"sweep: 3 overdue"]
    broker.client().delete(flag.work_key)  # the drainers stopped claiming
    overdue(ids, waited=8 * after)
    assert services.dispatch_sweep() == 3
    assert sorted(swept) == sorted(ids)


@pytest.mark.django_db(transaction=True)
def test_a_drain_that_claims_marks_its_queue_at_work(sandbox, agent, queue, full_window):
    ids = [submit(agent, f"marks {index}") for index in range(3)]
    flag = dispatcher.DueFlag(queue)
    assert not flag.someone_at_work()
    try:
        assert dispatcher.drain(flag=flag, worker="test") == 3
        assert flag.someone_at_work()
        assert 0 < broker.client().pttl(flag.work_key) <= dispatcher.AT_WORK_SECONDS * 1000
    finally:
        broker.client().delete(flag.work_key)
    assert {status(effect_id) for effect_id in ids} == {"CONFIRMED"}
