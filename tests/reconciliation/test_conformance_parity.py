"""The conformance kit's decisions against the gateway's own: each case whose fault a ledger
run can make is run twice against the sandbox provider, once by the kit (adapter and rules)
and once through the product (submit, dispatch, the reconciler, a second dispatch when the
effect is NOT_STARTED), and both must end in the same place, with one operation at most."""

from __future__ import annotations

import time

import pytest
from django.utils import timezone

from gateway.models import Effect
from gateway.providers.conformance import (
    CASES_BY_NAME,
    PASS,
    Decision,
    FaultProxy,
    Sample,
    SandboxDriver,
    Subject,
    run_case,
)
from gateway.providers.http import HttpProviderAdapter
from reconciliation import services
from tests.reconciliation.conftest import TICKET, fresh, make_due, operations

pytestmark = pytest.mark.django_db

# Where the product ends for each decision of the kit.
ENDS = {
    Decision.CONFIRMED: ("CONFIRMED", 1),  # (status, attempts)
    Decision.REJECTED: ("REJECTED", 1),
    Decision.SEND_AGAIN: ("CONFIRMED", 2),
}
TIMEOUT = 2.0  # a loaded machine answers a normal call within it


def wait_out_the_pause(effect: Effect) -> None:
    """A provider that answered 429 with Retry-After is paused for every worker until then
    (gateway.providers.protection): the next send waits as the gateway's would."""
    from gateway.contracts import get_contract
    from gateway.providers import protection

    provider = get_contract(effect.type).provider
    paused_until = protection.snapshot()[provider].paused_until
    if paused_until is not None:
        time.sleep(min(5.0, max(0.0, (paused_until - timezone.now()).total_seconds() + 0.05)))


def through_the_gateway(effect: Effect, dispatch) -> Effect:
    """Dispatch, then what the gateway does next, until the effect settles."""
    effect = dispatch(effect)
    for _ in range(6):
        if effect.status in ("CONFIRMED", "REJECTED") or effect.escalated:
            break
        if effect.status == "NOT_STARTED":
            wait_out_the_pause(effect)
            effect = dispatch(effect)
        else:
            make_due(effect)
            services.reconcile_next_batch()
            effect = fresh(effect)
    return effect


@pytest.mark.parametrize(
    "name",
    [
        "reset_before_commit",
        "drop_after_commit",
        "error_after_commit",
        "timeout",
        "rate_limited_429",
        "processing_then_succeeded",
        "processing_then_failed",
    ],
)
def test_the_kit_and_the_gateway_reach_the_same_end(
    name, recon_server, recon_sandbox, recon_submit, recon_dispatch, settings
):
    case = CASES_BY_NAME[name]
    base_url = recon_server.base_url("tickets")
    driver = SandboxDriver(base_url)
    sample = Sample(TICKET["type"], TICKET["resource"], TICKET["payload"], {"title": "other"})
    with FaultProxy(base_url) as proxy:
        subject = Subject(HttpProviderAdapter, base_url, driver, sample, timeout=TIMEOUT)
        kit = run_case(case, subject, proxy)
        assert kit.status == PASS, kit.problems

        settings.GATEWAY_PROVIDER_URLS = {**settings.GATEWAY_PROVIDER_URLS}
        settings.GATEWAY_PROVIDER_URLS["tickets"] = proxy.front(base_url)
        settings.GATEWAY_PROVIDER_TIMEOUT = TIMEOUT
        request = sample.request("parity", timeout=TIMEOUT)
        for fault in case.faults:  # the sandbox makes each of these faults itself
            assert driver.inject(fault, request, timeout=TIMEOUT), fault
        effect = through_the_gateway(recon_submit(), recon_dispatch)
        driver.clear()

    status, attempts = ENDS[kit.reached]
    assert (effect.status, effect.attempt_count) == (status, attempts), kit.evidence
    assert len(operations(recon_sandbox, effect)) == case.held_at_end
