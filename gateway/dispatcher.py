"""Dispatch without a message per effect: a coalesced "due" signal, and workers that drain
due effects in batches.

**The signal.** After its commit, a submission calls ``announce_due``: one script in Redis sets
a flag (``SET NX`` with a short expiry, ``GATEWAY_DUE_FLAG_TTL``) and, only when it set the
flag, pushes a wake-up onto the queue's wake-up list. While the flag stands, submissions push
nothing: a drainer is on its way or at work, and it will claim their effects. No broker message
is published: each worker process runs drainer threads (``Drainers``, ``GATEWAY_DRAINERS``)
that wait on the list with ``BLPOP``, and Redis hands each wake-up to one of them.

**The drain** (``drain``, run by the drainer thread that popped a wake-up): claim up to
``GATEWAY_DISPATCH_BATCH`` due effects in one statement (gateway.fastpath_batch), send them on
this process's call pool (``GATEWAY_DISPATCH_CALLS`` threads sharing the adapter's keep-alive
client), record the answers as they come back, several per statement, and claim again as slots
free up. Unless its last claim came back full (a backlog), a claim may find nothing and be the
drainer's last, so the drainer clears the flag just before it: if the claim finds work, the
drainer sets the flag again (``hold``) and goes on; if it finds nothing, the drainer stops
claiming and returns once its calls are recorded. So a drainer stops claiming only after a
claim that followed its clear found nothing, and every clear is followed by a claim; a slow
provider leaves one empty claim per drain, not one per poll.

**Why no committed effect is left behind** (the coalescing argument). Take a submission S that
committed its effect E and then found the flag set (so it pushed nothing). The flag it saw was
set together with a wake-up T; T's drainer has not yet cleared that flag, since it still stood
when S looked. The flag goes away in one of two ways:

1. a drainer clears it (T's, or another one's: a drainer clears whatever flag stands before
   each claim that may be its last). That clear came after S looked, so after E's commit, and
   a claim follows it: a new statement with a new snapshot, which sees E. It claims E, or
   finds E locked (another claim statement is taking it, or the sweeper is re-sending it), or
   E is no longer due (cancelled, claimed and sent already);
2. it expires (``GATEWAY_DUE_FLAG_TTL``) before anyone clears it. T is then still in the
   list or its drainer still runs (a long drain): either way T's drainer stops only after a
   clear and a claim that come after S looked. If T was lost with a killed worker (popped by
   a drainer that then died), the next worker to start clears the flag and announces a drain
   (``gateway.celery``, on ``worker_ready``), which claims E; a worker that shuts down warm
   hands its drain over the same way before it exits (``_Drainer._hand_over``). If no worker
   starts, or Redis lost T, E's ``next_dispatch_at`` (set at submission) makes the dispatch
   sweeper wake a drainer for it, and send it on its own at its next look, as it does for any
   lost message (``services.dispatch_sweep``).

A flag set again by a drainer (``hold``) is the same case with T = that drainer's own
wake-up: it has not cleared since, and it stops only after a clear and a claim.

A drainer whose window is full (its claims came back full up to its last slot: more may be
due than it takes at a time) pushes one more wake-up past the flag, once, so that idle
drainers elsewhere share a backlog; each helper does the same. The script sets the flag and
pushes its wake-up together or not at all: an announce that fails (broker down) leaves
nothing standing, and the submission still answers 201; the sweeper sends the effect when the
broker is back.

**Waiting.** Each call thread puts its answer on the queue of the drainer that sent it, and a
drainer blocks on that queue: for its next answer (then takes what else has arrived, and gives
the rest of the batch ``GATHER_SECONDS`` to join), until its next poll is due, or — when it
wanted to claim and every call thread was busy with other drainers' calls — until its own
next answer or the next thread that comes free (a give-back wakes the drainers that found
none). No loop of a drainer goes round without blocking or claiming.

**Provider gates** (gateway.providers.protection) are asked before each claim statement,
never after: a provider held back (an open circuit) is left out of the claim; a provider with
a rate, a cap, a probe to take or a credential paused by a ``Retry-After`` gets claims of its
own, limited per credential to what its gates granted (the deployment's credential, then each
tenant credential its due effects go out with: ``_claim_counted``), and the grants its claims
did not use are given back; the rest of the slots claim every other provider's effects. Held
effects stay due; the drainer threads of this process drain again when the earliest gate
reopens (``_reopen``), and the dispatch sweep covers a worker that died meanwhile. A claimed
effect's lease on its provider's cap is given back when its answer is recorded.

**Crash safety** is the single dispatch's: each claim statement commits before any of its
effects is sent; the failpoints ``dispatch.after_claim`` (after the claim statement),
``dispatch.after_call`` (for each answer, before its record) and ``dispatch.after_record``
(after each record statement) let the crash test kill a drainer mid-batch; what it claimed
stays DISPATCHING until its lease runs out, and the reconciler asks the provider before
anything is sent again.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from functools import cache, partial
from typing import Any, NamedTuple

import redis
from django.conf import settings
from django.utils import timezone

from gateway import deadlines, dispatch_gates, fastpath, moves, services
from gateway.fastpath_batch import (
    Answer,
    Batch,
    BatchClaim,
    Peeked,
    claim_batch,
    claim_provider,
    claim_sent_with,
    record_batch,
)
from gateway.lib import broker
from gateway.lib.failpoints import failpoint
from gateway.lib.service_threads import ServiceThreads
from gateway.provider_credentials import SendAs
from gateway.providers import protection
from gateway.providers.gates import Hold

logger = logging.getLogger(__name__)

# With slow calls in flight and none answering, claim again after this long (new work waits
# no longer than this behind a slow provider).
POLL_SECONDS = 0.02
# After the first answer, wait this long for the other calls of the batch, so that answers
# arriving together are recorded in one statement.
GATHER_SECONDS = 0.002
# A drainer that claimed work counts as at work for this long (``DueFlag.at_work``): the
# dispatch sweep then leaves overdue effects to the drains. Refreshed at most every third of it.
AT_WORK_SECONDS = 5.0


# --- the due flag ------------------------------------------------------------------------------


# Set the flag if nobody holds it, and only then push a wake-up for one drainer: one round
# trip for the submission that finds no drainer on its way, and nothing but the SET for the
# others. Atomic: no flag stands without its wake-up (the flag says "a drainer is coming").
# The list keeps the newest few (more wake-ups than drainers mean nothing more) and expires
# when nobody listens (workers gone: a starting worker announces anyway).
_ANNOUNCE = """
if redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then
    redis.call('RPUSH', KEYS[2], ARGV[2])
    redis.call('LTRIM', KEYS[2], ARGV[3], -1)
    redis.call('PEXPIRE', KEYS[2], ARGV[4])
    return 1
