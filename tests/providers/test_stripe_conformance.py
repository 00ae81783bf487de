"""The Stripe adapter through the conformance kit, against stripe-stateful-mock run as a child
process: the oracle is the mock's own charges, counted by the idempotency key in their
metadata. The mock cannot stay "processing" or forget a key on demand: those cases SKIP."""

from __future__ import annotations

import dataclasses

import pytest
import stripe

from gateway.choices import Outcome
from gateway.contracts import CONTRACTS
from gateway.providers.conformance import CASES_BY_NAME, Decision, RecordsDriver, Sample, Subject
from gateway.providers.conformance.pytest_plugin import assert_conformant
from gateway.providers.stripe import StripeAdapter
from tests.providers.stripe_mock import API_KEY, StripeMock, node_missing

pytestmark = pytest.mark.skipif(bool(node_missing()), reason=node_missing() or "node is here")

pytest_plugins = ["gateway.providers.conformance.pytest_plugin"]

SAMPLE = Sample(
    "billing.charge.create",
    {"type": "order", "id": "ord_conformance"},
    {"amount": 4999, "currency": "EUR", "customer_id": "cus_42"},
    {"amount": 5999, "currency": "EUR", "customer_id": "cus_42"},
)
# Stripe documents a 409 as a conflict with another request on the same object or key
# (lock_timeout, idempotency_key_in_use): nothing was executed, the same key is sent again.
LOCKED = dataclasses.replace(
    CASES_BY_NAME["conflict_409"],
    execute=frozenset({Outcome.NOT_STARTED, Outcome.UNKNOWN}),
    reaches=Decision.SEND_AGAIN,
    held_at_end=1,
)


def charges_by_metadata(url: str):
    """The oracle: how many charges the mock holds whose metadata names the key."""
    client = stripe.StripeClient(API_KEY, base_addresses={"api": url}, max_network_retries=0)

    def operations(key: str) -> int:
        charges = client.v1.charges.list(params={"limit": 100}).auto_paging_iter()
        return sum(
            1 for charge in charges if charge.metadata.to_dict().get("idempotency_key") == key
        )

    return operations


@pytest.fixture(scope="module")
def conformance_subject():
    mock = StripeMock()
    mock.start()
    contract = CONTRACTS["billing.charge.create"]
    try:
        yield Subject(
            adapter=lambda base_url: StripeAdapter(
                api_base=base_url, api_key=API_KEY, contract=contract, default_source="tok_visa"
            ),
            base_url=mock.url,
            driver=RecordsDriver(charges_by_metadata(mock.url)),
            sample=SAMPLE,
            timeout=2.0,
            overrides={"conflict_409": LOCKED},
        )
    finally:
        mock.stop()


def test_the_stripe_adapter_passes(conformance_report):
    assert_conformant(conformance_report)
