"""How late a long poll hears of a change: from the commit of a status change to the moment
the wait that was on it returns, with the news of gateway.moves and without it (the polls with
growing pauses that were the only way before), interleaved.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/eg_notice \
    CELERY_BROKER_URL=redis://127.0.0.1:6379/13 \
        .venv/bin/python -m tests.benchmarks.wait_notice [--trials 60] [--rounds 3]

Each trial submits an effect through the WSGI application (PREPARED; nothing dispatches it:
use a scratch database and a Redis database of its own), starts a wait on it as the API does
(``moves.news_of``, the read, ``_wait_for_change``) on a thread, and cancels the effect after a
delay drawn between 10 and 600 ms, the span of a provider's answer. Printed per mode: the
notice lag p50 / p95 / max (commit to the wait's return) and the effect's reads per wait.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import threading
import time
import uuid

from tests.benchmarks.inprocess import agent_token, post_environ, setup_django


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=60, help="per mode and round")
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()

    setup_django("notice")  # announces that nobody answers
    from gateway import moves

    trials = Trials(uuid.uuid4().hex[:8])
    moves.listener.start()
    while not moves.listener.subscribed:
        time.sleep(0.01)
    index = 0
    try:
        for round_ in range(options.rounds):
            found: dict[bool, list[tuple[float, int]]] = {True: [], False: []}
            for _ in range(options.trials):
                for news in (True, False):  # interleaved
                    index += 1
                    found[news].append(trials.trial(index, news))
            for news in (True, False):
                print(_line(round_, news, found[news]))
    finally:
        trials.restore()


def _line(round_: int, news: bool, found: list[tuple[float, int]]) -> str:
    """One mode's notice lags (p50, p95, max) and reads per wait, for a round."""
    lags = sorted(lag for lag, _ in found)
    reads = statistics.mean(r for _, r in found)
    return (
        f"round {round_ + 1} {'news   ' if news else 'polling'}: notice lag p50 "
        f"{statistics.median(lags):6.1f} ms  p95 {lags[int(len(lags) * 0.95) - 1]:6.1f} "
        f"max {lags[-1]:6.1f}  effect reads per wait {reads:.1f}  "
        f"(load {os.getloadavg()[0]:.2f})"
    )


class Wait(threading.Thread):
    """A long poll's wait on one effect, as the API's view waits (``moves.news_of``, the
    read, ``_wait_for_change``): when it returned, and how many reads of the effect it made."""

    def __init__(self, effect_id: str) -> None:
        super().__init__(daemon=True)
        self.effect_id, self.returned, self.reads = effect_id, 0.0, 0
        self.ready = threading.Event()

    def run(self) -> None:
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        from gateway import moves
        from gateway.api import views
        from gateway.models import Effect

        try:
            with (
                CaptureQueriesContext(connection) as queries,
                moves.news_of(self.effect_id) as moved,
            ):
                effect = Effect.objects.get(pk=self.effect_id)
                self.ready.set()
                views._wait_for_change(
                    effect.status,
                    10,
                    moved,
                    read=lambda: Effect.objects.get(pk=self.effect_id),
                    look=lambda: (
                        Effect.objects.filter(pk=self.effect_id)
                        .values_list("status", flat=True)
                        .first()
                    ),
                )
            self.returned = time.perf_counter()
            self.reads = sum('FROM "gateway_effect"' in q["sql"] for q in queries)
        finally:
            connection.close()


class Trials:
    """Submits, waits and cancels, with the news of gateway.moves on or off."""

    def __init__(self, run: str) -> None:
        from gateway import moves
        from gateway.models import Principal

        self.run = run
        self.token = agent_token("notice", f"notice-{run}")
        self.principal = Principal.objects.get(name=f"notice-{run}")
        self.real_published, self.real_subscribed = moves.published, moves.Listener.subscribed

    def submit(self, index: int) -> str:
        from gateway.wsgi import application

        body = json.dumps(
            {
                "type": "ticket.create",
                "resource": {"type": "queue", "id": "notice"},
                "intent": {"summary": "benchmark"},
                "payload": {"title": f"t {index}", "priority": "P4"},
            }
        ).encode()
        environ = post_environ("/api/v1/commands", body, self.token, f"n:{self.run}:{index}")
        chunks = b"".join(application(environ, lambda status, headers, exc_info=None: None))
        return json.loads(chunks)["effect_id"]

    def trial(self, index: int, news: bool) -> tuple[float, int]:
        """The notice lag in ms (the cancel's commit to the wait's return) and the reads."""
        from gateway import moves, services
        from gateway.models import Effect

        moves.published = self.real_published if news else (lambda effect_ids: None)
        moves.Listener.subscribed = self.real_subscribed if news else property(lambda self: False)
        effect_id = self.submit(index)
        wait = Wait(effect_id)
        wait.start()
        wait.ready.wait(5)
        time.sleep(random.uniform(0.010, 0.600))
        effect = Effect.objects.select_related("command").get(pk=effect_id)
        services.effect_cancel(effect=effect, principal=self.principal, reason="benchmark")
        committed = time.perf_counter()  # on_commit has published, if it publishes
        wait.join(15)
        return (wait.returned - committed) * 1000, wait.reads

    def restore(self) -> None:
        from gateway import moves

        moves.published, moves.Listener.subscribed = self.real_published, self.real_subscribed


if __name__ == "__main__":
    main()