end
return 0
"""
_WAKE_KEEP = 64  # wake-ups kept in a list at most
_WAKE_TTL_MS = 60_000  # a list nobody pops for this long is dropped


@cache
def _announce_script() -> Any:
    return broker.client().register_script(_ANNOUNCE)


class DueFlag:
    """The flag of one task queue, set means "a drainer is on its way or at work", and the
    list of wake-ups that the queue's drainer threads wait on (``Drainers``)."""

    def __init__(self, queue: str) -> None:
        self.key = f"gateway:dispatch-due:{queue}"
        self.wake_key = f"{self.key}:wake"
        self.work_key = f"{self.key}:at-work"
        self._marked_at = -AT_WORK_SECONDS  # monotonic time of this object's last ``at_work``
        self._packed: dict[tuple[str, ...], list[bytes]] = {}

    def _ttl_ms(self) -> int:
        return max(1, int(settings.GATEWAY_DUE_FLAG_TTL * 1000))

    def _command(self, *args: Any) -> list[bytes]:
        """``args`` packed for the wire, once (the TTL is read each time: tests change it)."""
        key = tuple(map(str, args))
        packed = self._packed.get(key)
        if packed is None:
            packed = self._packed[key] = broker.pack(*args)
        return packed

    def announce(self, reason: str = "due") -> bool:
        """Set the flag and push a wake-up (``reason``, for whoever reads the list), if nobody
        holds the flag; True if this call did."""
        script = _announce_script()
        command = self._command(
            "EVALSHA", script.sha, 2, self.key, self.wake_key,
            self._ttl_ms(), reason, -_WAKE_KEEP, _WAKE_TTL_MS,
        )  # fmt: skip
        try:
            return bool(broker.run(command))
        except redis.exceptions.NoScriptError:
            # Redis lost its script cache (restarted): redis-py's call loads it again.
            keys = [self.key, self.wake_key]
            return bool(script(keys=keys, args=[self._ttl_ms(), reason, -_WAKE_KEEP, _WAKE_TTL_MS]))

    def wake(self, reason: str) -> None:
        """Push a wake-up past the flag: one more drainer (a backlog shared out)."""
        pipe = broker.client().pipeline(transaction=False)
        pipe.rpush(self.wake_key, reason)
        pipe.ltrim(self.wake_key, -_WAKE_KEEP, -1)
        pipe.pexpire(self.wake_key, _WAKE_TTL_MS)
        pipe.execute()

    def wait(self, client: redis.Redis, timeout: float) -> bool:
        """Block on ``client`` (a connection of the caller's own) until a wake-up is popped,
        or ``timeout`` seconds pass."""
        return client.blpop([self.wake_key], timeout=timeout) is not None

    def clear(self) -> None:
        broker.run(self._command("DEL", self.key))

    def hold(self) -> None:
        """Set it again, whoever set it before: a drainer that found work after its clear."""
        broker.run(self._command("SET", self.key, "1", "PX", self._ttl_ms()))

    def at_work(self) -> None:
        """A drainer of this queue claimed work: for ``AT_WORK_SECONDS`` the queue counts as
        being drained (the flag itself lapses during a long drain, whose claims come back
        full and neither clear nor hold it). At most every third of that per flag object (a
        process's drainers share one): one command per few seconds, not one per drain, which
        at low load is one per effect."""
        now = time.monotonic()
        if now - self._marked_at < AT_WORK_SECONDS / 3:
            return
        self._marked_at = now
        broker.run(self._command("SET", self.work_key, "1", "PX", int(AT_WORK_SECONDS * 1000)))

    def someone_at_work(self) -> bool:
        return bool(broker.run(self._command("EXISTS", self.work_key)))


