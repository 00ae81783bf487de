"""The bench: the product against a raw PostgreSQL floor, side by side, in one run.

    make bench BENCH_ARGS="--quick"            # or: .venv/bin/python -m tests.benchmarks.bench

For each concurrency (1, 8, 32 by default) and each round, three passes run one after the other
against the same loopback sandbox provider (SPEC §6, in the bench's process):

- **the floor**: raw psycopg on a small connection pool, per effect ``INSERT … ON CONFLICT``
  → ``POST /operations`` → ``UPDATE``: the least any ledger-before-call design can cost. It
  runs twice: with httpx to the provider (the httpx floor, the reference of the targets) and
  with the standard library's client, as the product's adapter (the strict floor; skipped with
  ``--no-strict-floor``; ``floor`` says why both);
- **the product**: the real HTTP API served by gunicorn, real Celery workers (a thread pool,
  with the beat embedded, so the sweeper and the audit sequencer run) on PostgreSQL + Redis,
  from ``POST /api/v1/commands`` to CONFIRMED in the ledger, submitted by a client process of
  its own (``client``), as the floor runs in its own.

Printed per concurrency (medians of the rounds): effects/s of each and the ratios, submit and
end-to-end p50/p99, CPU ms per effect per process group read from ``/proc`` (web = gunicorn,
worker = Celery, pg = the PostgreSQL backends serving them), commits per effect (from
``pg_stat_database``), duplicates (the sandbox's operation log against the ledger), the audit
sealing lag and the machine's load. Then a replay pass at c=1 and, in process, the statements,
transactions and round trips of one submission and one dispatch; last, the verdicts
(``targets``).

The machine is shared and noisy: floor and product alternate within each round so that both
see the same noise, and the load average is printed with every line. Each round starts with a
``VACUUM (ANALYZE)`` of the database, outside the timed passes: autovacuum's work in a real
deployment, which a shared development server may not run. For the same reason, on a server
without autovacuum a stand-in (``autovacuum``) analyzes and vacuums the tables during the
product's passes at autovacuum's thresholds, on a connection whose CPU counts as the product's
PostgreSQL time (``--no-autovacuum`` leaves it out).

The product's closed loop (``--loop``): by default a client thread sends its next submission
once the last is answered, so ``c`` bounds the submissions in flight and the effects queue
behind them; the floor's threads each finish an effect before the next. ``--loop effect``
makes a client thread wait until its effect is CONFIRMED, so that ``c`` effects are in flight
on both sides (``client.Oracle`` says how it learns of it); ``--loop api`` learns of it as an
agent does, through ``GET /api/v1/effects/{id}?wait=``, whose cost is then the product's (and
whose caps on open long polls answer 429 beyond a few per web process).

Autovacuum analyzes a table once a tenth of it has changed, so an empty ledger's growing tables
are analyzed about every second, and in the paced passes those analyses set the submissions'
tail (the paced line says how many of the slowest 1 % overlapped one). ``--ledger N`` first
loads a settled history of N effects (tests/benchmarks/ledger_load.py, its tallies counted),
so that the run measures a ledger the size of a deployment's, analyzed as rarely as one is.

The modules: ``__main__`` (the entry point: servers, Django, options), ``options`` (the
command line), ``run`` (the passes), ``stack`` (the product's processes), ``client`` and
``floor`` (the two sides' load, each a process of its own), ``machine`` (``/proc`` and the
machine probe), ``stats`` (percentiles, medians, ratios), ``report`` (what is printed),
``targets`` (the verdicts), ``autovacuum`` (the stand-in). Nothing in the product imports
any of it (an import contract in pyproject.toml says so).
"""
