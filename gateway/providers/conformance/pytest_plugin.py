"""The conformance matrix as tests in a team's own suite (a pytest plugin).

    # conftest.py
    pytest_plugins = ["gateway.providers.conformance.pytest_plugin"]

    @pytest.fixture(scope="session")
    def conformance_subject(my_server):
        return Subject(
            adapter=MyAdapter,                 # called with a base URL (the fault proxy's)
            base_url=my_server.base_url,
            driver=MyDriver(my_server),        # the server's own records, its faults
            sample=Sample("acme.thing.create", {...}, {...}, {...}),
        )

    # test_conformance.py
    from gateway.providers.conformance.pytest_plugin import assert_conformant

    def test_conformance(conformance_report):
        assert_conformant(conformance_report)

Any test that asks for ``conformance_case`` (``conformance_report`` does) runs once per case
of the matrix, with the case's name as its id; ``@pytest.mark.conformance_cases("timeout",
...)`` narrows it. A case the driver and the fault proxy cannot make is skipped, with the
reason. :func:`child_server` starts a server as a child process and yields its URL.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pytest

from gateway.providers.conformance.matrix import CASES, CASES_BY_NAME, Case
from gateway.providers.conformance.proxy import FaultProxy
from gateway.providers.conformance.runner import SKIP, CaseReport, Subject, proxy_for, run_case


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "conformance_cases(*names): run only these cases of the conformance matrix"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "conformance_case" not in metafunc.fixturenames:
        return
    cases: Sequence[Case] = CASES
    marker = metafunc.definition.get_closest_marker("conformance_cases")
    if marker is not None:
        unknown = [name for name in marker.args if name not in CASES_BY_NAME]
        if unknown:
            raise pytest.UsageError(f"unknown conformance cases: {', '.join(unknown)}")
        cases = [CASES_BY_NAME[name] for name in marker.args]
    metafunc.parametrize("conformance_case", cases, ids=[case.name for case in cases])


@pytest.fixture
def conformance_proxy(conformance_subject: Subject) -> Iterator[FaultProxy]:
    """A fault proxy in front of the subject's server, for one test."""
    with proxy_for(conformance_subject) as proxy:
        yield proxy


@pytest.fixture
def conformance_report(
    conformance_case: Case, conformance_subject: Subject, conformance_proxy: FaultProxy
) -> CaseReport:
    """The case run against the subject; skipped when it cannot be made."""
    report = run_case(conformance_case, conformance_subject, conformance_proxy)
    if report.status == SKIP:
        pytest.skip(report.evidence[-1])
    return report


def assert_conformant(report: CaseReport) -> None:
    """Fail with the case's problems and every step's evidence."""
    if report.problems:
        lines = [f"{report.case.name} ({report.case.title}): {report.case.explanation}"]
        lines += [f"  ! {problem}" for problem in report.problems]
        lines += [f"  - {step}" for step in report.evidence]
        raise AssertionError("\n".join(lines))


@contextmanager
def child_server(
    command: Sequence[str],
    *,
    url_pattern: str = r"https?://\S+",
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> Iterator[str]:
    """Run ``command`` as a child process until its stdout prints a URL (the first match of
    ``url_pattern``, e.g. "listening on http://127.0.0.1:PORT"); yield it; stop the child
    (SIGTERM, then SIGKILL) afterwards."""
    process = subprocess.Popen(
        list(command), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    watchdog = threading.Timer(timeout, process.kill)
    watchdog.start()
    try:
        assert process.stdout is not None
        seen = []
        for line in process.stdout:
            seen.append(line)
            found = re.search(url_pattern, line)
            if found:
                break
        else:
            errors = process.stderr.read() if process.stderr else ""
            raise RuntimeError(f"{command[0]} printed no URL: {''.join(seen)}{errors}")
        watchdog.cancel()
        for stream in (process.stdout, process.stderr):  # a full pipe would stall the child
            if stream is not None:
                threading.Thread(target=stream.read, daemon=True).start()
        yield found.group(0)
    finally:
        watchdog.cancel()
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