def announce_due(task: Any, effect_id: str = "") -> None:
    """Tell the workers that dispatch work is due (``hooks.due_sender``, which passes the
    effect that prompted it: unused, the wake-up names no effect, so its command is packed
    once). Wakes a drainer only if none is on its way;
    raises if the broker is down (``ledger.publish`` logs it: the sweeper sends later). In
    eager mode (tests, in process) ``task`` drains now."""
    conf = task.app.conf
    if _conf(conf, "task_always_eager"):
        task.delay()  # in process, now: nothing to coalesce
        return
    # Flag and wake-up in one script: a drainer will claim after it clears the flag, so E is
    # seen whichever of the two this call finds (module docstring).
    _flag_of(conf).announce()


_flags: dict[str, DueFlag] = {}


def wake_due(task: Any, reason: str) -> None:
    """Wake one more drainer, whether or not the flag stands (``hooks.wake_sender``): the
    dispatch sweep found effects that waited past their dispatch time, most likely behind a
    backlog that the drainers at work will reach; an idle drainer elsewhere shares it, and
    a wake-up that nobody answers (no drainer threads) leaves those effects to the sweep's
    next look, which sends them one by one. In eager mode ``task`` drains now."""
    conf = task.app.conf
    if _conf(conf, "task_always_eager"):
        task.delay()
        return
    _flag_of(conf).wake(reason)


def drainers_at_work(task: Any) -> bool:
    """Whether a drainer of the app's queue claimed work in the last ``AT_WORK_SECONDS``
    (``hooks.drainers_at_work``). In eager mode there are no drainer threads: False."""
    conf = task.app.conf
    if _conf(conf, "task_always_eager"):
        return False
    return _flag_of(conf).someone_at_work()


def _flag_of(conf: Any) -> DueFlag:
    """The flag of the app's default task queue, made once per queue."""
    queue = _conf(conf, "task_default_queue")
    flag = _flags.get(queue)
    if flag is None:
        flag = _flags[queue] = DueFlag(queue)
    return flag


def _conf(conf: Any, name: str) -> Any:
    """``conf.<name>`` of a Celery app, read at every submission. Celery's own lookup tries
    several spellings in the Django settings and its defaults, raising and catching on each
    (15 µs, a twentieth of the web's CPU per submission with the wake-up): a value set at run
    time (``app.conf.x = …``: tests, in process) is in ``conf.changes`` and read from there;
    the rest comes from the settings module and Celery's defaults, which do not change while
    the process runs, and is looked up once."""
    changes = getattr(conf, "changes", None)
    if changes is None:
        return getattr(conf, name)
    if name in changes:
        return changes[name]
    key = (id(conf), name)
    if key not in _static_conf:
        _static_conf[key] = getattr(conf, name)
    return _static_conf[key]


_static_conf: dict[tuple[int, str], Any] = {}


# --- the call pool -----------------------------------------------------------------------------


class _Answer(NamedTuple):
    """What a call thread hands back to the drainer that sent it: its claim, and the call's
    result or the exception it raised. ``claim`` None: no answer, a slot came free (a wake-up
    for a drainer that found none)."""

    claim: BatchClaim | None
    sent: services.Sent | None = None
    error: BaseException | None = None


_WAKE = _Answer(None)


