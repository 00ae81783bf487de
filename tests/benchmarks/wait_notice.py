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
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from gateway import moves, services
    from gateway.api import views
    from gateway.models import Effect, Principal
    from gateway.wsgi import application

    run = uuid.uuid4().hex[:8]
    token = agent_token("notice", f"notice-{run}")
    principal = Principal.objects.get(name=f"notice-{run}")

    def submit(index: int) -> str:
        body = json.dumps(
            {
                "type": "ticket.create",
                "resource": {"type": "queue", "id": "notice"},
                "intent": {"summary": "benchmark"},
                "payload": {"title": f"t {index}", "priority": "P4"},
            }
        ).encode()
        environ = post_environ("/api/v1/commands", body, token, f"n:{run}:{index}")
        chunks = b"".join(application(environ, lambda status, headers, exc_info=None: None))
        return json.loads(chunks)["effect_id"]

    class Wait(threading.Thread):
        def __init__(self, effect_id: str) -> None:
            super().__init__(daemon=True)
            self.effect_id, self.returned, self.reads = effect_id, 0.0, 0
            self.ready = threading.Event()

        def run(self) -> None:
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

    real_published, real_subscribed = moves.published, moves.Listener.subscribed
    moves.listener.start()
    while not moves.listener.subscribed:
        time.sleep(0.01)

    def trial(index: int, news: bool) -> tuple[float, int]:
        moves.published = real_published if news else (lambda effect_ids: None)
        moves.Listener.subscribed = real_subscribed if news else property(lambda self: False)
        effect_id = submit(index)
        wait = Wait(effect_id)
        wait.start()
        wait.ready.wait(5)
        time.sleep(random.uniform(0.010, 0.600))
        effect = Effect.objects.select_related("command").get(pk=effect_id)
        services.effect_cancel(effect=effect, principal=principal, reason="benchmark")
        committed = time.perf_counter()  # on_commit has published, if it publishes
        wait.join(15)
        return (wait.returned - committed) * 1000, wait.reads

    index = 0
    for round_ in range(options.rounds):
        found: dict[bool, list[tuple[float, int]]] = {True: [], False: []}
        for _ in range(options.trials):
            for news in (True, False):  # interleaved
                index += 1
                found[news].append(trial(index, news))
        for news in (True, False):
            lags = sorted(lag for lag, _ in found[news])
            reads = statistics.mean(r for _, r in found[news])
            print(
                f"round {round_ + 1} {'news   ' if news else 'polling'}: notice lag p50 "
                f"{statistics.median(lags):6.1f} ms  p95 {lags[int(len(lags) * 0.95) - 1]:6.1f} "
                f"max {lags[-1]:6.1f}  effect reads per wait {reads:.1f}  "
                f"(load {os.getloadavg()[0]:.2f})"
            )
    moves.published, moves.Listener.subscribed = real_published, real_subscribed


if __name__ == "__main__":
    main()
