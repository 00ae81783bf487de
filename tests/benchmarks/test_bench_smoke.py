"""The bench end to end with its smallest passes: its own web node and Celery worker on the
test database and broker, a floor pass, a product pass, the replay, the count of round trips
and the verdicts. Figures here mean nothing (a test machine, eight effects); what is checked is
that every part runs, agrees with the ledger and prints what the docs quote."""

from __future__ import annotations

import re
import subprocess
import sys

import psycopg
import pytest

from tests.benchmarks.bench.stack import ROOT
from tests.benchmarks.test_bench_harness import _dsn
from tests.support.processes import child_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


@pytest.mark.timeout(300)  # the passes and the fault pass, on two shared cores
def test_the_smallest_bench_runs_and_finds_no_duplicate():
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tests.benchmarks.bench", "--quick", "--concurrency", "1",
             "--effects", "8", "--no-strict-floor", "--timeout", "60",
             "--fault-effects", "4", "--fault-leases", "2"],
            cwd=ROOT,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=270,
            check=False,
        )  # fmt: skip
    finally:
        with psycopg.connect(_dsn(), autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS bench_floor")  # the floor's own table
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert re.search(r"^bench \w{8}: c=\[1\], 1 round\(s\); 1 gunicorn", out, re.M), out
    # Every effect of the product's pass CONFIRMED, none answered wrong, no key twice.
    assert re.search(r"c=1 +round 1: floor +[\d.]+/s +product +[\d.]+/s \(8/8, wrong 0\)", out)
    assert re.search(r"; dups 0/0; load ", out), out
    assert re.search(r"^\| 1 \| \d+ \| [\d.]+ \| [\d.]+ \| nan \| nan \| .* \| 0/0 \| ", out, re.M)
    assert re.search(r"^replay over HTTP at c=1: p50 [\d.]+ ms, p99 [\d.]+ ms \(200 requests\)$",
                     out, re.M)  # fmt: skip
    assert re.search(
        r"^round trips per effect \(in process\): submission \d+ statements", out, re.M
    )
    # The fault pass: every dropped answer settled by a lookup, every lease recovered, one
    # operation per key.
    assert re.search(r"UNKNOWN -> CONFIRMED after the first lookup would succeed \(4 effects", out)
    assert "due times seen 4 of 4; CONFIRMED 4 of 4; provider operations 4 for 4 keys" in out
    assert (
        "recovered 2 of 2; CONFIRMED 2 of 2 after the lookup; provider operations 2 for 2 keys"
        in out
    )
    assert "| target | this run | met |" in out
    assert "| growing with concurrency | one concurrency run | not measured |" in out
