"""`manage.py demo --scenario incidents`: what an on-call engineer meets, so that the console
is not empty on the first start.

Everything goes through the public surfaces of a running demo, as an agent and an outage
would: the gateway's API with the demo agent's token, and the sandbox provider's fault
switches. Nothing is written to the database directly, so every row, event and case is the
one the product itself makes. It seeds:

- a saga waiting on manual compensation: an order fulfilled, then cancelled with
  compensation; the email cannot be taken back, so its owner gets a task;
- a paused saga: an order whose charge got no answer (the connection dropped after the
  commit) while the billing provider's lookups are down, so the charge stays UNKNOWN;
- another UNKNOWN charge, on its own, under the same outage;
- a receipt mismatch: a ticket whose provider receipt carries another payload digest;
- two refunds over 100.00 waiting for an approver.

The outage (billing lookups down) lasts until the sandbox's faults are cleared:
``curl -X DELETE $SANDBOX/_faults``; the reconciler then settles both charges by itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import httpx

from gateway.contracts import get_contract

TIMEOUT = 60.0
POLL = 0.5


class ScenarioError(Exception):
    """A step did not reach the state it should have; the message says which."""


class _Api:
    def __init__(self, base: str, token: str, alive: Callable[[], bool]) -> None:
        self.client = httpx.Client(
            base_url=base.rstrip("/") + "/api/v1",
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
            trust_env=False,
        )
        self.alive = alive

    def call(self, method: str, path: str, *, expect: tuple[int, ...], **kwargs: Any) -> dict:
        response = self.client.request(method, path, **kwargs)
        if response.status_code not in expect:
            raise ScenarioError(f"{method} {path} answered {response.status_code}: {response.text}")
        return response.json()

    def submit(self, key: str, type: str, *, payload: dict | None = None, **extra: Any) -> str:
        contract = get_contract(type)
        assert contract is not None, type
        example = contract.example
        body = {
            "type": type,
            "resource": extra.pop("resource", example["resource"]),
            "payload": {**example["payload"], **(payload or {})},
            "intent": extra.pop("intent", {"summary": f"demo: {type}"}),
            **extra,
        }
        answer = self.call(
            "POST", "/commands", json=body, headers={"Idempotency-Key": key}, expect=(200, 201)
        )
        return answer["effect_id"]

    def wait(self, path: str, field: str, wanted: set[str], what: str) -> dict:
        deadline = time.monotonic() + TIMEOUT
        while True:
            body = self.call("GET", path, expect=(200,))
            if body.get(field) in wanted:
                return body
            if not self.alive():
                raise ScenarioError(f"stopped while waiting for {what}")
            if time.monotonic() > deadline:
                raise ScenarioError(
                    f"{what}: still {body.get(field)} after {TIMEOUT:.0f}s, not {sorted(wanted)}"
                )
            time.sleep(POLL)


def _fault(sandbox: httpx.Client, **spec: Any) -> None:
    response = sandbox.post("/_faults", json=spec)
    if response.status_code != 201:
        raise ScenarioError(f"the sandbox refused fault {spec}: {response.text}")


def seed(
    *,
    base: str,
    sandbox_url: str,
    agent_token: str,
    say: Callable[[str], None],
    alive: Callable[[], bool],
) -> str:
    """Seed the scenario against a running demo; returns a one-line summary."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request is noise here
    api = _Api(base, agent_token, alive)
    sandbox = httpx.Client(base_url=sandbox_url, timeout=10, trust_env=False)
    definitions = api.call("GET", "/saga-definitions", expect=(200,))
    definitions = definitions.get("results", definitions)
    order = next(d for d in definitions if d["name"] == "order.fulfillment")["example"]
    _cancelled_order(api, order, say)
    _billing_outage(api, sandbox, order, say)
    _mismatched_ticket(api, sandbox, say)
    _refunds_waiting(api, say)
    return (
        "incidents: 1 manual compensation, 1 paused saga, 2 UNKNOWN charges (billing lookups "
        f"down until `curl -X DELETE {sandbox_url}/_faults`), 1 receipt mismatch, "
        "2 approvals"
    )


def _cancelled_order(api: _Api, order: dict[str, Any], say: Callable[[str], None]) -> None:
    """1. Fulfilled, then cancelled with compensation: the email goes to its owner by hand."""
    saga = api.call(
        "POST",
        "/sagas",
        json={"definition": "order.fulfillment", "inputs": {**order, "order_id": "ord_1001"}},
        headers={"Idempotency-Key": "demo-order-1001"},
        expect=(200, 201),
    )
    api.wait(f"/sagas/{saga['saga_id']}", "state", {"COMPLETED"}, "order ord_1001 to complete")
    api.call(
        "POST",
        f"/sagas/{saga['saga_id']}/cancel",
        json={"compensate": True, "reason": "the customer returned the order"},
        expect=(200, 409),
    )
    api.wait(
        f"/sagas/{saga['saga_id']}",
        "state",
        {"MANUAL_COMPENSATION"},
        "order ord_1001 to wait on a manual compensation",
    )
    say("scenario: order ord_1001 cancelled; its email needs a manual compensation")


def _billing_outage(
    api: _Api, sandbox: httpx.Client, order: dict[str, Any], say: Callable[[str], None]
) -> None:
    """2. The billing provider's lookups go down, and two charges lose their answer."""
    _fault(sandbox, fault="lookup_unreachable", provider="billing", times=None)
    _fault(sandbox, fault="commit_then_drop", type="billing.charge.create", times=2)
    paused = api.call(
        "POST",
        "/sagas",
        json={"definition": "order.fulfillment", "inputs": {**order, "order_id": "ord_1002"}},
        headers={"Idempotency-Key": "demo-order-1002"},
        expect=(200, 201),
    )
    api.wait(f"/sagas/{paused['saga_id']}", "state", {"PAUSED_UNKNOWN"}, "order ord_1002 to pause")
    charge = api.submit(
        "demo-charge-1003",
        "billing.charge.create",
        resource={"type": "order", "id": "ord_1003", "version": 1},
        payload={"amount": 12900, "customer_id": "cus_77"},
    )
    api.wait(f"/effects/{charge}", "status", {"UNKNOWN"}, "charge ord_1003 to be UNKNOWN")
    say("scenario: billing lookups are down; order ord_1002 paused, charge ord_1003 UNKNOWN")


def _mismatched_ticket(api: _Api, sandbox: httpx.Client, say: Callable[[str], None]) -> None:
    """3. A receipt that does not match what was sent."""
    _fault(sandbox, fault="digest_mismatch", type="ticket.create", times=1)
    ticket = api.submit(
        "demo-ticket-mismatch",
        "ticket.create",
        payload={"title": "Refund request from cus_42", "priority": "P3"},
    )
    api.wait(
        f"/effects/{ticket}",
        "status",
        {"CONFIRMED", "UNKNOWN"},
        "the mismatched ticket to settle",
    )
    say("scenario: ticket receipt mismatch recorded")


def _refunds_waiting(api: _Api, say: Callable[[str], None]) -> None:
    """4. Refunds over 100.00 wait for an approver (alice)."""
    for number, amount in ((1004, 25000), (1005, 18000)):
        api.submit(
            f"demo-refund-{number}",
            "billing.refund.create",
            resource={"type": "order", "id": f"ord_{number}", "version": 1},
            payload={"amount": amount, "reason": "damaged on arrival"},
            intent={"summary": f"refund order ord_{number}, damaged on arrival"},
        )
    say("scenario: two refunds wait for an approver")