class _CallPool:
    """This process's threads for provider calls, and as many slots: a drainer claims only as
    many effects as it has slots for, so a claimed effect never waits for a thread (its lease
    runs from the claim) and a slow provider holds back claims, not attempts.

    A call thread puts its answer on the answers queue of the drainer that sent it, so a
    drainer collects in O(1) per answer. A drainer that wanted slots and found none is
    "hungry": the next slot given back wakes it (a ``_WAKE`` on its queue), so it waits on its
    queue for an answer of its own or a free slot, never polls for one."""

    def __init__(self, size: int) -> None:
        self.slots = threading.Semaphore(size)
        self.jobs: queue.SimpleQueue[tuple[Any, BatchClaim, queue.SimpleQueue[_Answer]]] = (
            queue.SimpleQueue()
        )
        self._hungry: set[queue.SimpleQueue[_Answer]] = set()
        self._hungry_lock = threading.Lock()
        for index in range(size):
            threading.Thread(target=self._serve, name=f"dispatch-call_{index}", daemon=True).start()

    def take(
        self,
        wanted: int,
        *,
        wait_for_one: bool,
        hungry: queue.SimpleQueue[_Answer] | None = None,
    ) -> int:
        """Up to ``wanted`` free slots; with ``wait_for_one``, wait until there is one. With
        ``hungry`` and no slot free, that queue gets a ``_WAKE`` when a slot is given back."""
        if wanted <= 0:
            return 0
        if hungry is not None:
            # Registered before trying: a slot given back after a failed try finds it.
            with self._hungry_lock:
                self._hungry.add(hungry)
        taken = 0
        if wait_for_one:
            self.slots.acquire()
            taken = 1
        while taken < wanted and self.slots.acquire(blocking=False):
            taken += 1
        if taken and hungry is not None:
            with self._hungry_lock:
                self._hungry.discard(hungry)
        return taken

    def give(self, count: int) -> None:
        for _ in range(count):
            self.slots.release()
        if count and self._hungry:  # released first: a drainer woken finds the slot
            with self._hungry_lock:
                hungry, self._hungry = self._hungry, set()
            for answers in hungry:
                answers.put(_WAKE)

    def forget(self, answers: queue.SimpleQueue[_Answer]) -> None:
        with self._hungry_lock:
            self._hungry.discard(answers)

    def submit(self, call: Any, claim: BatchClaim, answers: queue.SimpleQueue[_Answer]) -> None:
        """Run ``call(claim)`` on a call thread (one is free: the caller holds its slot)."""
        self.jobs.put((call, claim, answers))

    def _serve(self) -> None:
        while True:
            call, claim, answers = self.jobs.get()
            try:
                answer = _Answer(claim, sent=call(claim))
            except BaseException as exc:  # handed to the drainer, which decides
                answer = _Answer(claim, error=exc)
            finally:
                self.give(1)
            answers.put(answer)
            del call, claim, answers, answer


class _Window:
    """How many effects a drainer of this process may have claimed and not yet answered: one
    when the process starts, one more for every answer that comes back (so it doubles with
    each round of answers), up to ``GATEWAY_DISPATCH_BATCH``. What a worker had claimed when it
    died waits for its leases to run out and for the reconciler to ask the provider; starting
    at one bounds that to one effect per life and drainer thread (``GATEWAY_DRAINERS``, one by
    default) for a worker that keeps dying (a poison payload, an out-of-memory kill), and a
    healthy worker is at full width after a handful of rounds."""

    def __init__(self) -> None:
        self.size = 1

    def grow(self, answers: int) -> None:
        self.size = min(self.size + answers, settings.GATEWAY_DISPATCH_BATCH)


_pool_lock = threading.Lock()
_pool: tuple[int, _CallPool, _Window] | None = None


