"""A resubmission of a key this web process has seen is read with one SELECT instead of the
submission statement (gateway.fastpath.KnownKeys): the same answer, byte for byte, and a
wrong memo costs a query, never a wrong answer."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from gateway import fastpath, services
from gateway.fastpath import KnownKeys
from gateway.models import Command, Effect, EffectEvent, Principal
from tests.conftest import TICKET

pytestmark = [pytest.mark.django_db(transaction=True)]

OTHER_TITLE = {**TICKET, "payload": {**TICKET["payload"], "title": "another ticket"}}


def _tenant_id(name: str = "refund-bot") -> int:
    return Principal.objects.get(name=name).tenant_id


def _rows() -> tuple[int, int, int]:
    return Command.objects.count(), Effect.objects.count(), EffectEvent.objects.count()


def test_a_known_key_answers_what_the_statement_answers(agent, sandbox):
    effect_id = agent.submit(TICKET, "memo-same").json()["effect_id"]
    assert services.effect_dispatch(effect_id=effect_id, worker="test")  # with a receipt
    assert (_tenant_id(), "memo-same") in fastpath.known_keys

    through_memo = agent.submit(TICKET, "memo-same")
    fastpath.known_keys.clear()
    through_statement = agent.submit(TICKET, "memo-same")

    assert through_memo.status_code == through_statement.status_code == 200
    assert through_memo["Idempotent-Replayed"] == through_statement["Idempotent-Replayed"] == "true"
    assert through_memo.content == through_statement.content
    assert through_memo.json()["receipt"]["provider_status"] == "succeeded"
    assert (_tenant_id(), "memo-same") in fastpath.known_keys  # the statement remembers it too


def test_a_known_key_is_one_select_and_no_insert(agent, settings):
    settings.GATEWAY_TOKEN_CACHE_TTL = 5  # steady state: the token is in this process's cache
    agent.submit(TICKET, "memo-select")
    before = _rows()
    with CaptureQueriesContext(connection) as statements:
        assert agent.submit(TICKET, "memo-select").status_code == 200
    sql = [query["sql"] for query in statements.captured_queries]
    assert len(sql) == 1, sql
    assert "INSERT" not in sql[0].upper()
    assert _rows() == before


def test_a_remembered_key_that_is_not_in_the_ledger_is_submitted(agent):
    # As after a submission whose transaction was rolled back: the memo says "known", the
    # ledger has nothing; the SELECT finds nothing and the statement writes the command.
    fastpath.known_keys.add((_tenant_id(), "memo-gone"))
    response = agent.submit(TICKET, "memo-gone")
    assert response.status_code == 201, response.content
    assert Command.objects.filter(idempotency_key="memo-gone").count() == 1
    assert Effect.objects.get(pk=response.json()["effect_id"]).status == "PREPARED"


def test_a_known_key_with_another_payload_is_refused_and_writes_nothing(agent):
    first = agent.submit(TICKET, "memo-conflict").json()
    before = _rows()
    response = agent.submit(OTHER_TITLE, "memo-conflict")
    assert response.status_code == 422
    assert response["Content-Type"].startswith("application/problem+json")
    problem = response.json()
    assert problem["effect_id"] == first["effect_id"]
    assert problem["payload_digest"] == first["payload_digest"]
    assert _rows() == before


def test_a_key_is_known_per_tenant(agent, rival_agent):
    assert agent.submit(TICKET, "memo-tenant").status_code == 201
    answer = rival_agent.submit(TICKET, "memo-tenant")
    assert answer.status_code == 201  # another tenant's key names nothing of this one
    assert Command.objects.filter(idempotency_key="memo-tenant").count() == 2


def test_the_memo_keeps_the_newest_keys_up_to_its_size():
    memo = KnownKeys(3)
    for index in range(5):
        memo.add((1, f"k{index}"))
    assert [(1, "k0") in memo, (1, "k1") in memo] == [False, False]
    assert all((1, f"k{index}") in memo for index in (2, 3, 4))
    memo.add((1, "k2"))  # seen again: the newest now
    memo.add((1, "k5"))
    assert (1, "k2") in memo and (1, "k3") not in memo
    assert (2, "k5") not in memo  # another tenant
    off = KnownKeys(0)
    off.add((1, "k"))
    assert (1, "k") not in off
