"""The reconciliation API: reconcile and resolve (operators only, tenant-isolated, problem+json
errors) and the human queue."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from gateway.models import EffectEvent, Receipt
from reconciliation import services
from reconciliation.choices import CaseReason, CaseState, RecordKind, RecordOutcome
from reconciliation.models import Case, ReconciliationRecord
from tests.reconciliation.conftest import fresh, operations, sends

pytestmark = pytest.mark.django_db

PROBLEM = "application/problem+json"


def resolve(persona, effect, **body):
    return persona.client.post(f"/api/v1/effects/{effect.pk}/resolve", body, format="json")


def reconcile(persona, effect):
    return persona.client.post(f"/api/v1/effects/{effect.pk}/reconcile", format="json")


@pytest.fixture
def escalated(recon_unknown, recon_sandbox):
    """An UNKNOWN effect the reconciler gave up on (the provider cannot be reached), with
    its open case."""
    effect = recon_unknown()
    recon_sandbox.add_fault("lookup_unreachable", times=None)
    for _ in range(8):  # the contract's reconcile_budget
        services.effect_reconcile(effect_id=effect.pk)
    recon_sandbox.clear_faults()
    effect = fresh(effect)
    assert effect.escalated and Case.objects.filter(effect=effect, state="open").exists()
    return effect


# --- reconcile ----------------------------------------------------------------------------


def test_operator_reconcile_asks_now_and_returns_the_effect(
    recon_unknown, recon_operator, recon_sandbox
):
    effect = recon_unknown()

    response = reconcile(recon_operator, effect)

    assert response.status_code == 200, response.content
    assert response.json()["status"] == "CONFIRMED"
    assert response.json()["effect_id"] == effect.pk
    assert response.json()["receipt"]["source"] == Receipt.Source.RECONCILER
    record = ReconciliationRecord.objects.get(effect=effect)
    assert record.principal == recon_operator.principal
    assert record.actor == recon_operator.principal.label
    assert len(operations(recon_sandbox, effect)) == 1


def test_agent_may_not_reconcile(recon_unknown, recon_agent, recon_sandbox):
    effect = recon_unknown()

    response = reconcile(recon_agent, effect)

    assert response.status_code == 403
    assert response["Content-Type"] == PROBLEM
    assert fresh(effect).status == "UNKNOWN"
    assert not ReconciliationRecord.objects.exists()


def test_reconcile_of_another_tenants_effect_is_404(
    recon_unknown, recon_rival_operator, recon_sandbox
):
    effect = recon_unknown()

    response = reconcile(recon_rival_operator, effect)

    assert response.status_code == 404
    assert response["Content-Type"] == PROBLEM
    assert fresh(effect).status == "UNKNOWN"


def test_reconcile_of_a_settled_effect_is_409(recon_unknown, recon_operator, recon_sandbox):
    effect = recon_unknown()
    assert reconcile(recon_operator, effect).status_code == 200

    response = reconcile(recon_operator, effect)

    assert response.status_code == 409
    assert response.json()["type"].endswith("invalid-transition")


# --- resolve ------------------------------------------------------------------------------


def test_operator_resolves_confirmed_with_evidence(escalated, recon_operator, recon_sandbox):
    events_before = list(
        EffectEvent.objects.filter(effect=escalated)
        .order_by("id")
        .values_list("id", "kind", "reason", "data")
    )

    response = resolve(
        recon_operator, escalated, outcome="confirmed", evidence="seen in the provider console"
    )

    assert response.status_code == 200, response.content
    assert response.json()["status"] == "CONFIRMED"
    assert response.json()["escalated"] is False
    effect = fresh(escalated)
    assert effect.confirmed_at is not None
    record = ReconciliationRecord.objects.filter(effect=effect).latest("id")
    assert (record.kind, record.outcome) == (RecordKind.MANUAL, RecordOutcome.CONFIRMED)
    assert record.evidence == "seen in the provider console"
    assert record.principal == recon_operator.principal
    assert record.effect_status == "UNKNOWN"
    case = Case.objects.get(effect=effect)
    assert case.state == CaseState.RESOLVED
    assert case.resolved_by == recon_operator.principal
    assert "seen in the provider console" in case.resolution
    # History is appended to, never edited.
    after = list(
        EffectEvent.objects.filter(effect=effect)
        .order_by("id")
        .values_list("id", "kind", "reason", "data")
    )
    assert after[: len(events_before)] == events_before
    assert EffectEvent.objects.filter(effect=effect, kind="resolved").count() == 1
    # A manual resolution is not a provider receipt.
    assert not Receipt.objects.filter(effect=effect, source=Receipt.Source.RECONCILER).exists()


def test_resolve_not_started_redispatches_with_the_same_key(
    escalated, recon_operator, recon_sandbox, recon_enqueued, recon_dispatch
):
    # The operator is wrong: the provider did commit. The same key makes that harmless.
    recon_enqueued.clear()

    response = resolve(recon_operator, escalated, outcome="not_started", evidence="ticket 4711")

    assert response.status_code == 200, response.content
    assert response.json()["status"] == "NOT_STARTED"
    assert recon_enqueued == [escalated.pk]
    effect = recon_dispatch(escalated)
    assert effect.status == "CONFIRMED"
    assert len(operations(recon_sandbox, effect)) == 1
    assert [entry["action"] for entry in sends(recon_sandbox, effect)] == ["commit", "replay"]


def test_agent_may_not_resolve(escalated, recon_agent):
    response = resolve(recon_agent, escalated, outcome="confirmed", evidence="trust me")

    assert response.status_code == 403
    assert response["Content-Type"] == PROBLEM
    assert fresh(escalated).status == "UNKNOWN"
    assert not ReconciliationRecord.objects.filter(kind=RecordKind.MANUAL).exists()


@pytest.mark.parametrize(
    "body, field",
    [
        ({"outcome": "done", "evidence": "x"}, "outcome"),
        ({"outcome": "confirmed"}, "evidence"),
        ({"outcome": "confirmed", "evidence": ""}, "evidence"),
        ({"evidence": "x"}, "outcome"),
    ],
)
def test_bad_resolution_is_400(escalated, recon_operator, body, field):
    response = resolve(recon_operator, escalated, **body)

    assert response.status_code == 400
    assert response["Content-Type"] == PROBLEM
    assert field in response.json()["errors"]
    assert fresh(escalated).status == "UNKNOWN"


def test_blank_evidence_is_refused_by_the_service_too(escalated, recon_operator):
    with pytest.raises(services.ValidationProblem):
        services.effect_resolve(
            effect=escalated,
            principal=recon_operator.principal,
            outcome="confirmed",
            evidence="   ",
        )


def test_resolve_of_another_tenants_effect_is_404(escalated, recon_rival_operator):
    response = resolve(recon_rival_operator, escalated, outcome="confirmed", evidence="x")

    assert response.status_code == 404
    assert fresh(escalated).status == "UNKNOWN"


def test_resolve_of_a_confirmed_effect_is_409(recon_unknown, recon_operator, recon_sandbox):
    effect = recon_unknown()
    services.effect_reconcile(effect_id=effect.pk)
    assert fresh(effect).status == "CONFIRMED"

    response = resolve(recon_operator, effect, outcome="not_started", evidence="x")

    assert response.status_code == 409
    assert fresh(effect).status == "CONFIRMED"
    assert not ReconciliationRecord.objects.filter(kind=RecordKind.MANUAL).exists()


def test_reconcile_records_are_listed_oldest_first(escalated, recon_operator):
    response = recon_operator.client.get(f"/api/v1/effects/{escalated.pk}/reconciliations")

    assert response.status_code == 200
    outcomes = [record["outcome"] for record in response.json()]
    assert outcomes == ["inconclusive"] * 7 + ["escalated"]


# --- the human queue ----------------------------------------------------------------------


def test_cases_are_listed_for_the_tenant_oldest_first_with_filters(
    escalated, recon_operator, recon_rival_operator
):
    response = recon_operator.client.get("/api/v1/cases?state=open&owner=support-tools")

    assert response.status_code == 200
    [case] = response.json()["results"]
    assert case["effect_id"] == escalated.pk
    assert case["reason"] == CaseReason.LOOKUP_BUDGET_EXHAUSTED
    assert case["owner"] == "support-tools"
    assert case["effect_status"] == "UNKNOWN"
    assert recon_operator.client.get("/api/v1/cases?owner=billing-oncall").json()["results"] == []
    assert recon_operator.client.get("/api/v1/cases?state=resolved").json()["results"] == []
    assert recon_rival_operator.client.get("/api/v1/cases").json()["results"] == []
    bad = recon_operator.client.get("/api/v1/cases?state=closed")
    assert bad.status_code == 400 and "state" in bad.json()["errors"]


def test_case_list_queries_do_not_grow_with_the_queue(recon_unknown, recon_operator, recon_sandbox):
    def count_queries() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert recon_operator.client.get("/api/v1/cases").status_code == 200
        return len(queries)

    first = recon_unknown()
    services.case_open(effect=first, reason="escalated", text="t", actor="test")
    count_queries()  # the first request also stamps the token's last use
    one = count_queries()
    for _ in range(4):
        effect = recon_unknown()
        services.case_open(effect=effect, reason="escalated", text="t", actor="test")

    assert count_queries() == one


def test_operator_acknowledges_a_case_once(escalated, recon_operator):
    case = Case.objects.get(effect=escalated)

    response = recon_operator.client.post(
        f"/api/v1/cases/{case.pk}/acknowledge", {"note": "looking"}, format="json"
    )

    assert response.status_code == 200, response.content
    assert response.json()["state"] == "acknowledged"
    assert response.json()["acknowledged_by"] == recon_operator.principal.name
    again = recon_operator.client.post(f"/api/v1/cases/{case.pk}/acknowledge", format="json")
    assert again.status_code == 409
    # Acknowledged is still unresolved: the queue shows it by default.
    listed = recon_operator.client.get("/api/v1/cases").json()["results"]
    assert [c["id"] for c in listed] == [case.pk]


def test_agent_may_not_acknowledge_and_rivals_see_no_case(
    escalated, recon_agent, recon_rival_operator
):
    case = Case.objects.get(effect=escalated)

    assert recon_agent.client.post(f"/api/v1/cases/{case.pk}/acknowledge").status_code == 403
    rival = recon_rival_operator.client.post(f"/api/v1/cases/{case.pk}/acknowledge")
    assert rival.status_code == 404
    assert recon_rival_operator.client.get(f"/api/v1/cases/{case.pk}").status_code == 404
    assert Case.objects.get(pk=case.pk).state == CaseState.OPEN


def test_at_most_one_unresolved_case_per_effect(escalated):
    case = Case.objects.get(effect=escalated)

    again = services.case_open(effect=escalated, reason="mismatch", text="again", actor="test")

    assert again.pk == case.pk
    assert Case.objects.filter(effect=escalated).count() == 1