def _process_state() -> tuple[_CallPool, _Window]:
    """This process's call pool and window, made on first use (a forked worker child makes
    its own)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), _CallPool(settings.GATEWAY_DISPATCH_CALLS), _Window())
        return _pool[1], _pool[2]


# --- the drain ---------------------------------------------------------------------------------


def drain(
    *,
    flag: DueFlag | None,
    worker: str | None = None,
    limit: int | None = None,
    stopping: threading.Event | None = None,
) -> int:
    """Send every due effect, in batches, until a claim finds nothing (see the module
    docstring). ``flag``: the due flag this drain answers for (None: in process, no flag).
    ``stopping`` set (the worker shuts down): claim no more, record the calls out, and hand
    the flag on. Returns how many effects were claimed and sent (refused ones not counted)."""
    worker = worker or services.worker_name()
    if not fastpath.enabled():
        return _drain_general(flag, worker)
    return _Drainer(flag, worker, limit or settings.GATEWAY_DISPATCH_BATCH, stopping).run()


class _Drainer:
    def __init__(
        self, flag: DueFlag | None, worker: str, limit: int, stopping: threading.Event | None
    ) -> None:
        self.flag = flag
        self.stopping = stopping
        self.worker = worker
        self.pool, self.window = _process_state()
        self.limit = limit
        self.answers: queue.SimpleQueue[_Answer] = queue.SimpleQueue()
        self.out = 0  # calls sent and not yet answered
        self.skip: list[str] = []  # handed to the general path in this drain
        self.claiming = True
        self.helped = False
        self.last_claim = 0.0
        self.last_full = False
        self.sent = 0
        # Claimed effects of gated providers -> (provider, lease, probe) until they answer.
        self.leases: dict[str, tuple[str, str | None, bool]] = {}

    def _width(self) -> int:
        return min(self.limit, self.window.size)

    def run(self) -> int:
        try:
            while self.claiming or self.out:
                if self.claiming and self.stopping is not None and self.stopping.is_set():
                    self._hand_over()
                starved = False  # wanted to claim, but every call thread was busy
                if self.claiming and self._claim_now():
                    if self._take_and_claim(wait=not self.out):
                        continue
                    starved = True
                if self.out:
                    self._collect(starved=starved)
        finally:
            self.pool.forget(self.answers)
        return self.sent

    def _take_and_claim(self, *, wait: bool) -> bool:
        """Claim as many as the window and this process's free call threads allow (with
        ``wait``, wait for a thread if none is free). False when no thread was free: the
        next slot given back then wakes this drainer."""
        slots = self.pool.take(
            self._width() - self.out, wait_for_one=wait, hungry=None if wait else self.answers
        )
        if slots:
            self._claim(slots)
        return bool(slots)

    def _claim_now(self) -> bool:
        """Claim when nothing is in flight, when the last claim was full (a backlog), or when
        calls have been out for a while (new work does not wait behind a slow provider)."""
        if self.out >= self._width():
            return False
        return not self.out or self.last_full or time.monotonic() - self.last_claim >= POLL_SECONDS

    def _claim(self, slots: int) -> None:
        # Unless the last claim came back full (a backlog), this one may find nothing and end
        # the drain's claiming: clear the flag first, so that it sees every effect whose
        # submission found the flag still set.
        last_chance = not self.out or not self.last_full
        if last_chance and self.flag is not None:
            self.flag.clear()
        try:
            batch = self._claim_gated(slots)
        except BaseException:
            self.pool.give(slots)
            raise
        self.pool.give(slots - len(batch.claims))
        self.last_claim, self.last_full = time.monotonic(), batch.picked == slots
        sent_as: dict[int, SendAs] = {}
        if batch.claims:
            sent_as = services.attempts_note_sender(batch.claims)  # before any is sent
            deadlines.lease_soon(timezone.now())  # a lease shorter than the waker's sleep
            failpoint("dispatch.after_claim")  # claimed and committed, nothing sent yet
        for claim in batch.claims:
            services.log_claimed(claim, worker=self.worker)
            send = partial(services.fast_send, send_as=sent_as.get(claim.attempt_id))
            self.pool.submit(send, claim, self.answers)
        moves.after_commit(claim.effect_id for claim in batch.claims)  # DISPATCHING, for waits
        self.out += len(batch.claims)
        self.sent += len(batch.claims)
        if self.last_full and self.out >= self.limit and not self.helped:
            # Only at full width: a window still opening is not a backlog.
            self._call_for_help()
        if batch.picked and last_chance and self.flag is not None:
            self.flag.hold()  # at work again: submissions may stay quiet
        if batch.picked:
            self._mark_at_work()
        for effect_id in batch.refused:
            self._general(effect_id)
        if last_chance and not batch.picked:
            # Nothing due after the clear: nobody counts on a claim of ours any more. The calls
            # still out are recorded; new work gets a drainer of its own (its submission
            # found no flag).
            self.claiming = False

    def _claim_gated(self, slots: int) -> Batch:
        """Claim up to ``slots`` effects, within the providers' gates: first, for each
        provider whose gates count (a rate, a cap, a probe, a credential paused), what they
        granted per credential (``_claim_counted``); then, for the rest of the slots, effects
        of every provider no gate restricts. A provider held back (circuit open) is left out,
        and the drainer threads drain again when it reopens (``_reopen``)."""
        view = protection.outlook()
        for provider, hold in view.held.items():
            protection.note_held(provider, hold)
            _reopen.note(hold.until)
        claims: list[BatchClaim] = []
        refused: list[str] = []
        left = slots
        for provider in view.permits:
            if left <= 0:
                break
            batch = self._claim_counted(provider, left, view.keys.get(provider, {}))
            claims += batch.claims
            refused += batch.refused
            left -= batch.picked
        if left > 0:
            batch = claim_batch(
                limit=left, worker=self.worker, skip=self.skip, exclude=view.restricted
            )
            claims += batch.claims
            refused += batch.refused
        return Batch(claims, refused)

    def _claim_counted(self, provider: str, left: int, held: dict[str, float]) -> Batch:
        """Up to ``left`` effects of ``provider``, each within the permits of the credential
        it goes out with: the deployment's permit first, then one statement that claims what
        it granted and peeks at the tenants' credentials' effects (none of the ``held`` rate
        keys), then permits per tenant credential and a claim of those by id. Grants a claim
        did not use are given back."""
        for until in held.values():
            _reopen.note(until)  # a held credential's effects wait for it: drain again then
        prefix = protection.credential_key(provider, "")
        held_credentials = [key[len(prefix) :] for key in held if key.startswith(prefix)]
        permit = protection.admit(provider, left)
        granted = 0
        if isinstance(permit, Hold):
            _reopen.note(permit.until)
        else:
            granted = permit.granted
        try:
            batch, peeked = claim_provider(provider=provider, limit=granted, peek=left,
                                           held=held_credentials, worker=self.worker,
                                           skip=self.skip)  # fmt: skip
        except BaseException:
            if not isinstance(permit, Hold):
                permit.keep(0)
            raise
        if not isinstance(permit, Hold):
            permit.keep(len(batch.claims))
            self._lease(batch.claims, permit)
        left -= batch.picked
        if not peeked or left <= 0:
            return batch
        wanted: dict[str, list[Peeked]] = {}
        for row in peeked:  # in due order: the earliest credential asks first
            wanted.setdefault(row.credential, []).append(row)
        asks: list[tuple[str | None, str, int]] = []
        for fp, rows in list(wanted.items()):
            if left <= 0:  # no slot left for this credential's effects: not asked this time
                del wanted[fp]
                continue
            asks.append((fp, rows[0].rate, min(len(rows), left)))
            left -= asks[-1][2]
        permits = protection.admit_many(provider, asks)
        keys: dict[str, str] = {}
        for fp, rows in wanted.items():
            granted_to = permits[fp]
            if isinstance(granted_to, Hold):
                _reopen.note(granted_to.until)
                continue
            keys.update((row.effect_id, fp) for row in rows[: granted_to.granted])
        more = Batch([], [])
        try:
            if keys:
                more = claim_sent_with(keys=keys, worker=self.worker, skip=self.skip)
        finally:
            claimed: dict[str, list[BatchClaim]] = {}
            for claim in more.claims:
                claimed.setdefault(keys[claim.effect_id], []).append(claim)
            for fp in wanted:
                granted_to = permits[fp]
                if not isinstance(granted_to, Hold):
                    granted_to.keep(len(claimed.get(fp, [])))
                    self._lease(claimed.get(fp, []), granted_to)
        return Batch(batch.claims + more.claims, batch.refused + more.refused)

    def _lease(self, claims: list[BatchClaim], permit: protection.Permit) -> None:
        """Remember each claim's lease on its provider's cap, given back when it answers."""
        for index, claim in enumerate(claims):
            self.leases[claim.effect_id] = (permit.provider, permit.lease(index), permit.probe)

    def _release(self, claims: list[BatchClaim]) -> None:
        """Give back the leases (and a probe) of calls that answered or raised."""
        by_provider: dict[str, tuple[list[str | None], bool]] = {}
        for claim in claims:
            held = self.leases.pop(claim.effect_id, None)
            if held is not None:
                leases, probe = by_provider.setdefault(held[0], ([], False))
                leases.append(held[1])
                by_provider[held[0]] = (leases, probe or held[2])
        for provider, (leases, probe) in by_provider.items():
            protection.release(provider, leases, probe=probe)

    def _mark_at_work(self) -> None:
        """Tell the dispatch sweep that this queue is being drained (``DueFlag.at_work``). A
        Redis that refuses it costs only the sweep's shortcut."""
        if self.flag is None:
            return
        try:
            self.flag.at_work()
        except redis.RedisError:
            logger.warning("could not mark the queue at work; the sweep sends", exc_info=True)

    def _hand_over(self) -> None:
        """The worker shuts down: claim no more. Submissions that found the flag count on a
        claim of this drain that will not come, so clear the flag and announce again: a
        drainer elsewhere (or this worker's next life) claims what is due."""
        self.claiming = False
        if self.flag is None:
            return
        try:
            self.flag.clear()
            self.flag.announce("handed over")
        except Exception:
            logger.warning("could not hand the drain over; the sweeper sends", exc_info=True)

    def _call_for_help(self) -> None:
        """A full window, claimed to the last slot: more may be due than one drainer takes at
        a time. One more wake-up (past the flag, which stands for this drain) lets a drainer
        elsewhere share it; the helper does the same when its own first batch is full."""
        self.helped = True
        if self.flag is None:
            return  # in process: this drain takes it all
        try:
            self.flag.wake("help")
        except Exception:
            logger.warning("could not call for help; draining alone", exc_info=True)

    def _general(self, effect_id: str) -> None:
        """A picked effect whose checks did not all hold: the general path decides (expire,
        reject, re-ask approval, escalate, or send it the general way). Never picked again by
        this drain; an error is logged, not raised, so one poison row cannot stop the drain."""
        self.skip.append(effect_id)
        try:
            dispatch_gates.gated(
                effect_id,
                lambda: services.effect_dispatch_general(effect_id=effect_id, worker=self.worker),
            )
        except Exception:
            logger.exception("general dispatch failed", extra={"effect_id": effect_id})

    def _collect(self, *, starved: bool) -> None:
        """Wait for answers (or, ``starved``, for a call thread to come free) and record
        them. Blocks: with no timeout when this drainer is not to claim before an answer or a
        free slot, else until its next poll is due."""
        timeout = None
        if self.claiming and not starved and self.out < self._width():
            timeout = max(0.0, POLL_SECONDS - (time.monotonic() - self.last_claim))
        try:
            first = self.answers.get(timeout=timeout)
        except queue.Empty:
            return
        answered = [first] if first.claim is not None else []
        self._take_ready(answered)
        if answered and self.out > len(answered):
            # Answers arriving together go into one statement.
            deadline = time.monotonic() + GATHER_SECONDS
            while self.out > len(answered):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    answer = self.answers.get(timeout=left)
                except queue.Empty:
                    break
                if answer.claim is not None:
                    answered.append(answer)
                    self._take_ready(answered)
        if not answered:
            return  # woken: a slot came free
        self.out -= len(answered)
        self.window.grow(len(answered))
        # Claim what these answers made room for before writing them: the next calls go out
        # while the record statement runs, and a drain's last claim comes before its last
        # record (once its effects read CONFIRMED, the drainer has only to return).
        if self.claiming and self._claim_now():
            self._take_and_claim(wait=False)
        self._record(answered)

    def _take_ready(self, answered: list[_Answer]) -> None:
        """Add the answers already on the queue (wake-ups dropped)."""
        while True:
            try:
                answer = self.answers.get_nowait()
            except queue.Empty:
                return
            if answer.claim is not None:
                answered.append(answer)

    def _record(self, answered: list[_Answer]) -> None:
        if self.leases:
            self._release([item.claim for item in answered if item.claim is not None])
        now = timezone.now()
        answers: list[Answer] = []
        for item in answered:
            claim, sent, error = item
            assert claim is not None
            if error is not None:
                if not isinstance(error, Exception):
                    raise error
                # Claimed, maybe sent: left DISPATCHING for lease recovery and a lookup.
                logger.error(
                    "dispatch call failed",
                    extra={"effect_id": claim.effect_id},
                    exc_info=error,
                )
                continue
            assert sent is not None
            failpoint("dispatch.after_call")  # the provider may have committed; not recorded
            if sent.result is None:
                services.fast_refuse_tampered(claim, problem=sent.problem, worker=self.worker)
                continue
            if claim.compensates:  # its record settles the original: the general way
                services.fast_record_general(claim, sent.result, worker=self.worker)
                continue
            fields = services.fast_fields(claim, sent.result, now)
            answers.append(Answer(claim, sent.result, fields))
        if not answers:
            return
        written = record_batch(answers=answers, worker=self.worker, now=now)
        moves.after_commit(written)
        # UNKNOWN / IN_PROGRESS: their first lookups, for the reconciler's waker.
        deadlines.soonest(
            a.fields.get("next_check_at") for a in answers if a.claim.effect_id in written
        )
        for answer in answers:
            if answer.claim.effect_id in written:
                services.log_recorded(answer.claim.effect_id, answer.result, worker=self.worker)
            else:  # stale, or a webhook endpoint of its tenant needs its outbox row
                services.fast_record_general(answer.claim, answer.result, worker=self.worker)
        failpoint("dispatch.after_record")  # recorded; the task not yet acknowledged


