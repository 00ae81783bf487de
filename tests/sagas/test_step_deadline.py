"""A saga step's deadline on the waker's due times: a step that waits for an approver past its
``expires_in`` is expired by the waker (reconciliation.services.expiry), and the run moves on
at once, as its failure policy says: release.production's production promotion unanswered
rolls staging back, with the trigger ``expired``."""

from __future__ import annotations

from datetime import timedelta

import pytest

from reconciliation import selectors
from reconciliation.services.expiry import effects_expire_awaiting_approval
from tests.sagas.conftest import op_types, release_inputs, saga, step_effect, steps

pytestmark = pytest.mark.django_db

PROMOTE, VERIFY, ROLLBACK = (
    "deployment.release.promote",
    "deployment.release.verify",
    "deployment.release.rollback",
)


def test_a_step_unapproved_by_its_deadline_expires_and_the_run_compensates(
    start, settle, agent, sandbox
):
    body = start("release.production", release_inputs())
    production = step_effect(body["saga_id"], "promote_production")
    assert production.status == "AWAITING_APPROVAL"
    deadline = production.command.expires_at
    # The step's deadline is the waker's next due time for it.
    assert selectors.effects_next_due().expiry == deadline
    assert settle(effects_expire_awaiting_approval, now=deadline - timedelta(seconds=1)) == 0
    assert saga(agent, body["saga_id"])["state"] == "RUNNING"

    assert settle(effects_expire_awaiting_approval, now=deadline) == 1
    body = saga(agent, body["saga_id"])
    assert steps(body)["promote_production"]["effect_status"] == "EXPIRED"
    assert body["failure"]["trigger"] == "expired"
    assert body["state"] == "COMPENSATED"
    assert op_types(sandbox) == [PROMOTE, VERIFY, ROLLBACK]
