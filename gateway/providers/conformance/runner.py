"""The conformance runner: one case of the fault matrix against an adapter and its server.

It drives the adapter directly (``execute``, ``lookup``), reads the server's own records
through the driver after the call and at the end, and takes the gateway's decisions with
the helpers the dispatcher and the reconciler use (``classify_operation`` for a found
operation, ``not_found_proves_not_started`` for a key that is not found). It does not write
a ledger: "the outcome the gateway reaches" is the decision those rules take on this
adapter's answers, checked against the case.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from gateway.choices import Outcome
from gateway.lib.digest import payload_digest
from gateway.providers.base import (
    CallResult,
    ExecuteRequest,
    LookupStatus,
    ProviderAdapter,
    not_found_proves_not_started,
)
from gateway.providers.conformance.drivers import Driver
from gateway.providers.conformance.matrix import CASES, Case, Decision, Fault
from gateway.providers.conformance.proxy import FaultProxy
from gateway.providers.http import classify_operation

# Lookups of an operation in progress before the run gives up (the reconciler's budget is
# the contract's; the sandbox's processing answers two).
MAX_LOOKUPS = 5

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"


@dataclass(frozen=True)
class Sample:
    """A command the adapter under test can send: its type, resource and payload, and
    another payload for the same resource (sent with a used key, the mismatch case)."""

    type: str
    resource: dict[str, Any]
    payload: dict[str, Any]
    other_payload: dict[str, Any]
    completion_statuses: frozenset[str] = frozenset({"succeeded"})

    def request(
        self,
        key: str,
        *,
        timeout: float,
        resource: dict[str, Any] | None = None,
        payload: dict[str, Any] | None = None,
    ) -> ExecuteRequest:
        resource = self.resource if resource is None else resource
        payload = self.payload if payload is None else payload
        return ExecuteRequest(
            effect_id=f"eff_{key.rsplit(':', 1)[-1]}",
            type=self.type,
            idempotency_key=key,
            resource=resource,
            payload=payload,
            payload_digest=payload_digest(type=self.type, resource=resource, payload=payload),
            timeout=timeout,
        )


@dataclass(frozen=True)
class Subject:
    """What is checked: an adapter (made for a base URL, so it can be pointed at the fault
    proxy), its server's base URL, the server's driver, and a sample command."""

    adapter: Callable[[str], ProviderAdapter]
    base_url: str
    driver: Driver
    sample: Sample
    key_retention: timedelta = timedelta(days=1)
    timeout: float = 1.0
    # Cases whose expectation differs for this provider, by name (a provider whose 409 means
    # "locked, come back later" rather than "stale version"): each replaces the shipped case.
    overrides: Mapping[str, Case] = field(default_factory=dict)
    # False for a server that does not speak HTTP (SMTP): the adapter is pointed at the
    # server itself (``base_url`` may then be any URL its factory reads, e.g. smtp://host:port)
    # and every fault but a refused connection comes from the driver.
    proxied: bool = True
    # Cases that do not apply to this kind of provider, by name, with the reason (e.g.
    # ``matrix.NOT_FOR_MAIL``): reported SKIP with it, never run.
    not_applicable: Mapping[str, str] = field(default_factory=dict)


def proxy_for(subject: Subject) -> FaultProxy:
    """The fault proxy of a run: in front of the subject's server, or (a server the proxy
    cannot speak to) one that only lends its refusing port."""
    return FaultProxy(subject.base_url if subject.proxied else "http://127.0.0.1")


@dataclass
class CaseReport:
    case: Case
    status: str = PASS
    reached: Decision | None = None
    evidence: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def as_data(self) -> dict[str, Any]:
        return {
            "case": self.case.name,
            "status": self.status,
            "expected": str(self.case.reaches),
            "reached": str(self.reached) if self.reached else None,
            "problems": self.problems,
            "evidence": self.evidence,
        }


class _Skip(Exception):
    pass


def _describe(result: CallResult) -> str:
    text = f"{result.outcome.value}: {result.reason}"
    if result.http_status:
        text += f" (HTTP {result.http_status})"
    if result.error:
        text += f" [{result.error[:160]}]"
    if result.mismatch:
        text += " mismatch"
    if result.retry_after is not None:
        text += f" retry_after={result.retry_after:g}"
    return text


class _Run:
    """One case, step by step; each step adds evidence and, when the adapter or the server
    departs from the case, a problem."""

    def __init__(self, case: Case, subject: Subject, proxy: FaultProxy) -> None:
        self.case, self.subject, self.proxy = case, subject, proxy
        self.report = CaseReport(case)
        self.key = f"conformance:{case.name}:{secrets.token_hex(6)}"
        resource = subject.sample.resource
        if Fault.CONFLICT in case.faults:  # a resource of its own: the version stays stale
            resource = {**resource, "id": f"{resource.get('id')}-{self.key}", "version": 1}
        self.request = subject.sample.request(self.key, timeout=subject.timeout, resource=resource)
        self.sent = self.request  # what the faulty call sends (another body when reused)

    def note(self, text: str) -> None:
        self.report.evidence.append(text)

    def problem(self, text: str) -> None:
        self.report.problems.append(text)

    def adapter(self, *, refused: bool = False) -> ProviderAdapter:
        base_url = self.subject.base_url
        if refused or self.subject.proxied:
            base_url = self.proxy.front(base_url, refused=refused)
        return self.subject.adapter(base_url)

    def arrange(self) -> bool:
        """Make the case's faults; True when connections are to be refused."""
        for fault in self.case.faults:
            if fault == Fault.REFUSE:
                self.note(f"{fault}: the adapter is pointed at {self.proxy.refused_url}")
            elif fault == Fault.KEY_REUSED:
                first = self.adapter().execute(self.request)
                self.note(f"first send of the key: {_describe(first)}")
                if first.outcome != Outcome.CONFIRMED:
                    raise _Skip(f"the first send of the key did not confirm: {first.reason}")
                other = self.subject.sample.other_payload
                self.sent = self.subject.sample.request(
                    self.key, timeout=self.subject.timeout, payload=other
                )
            elif self.subject.driver.inject(fault, self.request, timeout=self.subject.timeout):
                self.note(f"{fault}: made by the server")
            elif self._by_proxy(fault):
                self.note(f"{fault}: made by the fault proxy")
            else:
                raise _Skip(f"{fault}: neither the server's driver nor the fault proxy makes it")
        return Fault.REFUSE in self.case.faults

    def _by_proxy(self, fault: Fault) -> bool:
        proxy, timeout = self.proxy, self.subject.timeout
        if not self.subject.proxied:
            return False
        if fault == Fault.RESET_BEFORE_COMMIT:
            proxy.add("reset")
        elif fault == Fault.DROP_AFTER_COMMIT:
            proxy.add("drop_after_forward")
        elif fault == Fault.ERROR_AFTER_COMMIT:
            proxy.add("error_after_forward", status=502)
        elif fault == Fault.SLOW:
            proxy.add("delay_after_forward", seconds=timeout + 1.5)
        elif fault == Fault.RATE_LIMITED:
            seconds = f"{self.case.retry_after or 1:g}"
            proxy.add("answer", status=429, headers={"Retry-After": seconds})
        elif fault == Fault.CONFLICT:
            proxy.add("answer", status=409, body={"error": "version_conflict"})
        else:
            return False
        return True

    def call(self, adapter: ProviderAdapter) -> CallResult | None:
        case = self.case
        first = None
        if case.execute:
            first = adapter.execute(self.sent)
            self.note(f"execute: {_describe(first)}")
            if first.outcome not in case.execute:
                allowed = " or ".join(sorted(o.value for o in case.execute))
                self.problem(f"execute answered {first.outcome.value}, not {allowed}")
            if case.mismatch and not first.mismatch:
                self.problem("execute did not report the mismatch")
            if case.retry_after is not None and first.retry_after != case.retry_after:
                self.problem(
                    f"execute reported retry_after={first.retry_after}, "
                    f"not the provider's {case.retry_after:g}"
                )
        held = self.subject.driver.operations(self.key)
        self.note(f"the server holds {held} operation(s) for the key after the call")
        if held != case.held_after_call:
            self.problem(f"the server holds {held} operation(s), not {case.held_after_call}")
        if first is not None and first.outcome == Outcome.NOT_STARTED and held:
            self.problem("NOT_STARTED, but the server holds the operation: it was received")
        return first

    def decide(self, adapter: ProviderAdapter, first: CallResult | None) -> Decision | None:
        """The gateway's decision on the adapter's answers (see the module's docstring)."""
        if first is not None:
            if first.mismatch:
                return Decision.TO_A_HUMAN
            if first.outcome == Outcome.CONFIRMED:
                return Decision.CONFIRMED
            if first.outcome == Outcome.REJECTED:
                return Decision.REJECTED
            if first.outcome == Outcome.NOT_STARTED:
                return Decision.SEND_AGAIN
        age = self.subject.key_retention * self.case.age_in_retentions
        for n in range(1, MAX_LOOKUPS + 1):
            found = adapter.lookup(
                idempotency_key=self.key,
                timeout=self.subject.timeout,
                payload_digest=self.request.payload_digest,
            )
            if found.status == LookupStatus.NOT_FOUND:
                self.note(f"lookup {n}: not found ({age} after the command)")
                if not_found_proves_not_started(age=age, key_retention=self.subject.key_retention):
                    return Decision.SEND_AGAIN
                return Decision.TO_A_HUMAN
            if found.status != LookupStatus.FOUND or found.operation is None:
                self.note(f"lookup {n}: {found.status} {found.http_status or ''} {found.error}")
                self.problem("the lookup by key proved nothing: the server was reachable")
                return None
            judged = classify_operation(
                found.operation,
                expected_digest=self.request.payload_digest,
                completion_statuses=self.subject.sample.completion_statuses,
            )
            self.note(f"lookup {n}: {_describe(judged)}")
            if judged.mismatch or judged.outcome == Outcome.UNKNOWN:
                return Decision.TO_A_HUMAN
            if judged.outcome == Outcome.CONFIRMED:
                return Decision.CONFIRMED
            if judged.outcome == Outcome.REJECTED:
                return Decision.REJECTED
        return Decision.TO_A_HUMAN  # still in progress after every lookup

    def send_again(self) -> None:
        again = self.adapter().execute(self.request)
        self.note(f"sent (again) with the same key: {_describe(again)}")
        if again.outcome != Outcome.CONFIRMED:
            self.problem(f"sent again with the same key, it answered {again.outcome.value}")

    def go(self) -> None:
        refused = self.arrange()
        adapter = self.adapter(refused=refused)
        first = self.call(adapter)
        decision = self.report.reached = self.decide(adapter, first)
        if decision != self.case.reaches:
            self.problem(f"the gateway would reach {decision}, not {self.case.reaches}")
        self.subject.driver.clear()
        self.proxy.clear()
        if decision == Decision.SEND_AGAIN:
            self.send_again()
        held = self.subject.driver.operations(self.key)
        self.note(f"the server holds {held} operation(s) for the key at the end")
        if held > 1:
            self.problem(f"the server holds {held} operations for one key: executed twice")
        elif held != self.case.held_at_end:
            self.problem(
                f"the server holds {held} operation(s) at the end, not {self.case.held_at_end}"
            )