# --- the drainer threads ----------------------------------------------------------------------


class _Reopen:
    """When the earliest provider gate that held a claim back reopens (epoch seconds), for
    this process's drainer threads: the effects it held stay due and pushed no wake-up, so
    the first drainer thread idle at that time drains again (and notes the next time, if a
    gate still holds). A worker that dies with it leaves them to the dispatch sweep."""

    def __init__(self) -> None:
        self.at: float | None = None
        self.lock = threading.Lock()

    def note(self, at: float) -> None:
        with self.lock:
            self.at = at if self.at is None else min(self.at, at)

    def wait_seconds(self, longest: float) -> float:
        at = self.at
        if at is None:
            return longest
        return min(longest, max(0.01, at - time.time()))

    def take_if_due(self) -> bool:
        with self.lock:
            if self.at is None or self.at > time.time():
                return False
            self.at = None
            return True


_reopen = _Reopen()


class _FailureStreak:
    """Failures in a row of one drainer thread (a drain that raised, a wake-up wait that
    failed): the pause before the next try doubles from 1 s up to ``MAX_PAUSE``, and the log
    has the first failure's traceback, then a line a minute while it lasts, then one when it
    ends. With PostgreSQL or Redis down for ten minutes a drainer used to log a traceback a
    second (600 per thread), which buried whatever else the log had to say."""

    MAX_PAUSE = 8.0
    REMIND_EVERY = 60.0

    def __init__(
        self,
        what: str,
        clock: Callable[[], float] = time.monotonic,
        *,
        max_pause: float = MAX_PAUSE,
    ) -> None:
        self.what = what
        self.clock = clock
        self.max_pause = max_pause
        self.count = 0
        self.since = self.reminded = 0.0

    def failed(self) -> float:
        """Count a failure (call it in the ``except``) and return the pause before the next
        try."""
        now = self.clock()
        self.count += 1
        if self.count == 1:
            self.since = self.reminded = now
            logger.exception("%s failed; retrying with a growing pause", self.what)
        elif now - self.reminded >= self.REMIND_EVERY:
            self.reminded = now
            logger.warning(
                "%s still failing",
                self.what,
                extra={"failures": self.count, "seconds": round(now - self.since)},
                exc_info=True,
            )
        return min(self.max_pause, 2.0 ** (self.count - 1))

    def succeeded(self) -> None:
        if self.count:
            logger.warning(
                "%s works again",
                self.what,
                extra={"failures": self.count, "seconds": round(self.clock() - self.since)},
            )
            self.count = 0


