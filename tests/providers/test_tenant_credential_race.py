"""A retirement racing a claim, with real threads on PostgreSQL: the claim holds the tenant's
credential FOR SHARE from choosing it until its attempt (marked with the fingerprint) commits,
so the retirement waits for it and then counts that attempt as unsettled: it is refused, and
the claimed effect is never sent with a credential retired under it."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from gateway import provider_credentials as credentials
from gateway import services
from gateway.errors import CredentialConflict
from gateway.models import Attempt, ProviderCredential
from gateway.providers.config import fingerprint
from tests.conftest import Persona

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "acme-own-tickets-token-012345-RACE"


def waiting_on_credential_lock() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database() AND query LIKE '%%gateway_providercredential%%'"
        )
        return int(cursor.fetchone()[0])


def test_a_retirement_waits_for_the_claim_holding_the_credential_and_is_refused(
    settings, sandbox, agent, ticket_body, monkeypatch
):
    settings.GATEWAY_FAST_PATH = False
    admin = Persona("acme", "acme-admin", "admin")
    row = credentials.credential_set(actor=admin.principal, provider="tickets", secret=SECRET)
    effect_id = agent.submit(ticket_body, "race-1").json()["effect_id"]

    held, go = threading.Event(), threading.Event()
    chosen = services.claim_sender

    def pausing(effect, number):  # the claim's transaction is open and holds the credential
        answer = chosen(effect, number)
        held.set()
        go.wait(10)
        return answer

    monkeypatch.setattr(services, "claim_sender", pausing)
    outcome: dict[str, object] = {}

    def claim() -> None:
        try:
            outcome["claim"] = services.effect_claim(effect_id=effect_id, worker="test")
        finally:
            connection.close()

    def retire() -> None:
        try:
            credentials.credential_retire(
                actor=admin.principal, provider="tickets", credential_id=row.pk
            )
            outcome["retired"] = True
        except CredentialConflict as exc:
            outcome["refused"] = exc
        finally:
            connection.close()

    claiming = threading.Thread(target=claim)
    claiming.start()
    retiring = threading.Thread(target=retire)
    try:
        assert held.wait(10)
        retiring.start()
        waiting = 0
        for _ in range(250):  # until the retirement waits on the credential's row
            waiting = waiting_on_credential_lock()
            if waiting:
                break
            time.sleep(0.02)
        assert waiting == 1
    finally:
        go.set()
        claiming.join(10)
        if retiring.ident is not None:
            retiring.join(10)
    assert "retired" not in outcome, "retired while a claim held it"
    refused = outcome["refused"]
    assert isinstance(refused, CredentialConflict) and refused.extra["unsettled"] == 1
    assert ProviderCredential.objects.get(pk=row.pk).state == "active"
    claimed = outcome["claim"]
    assert claimed is not None and claimed.send_as.credential is not None
    assert claimed.send_as.credential.fingerprint == fingerprint(SECRET)
    attempt = Attempt.objects.get(effect_id=effect_id)
    assert attempt.credential_fingerprint == fingerprint(SECRET)
