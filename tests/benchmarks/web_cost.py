"""What the web process spends on one submission, without the web server.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/eg_web \
    CELERY_BROKER_URL=redis://127.0.0.1:6379/13 \
        .venv/bin/python -m tests.benchmarks.web_cost --submissions 1000 [--budget] [--replay]

In one thread, it calls the WSGI application (``gateway.wsgi``: every middleware, the API lane,
the services) with the environ a server would build for ``POST /api/v1/commands``, for a new
agent of tenant ``webcost`` (an unlimited grant, or with ``--budget`` one with a count budget,
which the submission reserves), and prints per submission the CPU of this process and the wall
time, for three rounds. ``--replay`` sends one key over and over (the replay path);
``--profile`` runs one round under cProfile on CPU time instead. ``--pause MS`` adds, in each
round, a pass with a pause before every submission: on the development machine the same replay
took twice the CPU after a 2 ms pause as back to back, which is most of the difference between
this figure and a web process's. Nothing consumes what it submits: use a scratch database (the
effects stay PREPARED) and a Redis database of its own.

Against the bench (``python -m tests.benchmarks.bench``), which measures the web processes behind
gunicorn, the difference is the server's own work per request.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import time
import uuid
from collections import Counter

from tests.benchmarks.inprocess import agent_token, post_environ, setup_django


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--submissions", type=int, default=1000, help="per round")
    parser.add_argument("--budget", action="store_true", help="under a grant with a budget")
    parser.add_argument("--replay", action="store_true", help="one key, replayed")
    parser.add_argument("--profile", action="store_true", help="one round under cProfile")
    parser.add_argument(
        "--pause",
        type=float,
        default=0.0,
        metavar="MS",
        help="also run each round with this pause before every submission: what a request "
        "costs when the process was off the CPU before it, as a server's is between requests",
    )
    parser.add_argument("--sort", default="cumulative", help="the profile's order (tottime, …)")
    options = parser.parse_args()

    setup_django("webcost")  # announces that nobody answers
    from gateway.wsgi import application

    run = uuid.uuid4().hex[:8]
    grant = {"types": "*", "budget_count": 10**9} if options.budget else {}
    token = agent_token("webcost", f"web-{run}", **grant)
    answers: Counter[str] = Counter()

    def submit(index: int) -> None:
        key = f"web:{run}:{0 if options.replay else index}"
        title = "replayed" if options.replay else f"t {index}"
        body = json.dumps(
            {
                "type": "ticket.create",
                "resource": {"type": "queue", "id": "bench"},
                "intent": {"summary": "benchmark"},
                "payload": {"title": title, "priority": "P4"},
            }
        ).encode()
        environ = post_environ("/api/v1/commands", body, token, key)

        def start_response(status, headers, exc_info=None):
            answers[status] += 1

        for _chunk in application(environ, start_response):
            pass

    n = options.submissions
    for index in range(50):  # warm: the URLconf, the token and grant caches, the statements
        submit(-index - 1)
    if options.profile:
        profile = cProfile.Profile(time.thread_time)
        profile.enable()
        for index in range(n):
            submit(index)
        profile.disable()
        pstats.Stats(profile).sort_stats(options.sort).print_stats(50)
    else:
        passes = [("back to back", 0.0)]
        if options.pause:
            passes.append((f"each after a {options.pause:g} ms pause", options.pause / 1000))
        for round_ in range(3):
            for number, (name, pause) in enumerate(passes):
                first = (round_ * len(passes) + number) * n
                cpu, wall = time.process_time(), 0.0
                for index in range(n):
                    if pause:
                        time.sleep(pause)  # no CPU: the process is off it, as between requests
                    started = time.perf_counter()  # the submission's wall time alone
                    submit(first + index)
                    wall += time.perf_counter() - started
                cpu = time.process_time() - cpu
                print(
                    f"round {round_ + 1}, {name}: {cpu / n * 1000:.2f} ms CPU, "
                    f"{wall / n * 1000:.2f} ms wall per submission "
                    f"(load {os.getloadavg()[0]:.2f})"
                )
    print("answers:", dict(answers))


if __name__ == "__main__":
    main()
