"""The conformance kit against the bundled sandbox provider, run as a child process: the
SPEC §6 adapter passes the whole matrix, adapters broken on purpose fail the cases they
break, the fault proxy makes the faults a server cannot, and ``manage.py provider_check``
and the pytest plugin work as a team would use them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from gateway.choices import Outcome
from gateway.providers.conformance import (
    CASES_BY_NAME,
    FAIL,
    PASS,
    SKIP,
    Decision,
    FaultProxy,
    RecordsDriver,
    Sample,
    SandboxDriver,
    Subject,
    run_matrix,
)
from gateway.providers.conformance.pytest_plugin import assert_conformant, child_server
from gateway.providers.http import HttpProviderAdapter
from tests.providers.conformance_adapters import NotFoundIsUnreachable, TimeoutIsNotStarted

ROOT = Path(__file__).resolve().parents[2]
# The sandbox is a stand-in for an external system: it never touches the ledger.
CHILD_ENV = {
    **os.environ,
    "DJANGO_SETTINGS_MODULE": "gateway.settings",
    "DATABASE_URL": "postgres://nobody:nothing@127.0.0.1:9/none",
}
SAMPLE = Sample(
    "ticket.create",
    {"type": "queue", "id": "support"},
    {"title": "Printer on fire", "priority": "high"},
    {"title": "Printer on fire", "priority": "low"},
)


@pytest.fixture(scope="module")
def sandbox_url():
    command = [sys.executable, "manage.py", "run_sandbox_provider", "--port", "0"]
    with child_server(command, cwd=ROOT, env=CHILD_ENV) as url:
        yield url


def subject_for(url: str, adapter=HttpProviderAdapter, driver=None) -> Subject:
    base_url = f"{url}/tickets"
    return Subject(
        adapter=adapter,
        base_url=base_url,
        driver=driver or SandboxDriver(base_url),
        sample=SAMPLE,
        timeout=2.0,
    )


@pytest.fixture(scope="module")
def conformance_subject(sandbox_url) -> Subject:
    return subject_for(sandbox_url)


def test_the_spec6_adapter_passes(conformance_report):
    """One test per case of the matrix (the plugin's parametrisation)."""
    assert_conformant(conformance_report)
    assert conformance_report.status == PASS


def failing(reports) -> dict[str, list[str]]:
    return {r.case.name: r.problems for r in reports if r.status == FAIL}


def test_an_adapter_that_calls_a_read_timeout_not_started_fails_the_timeout_case(sandbox_url):
    problems = failing(run_matrix(subject_for(sandbox_url, adapter=TimeoutIsNotStarted)))
    assert set(problems) == {"timeout"}
    assert "execute answered not_started, not unknown" in problems["timeout"]
    assert any("it was received" in p for p in problems["timeout"])
    assert any("would reach send_again, not confirmed" in p for p in problems["timeout"])


def test_an_adapter_that_hides_not_found_fails_the_cases_a_lookup_settles(sandbox_url):
    problems = failing(run_matrix(subject_for(sandbox_url, adapter=NotFoundIsUnreachable)))
    assert set(problems) == {
        "reset_before_commit",
        "rate_limited_429",
        "not_found_within_retention",
        "not_found_after_retention",
    }
    for found in problems.values():
        assert "the lookup by key proved nothing: the server was reachable" in found


def test_with_an_oracle_alone_the_fault_proxy_makes_the_faults(sandbox_url):
    """A server that makes no fault of itself: drop, slowness and the 409 come from the
    proxy; what only a server can do (stay processing, forget a key) is skipped."""
    sandbox = SandboxDriver(f"{sandbox_url}/tickets")
    subject = subject_for(sandbox_url, driver=RecordsDriver(sandbox.operations))
    reports = {r.case.name: r for r in run_matrix(subject)}
    skipped = {name for name, r in reports.items() if r.status == SKIP}
    assert skipped == {
        "processing_then_succeeded",
        "processing_then_failed",
        "not_found_after_retention",
    }
    assert {r.status for name, r in reports.items() if name not in skipped} == {PASS}
    for name in ("drop_after_commit", "timeout", "conflict_409"):
        assert any("made by the fault proxy" in e for e in reports[name].evidence), name


def test_the_sandbox_makes_every_fault_a_server_can_and_the_proxy_only_refuses(sandbox_url):
    """The SPEC §6 adapter meets the server's own reset, 5xx and 429 (gateway.providers.
    sandbox FAULT_PARAMS), not a proxy's: the proxy only lends a port where nothing listens."""
    reports = {r.case.name: r for r in run_matrix(subject_for(sandbox_url))}
    assert {r.status for r in reports.values()} == {PASS}
    for name in (
        "reset_before_commit",
        "drop_after_commit",
        "error_after_commit",
        "timeout",
        "conflict_409",
        "rate_limited_429",
    ):
        evidence = reports[name].evidence
        assert any("made by the server" in e for e in evidence), (name, evidence)
        assert not any("made by the fault proxy" in e for e in evidence), (name, evidence)
    assert any("HTTP 500" in e for e in reports["error_after_commit"].evidence)
    assert any("HTTP 429" in e for e in reports["rate_limited_429"].evidence)
    assert any("pointed at" in e for e in reports["connection_refused"].evidence)


def test_the_fault_proxy_refuses_unknown_actions_and_bad_upstreams():
    with pytest.raises(ValueError, match="not an http"):
        FaultProxy("ftp://example.test")
    proxy = FaultProxy("http://127.0.0.1:9")
    try:
        with pytest.raises(ValueError, match="unknown action 'explode'"):
            proxy.add("explode")
        assert proxy.front("http://127.0.0.1:9/tickets") == f"{proxy.url}/tickets"
    finally:
        proxy.stop()


def provider_check(sandbox_url: str, *args: str) -> subprocess.CompletedProcess:
    env = {**CHILD_ENV, "GATEWAY_PROVIDER_URLS": json.dumps({"tickets": f"{sandbox_url}/tickets"})}
    return subprocess.run(
        [sys.executable, "manage.py", "provider_check", "tickets", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_provider_check_passes_the_sandbox(sandbox_url):
    done = provider_check(sandbox_url, "--timeout", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split()[:2] for line in done.stdout.splitlines()[2:]]
    assert len(rows) == 12 and {result for _, result in rows} == {"PASS"}, done.stdout


def test_provider_check_takes_a_gateway_providers_entry(sandbox_url):
    """The entry's URL is the server's; its adapter (with its credential) is pointed at the
    proxy, and its own long timeout is left to the kit's, or the slow cases could not fail."""
    entry = {
        "adapter": "http",
        "base_url": f"{sandbox_url}/tickets",
        "timeout": 25,
        "credential": {"env": "TEST_TICKETS_TOKEN"},
    }
    env = {
        **CHILD_ENV,
        "GATEWAY_PROVIDERS": json.dumps({"tickets": entry}),
        "TEST_TICKETS_TOKEN": "tickets-token-for-the-check",
    }
    done = subprocess.run(
        [sys.executable, "manage.py", "provider_check", "tickets", "--timeout", "2"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[0] == f"tickets (ticket.create) at {sandbox_url}/tickets"
    rows = [line.split()[:2] for line in done.stdout.splitlines()[2:]]
    assert len(rows) == 12 and {result for _, result in rows} == {"PASS"}, done.stdout


def test_provider_check_fails_a_broken_adapter_and_exits_1(sandbox_url):
    adapter = "tests.providers.conformance_adapters.TimeoutIsNotStarted"
    cases = ["--case", "timeout", "--case", "drop_after_commit"]
    done = provider_check(sandbox_url, "--adapter", adapter, "--timeout", "2", *cases)
    assert done.returncode == 1, done.stdout + done.stderr
    rows = {line.split()[0]: line.split()[1] for line in done.stdout.splitlines()[2:]}
    assert rows == {"timeout": "FAIL", "drop_after_commit": "PASS"}
    assert "1 case(s) failed: timeout" in done.stderr


def test_provider_check_needs_a_driver_for_a_server_that_is_not_the_sandbox(settings):
    settings.GATEWAY_PROVIDER_URLS = {"tickets": "http://127.0.0.1:9/tickets"}
    with pytest.raises(CommandError, match="name a driver for it with --driver"):
        call_command("provider_check", "tickets")
    with pytest.raises(CommandError, match="no URL for provider 'nowhere'"):
        call_command("provider_check", "nowhere")


def test_a_team_suite_runs_the_matrix_with_the_plugin(tmp_path):
    """The plugin as the guide shows it, in a suite of its own (a separate pytest run)."""
    (tmp_path / "conftest.py").write_text(
        textwrap.dedent(
            """
            import pytest
            from gateway.providers.conformance import Sample, SandboxDriver, Subject
            from gateway.providers.http import HttpProviderAdapter
            from gateway.providers.sandbox import SandboxServer

            pytest_plugins = ["gateway.providers.conformance.pytest_plugin"]

            @pytest.fixture(scope="session")
            def conformance_subject():
                with SandboxServer() as server:
                    base_url = server.base_url("tickets")
                    yield Subject(
                        adapter=HttpProviderAdapter,
                        base_url=base_url,
                        driver=SandboxDriver(base_url),
                        sample=Sample("ticket.create", {"type": "queue", "id": "q"},
                                      {"title": "a"}, {"title": "b"}),
                        timeout=2.0,
                    )
            """
        )
    )
    (tmp_path / "test_ours.py").write_text(
        textwrap.dedent(
            """
            import pytest
            from gateway.providers.conformance.pytest_plugin import assert_conformant

            def test_conformance(conformance_report):
                assert_conformant(conformance_report)

            @pytest.mark.conformance_cases("timeout", "conflict_409")
            def test_two_cases(conformance_case, conformance_report):
                assert conformance_report.case is conformance_case
            """
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env={**CHILD_ENV, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "14 passed" in done.stdout, done.stdout


def test_a_provider_may_declare_what_a_case_means_for_it(sandbox_url):
    """A provider whose 409 means "locked, come back later" declares it; the SPEC §6 adapter,
    for which a 409 is a stale version, then fails that case: the override is what is checked."""
    locked = replace(
        CASES_BY_NAME["conflict_409"],
        execute=frozenset({Outcome.NOT_STARTED, Outcome.UNKNOWN}),
        reaches=Decision.SEND_AGAIN,
        held_at_end=1,
    )
    subject = replace(subject_for(sandbox_url), overrides={"conflict_409": locked})
    [report] = run_matrix(subject, [CASES_BY_NAME["conflict_409"]])
    assert report.status == FAIL
    assert report.case is locked
    assert "execute answered rejected, not not_started or unknown" in report.problems