class Drainers(ServiceThreads):
    """The threads of a worker process that answer wake-ups: each waits on the queue's wake-up
    list (``BLPOP``, a Redis connection of its own) and drains (``drain``) when it pops one.
    No broker message per drain: a submission's announce is one script call, and a drain
    starts without a task being received, acknowledged and traced.

    Started in every process that runs tasks for the queue (``gateway.celery``: the worker's
    own process for the thread and solo pools, each child for prefork). ``stop`` (the worker
    shuts down) lets each drain record the calls it has out and hand its flag over, then
    joins; a worker killed instead leaves its claims to their leases and the reconciler, as a
    killed task would."""

    WAIT_SECONDS = 1.0  # how long a BLPOP blocks before looking at ``stopping`` again
    RECONNECT_SECONDS = 2.0  # the longest pause between tries while Redis is down

    name = "drainer"

    def __init__(self, queue: str, count: int) -> None:
        self.flag = DueFlag(queue)
        super().__init__(count)

    def _serve(self) -> None:
        from django.db import close_old_connections, connection

        # A connection of its own that may block past the flag client's socket timeout.
        client = redis.Redis.from_url(
            broker.url(), socket_timeout=self.WAIT_SECONDS + 5, socket_connect_timeout=2
        )
        # Redis is asked again every RECONNECT_SECONDS at most while it is down: the drain
        # after its return (below) is what sends the effects submitted meanwhile.
        waits = _FailureStreak("waiting for wake-ups", max_pause=self.RECONNECT_SECONDS)
        drains = _FailureStreak("a drain")
        while not self.stopping.is_set():
            try:
                woken = self.flag.wait(client, _reopen.wait_seconds(self.WAIT_SECONDS))
            except redis.RedisError:
                self.stopping.wait(waits.failed())
                continue
            # Back from an outage: the wake-ups of what was submitted meanwhile were never
            # pushed (or died with Redis), so drain now rather than wait for the sweeper. A
            # provider gate reopening: what it held is due again.
            woken = woken or waits.count > 0 or _reopen.take_if_due()
            waits.succeeded()
            if not woken:
                # Idle for a while: give the database connection back (a worker's drainers
                # would otherwise hold one each for CONN_MAX_AGE, busy or not).
                connection.close()
                continue
            # What Django does around a request and gateway.celery around a task: a connection
            # that broke (a PostgreSQL restart) or outlived CONN_MAX_AGE is replaced.
            close_old_connections()
            try:
                drain(flag=self.flag, stopping=self.stopping)
                drains.succeeded()
            except Exception:
                # Its claims stay DISPATCHING under their leases; the reconciler asks the
                # provider. Submissions that found the flag count on a claim of this drain:
                # after a pause (the database may be down: no hot loop), hand it over.
                self.stopping.wait(drains.failed())
                try:
                    self.flag.clear()
                    self.flag.announce("after a failed drain")
                except Exception:
                    logger.warning(
                        "could not hand the drain over; the sweeper sends", exc_info=True
                    )
            finally:
                close_old_connections()


