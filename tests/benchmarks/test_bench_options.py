"""The bench's command line (tests.benchmarks.bench.options): what ``make bench BENCH_ARGS=…``
passes must parse as it always has, and a malformed option must stop the run before anything
starts, saying which."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.benchmarks.bench.options import BenchError, parse, web_node_env
from tests.benchmarks.bench.stack import ROOT, web_server_command, worker_command


def test_no_options_are_the_documented_defaults():
    options = parse([])
    assert options["concurrency"] == [1, 8, 32]
    assert (options["rounds"], options["effects"], options["quick"]) == (3, 0, False)
    assert (options["loop"], options["paced"], options["paced_rate"]) == ("submission", 0.0, 0.0)
    assert (options["web_nodes"], options["web_workers"], options["web_threads"]) == (1, 2, 3)
    assert options["web_server"] == "gunicorn"
    assert (options["worker_processes"], options["worker_concurrency"]) == (1, 4)
    assert (options["worker_pool"], options["floor_pool"], options["tenants"]) == ("threads", 4, 1)
    assert (options["ledger"], options["timeout"], options["port"]) == (0, 180, 0)
    assert not (options["no_strict_floor"] or options["no_autovacuum"])


def test_the_makefiles_example_parses():
    options = parse(["--ledger", "200000", "--loop", "effect", "--paced", "0.5"])
    assert (options["ledger"], options["loop"], options["paced"]) == (200_000, "effect", 0.5)


def test_concurrencies_are_a_comma_separated_list():
    assert parse(["--concurrency", "1, 8,"])["concurrency"] == [1, 8]
    assert parse(["--concurrency=32"])["concurrency"] == [32]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--concurrency", "1,x"], "expected integers such as 1,8,32"),
        (["--concurrency", "0"], "expected integers ≥ 1"),
        (["--rounds", "0"], "--rounds must be at least 1"),
        (["--web-nodes", "0"], "--web-nodes must be at least 1"),
        (["--loop", "forever"], "invalid choice: 'forever'"),
        (["--web-node-env", "1:GATEWAY_X=1"], "there are 1 web node(s), from 0"),
        (["--web-nodes", "2", "--web-node-env", "GATEWAY_X=1"], "expected NODE:NAME=VALUE"),
        (["--quikc"], "unrecognized arguments: --quikc"),
    ],
)
def test_a_malformed_option_stops_with_the_usage_and_what_is_wrong(argv, says, capsys):
    with pytest.raises(SystemExit) as stopped:
        parse(argv)
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("usage: python -m tests.benchmarks.bench")
    assert says in error


def test_each_web_node_gets_its_own_environment():
    assert web_node_env(["1:GATEWAY_X=1", "1:GATEWAY_Y=a=b", "0:Z="], 2) == {
        1: {"GATEWAY_X": "1", "GATEWAY_Y": "a=b"},
        0: {"Z": ""},
    }
    for bad in (["2:GATEWAY_X=1"], ["x:GATEWAY_X=1"], ["1:GATEWAY_X"], ["GATEWAY_X=1"]):
        with pytest.raises(BenchError):
            web_node_env(bad, 2)


def test_the_web_nodes_and_workers_are_started_as_the_options_say(tmp_path):
    options = parse(["--web-workers", "3", "--web-threads", "5", "--worker-concurrency", "6"])
    web = web_server_command(options, 8123)
    assert web[1:4] == ["-m", "gunicorn", "gateway.wsgi"]
    assert web[web.index("-w") + 1] == "3" and web[web.index("--threads") + 1] == "5"
    assert web[web.index("-b") + 1] == "127.0.0.1:8123"
    granian = web_server_command({**options, "web_server": "granian"}, 8123)
    assert granian[granian.index("--blocking-threads") + 1] == "5"
    first, second = (worker_command(options, "r1", index, tmp_path) for index in (0, 1))
    assert first[first.index("--concurrency") + 1] == "6"
    assert first[first.index("-Q") + 1] == "bench-r1,bench-r1-audit"
    assert "-B" in first and "-B" not in second  # one beat in the run


def test_help_answers_without_starting_a_server():
    done = subprocess.run(
        [sys.executable, "-m", "tests.benchmarks.bench", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},  # no DATABASE_URL: it would start the embedded ones
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "--ledger EFFECTS" in done.stdout and "--loop {submission,effect,api}" in done.stdout