def run_case(case: Case, subject: Subject, proxy: FaultProxy) -> CaseReport:
    """Run one case through ``proxy`` (a started :class:`FaultProxy` in front of
    ``subject.base_url``); faults are cleared afterwards whatever happened."""
    case = subject.overrides.get(case.name, case)
    if case.name in subject.not_applicable:
        return CaseReport(
            case, status=SKIP, evidence=[f"does not apply: {subject.not_applicable[case.name]}"]
        )
    run = _Run(case, subject, proxy)
    try:
        run.go()
    except _Skip as skipped:
        run.report.status = SKIP
        run.note(str(skipped))
        return run.report
    finally:
        subject.driver.clear()
        proxy.clear()
    run.report.status = FAIL if run.report.problems else PASS
    return run.report


def run_matrix(subject: Subject, cases: Iterable[Case] = CASES) -> list[CaseReport]:
    """Every case, in order, through a fault proxy of its own in front of the server."""
    with proxy_for(subject) as proxy:
        return [run_case(case, subject, proxy) for case in cases]


def format_table(reports: Iterable[CaseReport], *, verbose: bool = False) -> str:
    reports = list(reports)
    rows = [("CASE", "RESULT", "EXPECTED", "REACHED", "DETAIL")]
    for report in reports:
        detail = "; ".join(report.problems) or (report.evidence[-1] if report.evidence else "")
        if report.status == SKIP:
            detail = report.evidence[-1]
        rows.append(
            (
                report.case.name,
                report.status,
                str(report.case.reaches),
                str(report.reached or "-"),
                detail,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:4])) + "  " + row[4]
        for row in rows
    ]
    if verbose:
        for report in reports:
            lines.append(f"\n{report.case.name}: {report.status}")
            lines.extend(f"  - {line}" for line in report.evidence)
            lines.extend(f"  ! {line}" for line in report.problems)
    return "\n".join(lines)