_drainers: tuple[int, Drainers] | None = None


def start_drainers(queue: str) -> Drainers | None:
    """This process's drainer threads for ``queue`` (``GATEWAY_DRAINERS``; 0: none). A forked
    child starts its own: a parent's threads do not exist in it."""
    global _drainers
    count = settings.GATEWAY_DRAINERS
    if count <= 0:
        return None
    if _drainers is None or _drainers[0] != os.getpid():
        _drainers = (os.getpid(), Drainers(queue, count).start())
        logger.info("drainers started", extra={"queue": queue, "count": count, "pid": os.getpid()})
    return _drainers[1]


def stop_drainers() -> None:
    """Let this process's drains finish the calls they have out (up to the provider timeout
    and a little more), then return."""
    global _drainers
    if _drainers is not None and _drainers[0] == os.getpid():
        _drainers[1].stop(timeout=settings.GATEWAY_PROVIDER_TIMEOUT + 5)
    _drainers = None


def _drain_general(flag: DueFlag | None, worker: str) -> int:
    """The drain with the fast path off (a listener it does not account for): the due
    effects one by one through the general path, same flag protocol."""
    from gateway.fastpath_batch import due_effect_ids

    seen: list[str] = []
    sent = 0
    cleared = flag is None
    while True:
        batch = due_effect_ids(limit=settings.GATEWAY_DISPATCH_BATCH, skip=seen)
        if not batch:
            if cleared:
                return sent
            assert flag is not None
            flag.clear()
            cleared = True
            continue
        for effect_id in batch:
            seen.append(effect_id)
            sent += dispatch_gates.gated(
                effect_id,
                partial(services.effect_dispatch_general, effect_id=effect_id, worker=worker),
            )
