"""Where the ledger tells the apps above it what happened, instead of importing them.

The ledger (``gateway.ledger``, ``gateway.services``) sits below reconciliation, sagas and the
webhook outbox: it may not import them. What it used to call in them it now calls through
these registries, at the very places and in the very transactions it called them before. Each
app registers its listeners in its ``AppConfig.ready()``. An explicit registry, not Django
signals: ``grep after_transition`` finds every listener, and the types say what each gets.

- ``after_transition(effect, from_status=, to=)``: inside the transaction of every status
  change, right after its event (the webhook outbox records its row; a saga is told, after
  commit; a never-sent command gives its capability budget back).
  A listener the fast path's claim and record statements may skip says so where it is
  defined, with the reason (``@hooks.fast_path_idle("…")``); one that does not say so turns
  the fast path off while it is registered (``gateway.fastpath.enabled``).
- ``effect_created(effect)``: inside the transaction that submits a new command, once its
  effect row and first event exist (the outbox announces an effect that waits for approval:
  an agent waits on that state although no transition led to it).
- ``command_replayed(effect, principal=, context=)``: after a submission answered with the
  effect its key already names (a replay), outside any transaction (the webhooks app records
  a LangGraph thread that waits on an effect another thread submitted).
- ``dispatch_holds``: what keeps an effect from being sent although it is dispatchable (its
  saga is frozen). ``holds(effect)`` is asked by the claim; ``exclude(query)`` narrows the
  dispatch sweep, so that held effects are not re-enqueued every sweep for nothing; a hold
  the fast path's claim cannot meet says why in its ``fast_path_idle``.
- ``mismatch_found(effect, actor=, reason=)``: inside the transaction that records that an
  effect disagrees with its command (the saga is frozen).
- ``dispatch_sender``: the one task that hands an effect to a worker (``gateway.tasks``
  imports the services, which sit above the ledger, so ``GatewayConfig.ready`` binds it).
- ``due_sender``: tells the workers that dispatch work is due, coalesced: most calls wake
  nobody while a drainer is on its way (``gateway.dispatcher.announce_due``, bound by
  ``GatewayConfig.ready``). Submissions use it instead of a message per effect.
- ``wake_sender``: wakes one more drainer, past the flag (``gateway.dispatcher.wake_due``):
  the dispatch sweep's answer to effects that wait behind a backlog.
- ``drainers_at_work``: whether a drainer of the queue has claimed work in the last few
  seconds (``gateway.dispatcher.drainers_at_work``): then the sweep leaves what a drain takes
  to the drains, however long it has waited.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from django.db.models import QuerySet

    from gateway.models import Effect, Principal


class AfterTransition(Protocol):
    def __call__(self, effect: Effect, *, from_status: str, to: str) -> None: ...


class EffectCreated(Protocol):
    def __call__(self, effect: Effect) -> None: ...


class CommandReplayed(Protocol):
    def __call__(self, effect: Effect, *, principal: Principal, context: Any) -> None: ...


class MismatchFound(Protocol):
    def __call__(self, effect: Effect, *, actor: str, reason: str) -> None: ...


@dataclass(frozen=True)
class DispatchHold:
    """Why a dispatchable effect waits: ``holds`` for one effect (the claim), ``exclude`` for
    the sweep's query (the same rule, in SQL). ``fast_path_idle``: why the fast path's claim
    never meets an effect this holds (empty: it may, and the fast path stays off)."""

    name: str
    holds: Callable[[Effect], bool]
    exclude: Callable[[QuerySet[Effect]], QuerySet[Effect]]
    fast_path_idle: str = ""


_Listener = TypeVar("_Listener", bound=Callable[..., Any])


def fast_path_idle(reason: str) -> Callable[[_Listener], _Listener]:
    """Say of an ``after_transition`` listener that the fast path's claim and record
    statements (``gateway.fastpath``), which call no listener, may skip it, and why: it is
    idle on every row they write (a condition of their WHERE clause, or the statuses
    involved), or their callers do its work. The reason is read by people; its presence by
    ``Registry.fast_path_may_skip``."""

    def mark(listener: _Listener) -> _Listener:
        setattr(listener, "fast_path_idle", reason)  # noqa: B010 (a function's attribute)
        return listener

    return mark


class Registry[L]:
    """Listeners in registration order (the order of INSTALLED_APPS). Registering the same
    listener twice keeps one: ``ready()`` may run more than once in a test process."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._listeners: list[L] = []

    def register(self, listener: L) -> L:
        if listener not in self._listeners:
            self._listeners.append(listener)
        return listener

    def __iter__(self) -> Iterator[L]:
        return iter(tuple(self._listeners))

    def __len__(self) -> int:
        return len(self._listeners)

    def fast_path_may_skip(self) -> bool:
        """Whether every listener says the fast path's statements may skip it (a
        ``fast_path_idle`` reason: ``hooks.fast_path_idle``, ``DispatchHold.fast_path_idle``)."""
        return all(getattr(listener, "fast_path_idle", "") for listener in self._listeners)

    def __repr__(self) -> str:
        return f"<Registry {self.name}: {len(self._listeners)} listener(s)>"


class Sender:
    """One callable, bound once at start-up, called through ``send``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._send: Callable[[str], Any] | None = None

    def bind(self, send: Callable[[str], Any]) -> None:
        self._send = send

    @property
    def bound(self) -> bool:
        return self._send is not None

    def send(self, value: str) -> Any:
        if self._send is None:
            raise RuntimeError(f"{self.name} is not bound: django.setup() binds it")
        return self._send(value)


class Probe:
    """A question the ledger asks an app above it, bound once at start-up, asked through
    ``ask``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._ask: Callable[[], bool] | None = None

    def bind(self, ask: Callable[[], bool]) -> None:
        self._ask = ask

    def ask(self) -> bool:
        if self._ask is None:
            raise RuntimeError(f"{self.name} is not bound: django.setup() binds it")
        return self._ask()


after_transition: Registry[AfterTransition] = Registry("after_transition")
effect_created: Registry[EffectCreated] = Registry("effect_created")
command_replayed: Registry[CommandReplayed] = Registry("command_replayed")
dispatch_holds: Registry[DispatchHold] = Registry("dispatch_holds")
mismatch_found: Registry[MismatchFound] = Registry("mismatch_found")
dispatch_sender = Sender("dispatch_sender")
due_sender = Sender("due_sender")
wake_sender = Sender("wake_sender")
drainers_at_work = Probe("drainers_at_work")
