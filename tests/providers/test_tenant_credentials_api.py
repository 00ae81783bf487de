"""A tenant's own provider credentials through the API and the console: admins set, rotate and
retire them; operators see them; answers, events and logs carry the fingerprint and the last
4 characters, never the secret; another tenant sees none of it; errors are problem+json."""

from __future__ import annotations

import logging

import pytest

from gateway import provider_credentials as credentials
from gateway.lib.vault import SealBroken
from gateway.models import EffectEvent, ProviderCredential
from gateway.providers.config import fingerprint
from tests.conftest import Persona
from tests.console.conftest import person

pytestmark = pytest.mark.django_db

SECRET = "sk_test_acme_own_account_0123456789WXYZ"
ROTATED = "sk_test_acme_rotated_account_98765QRST"
URL = "/api/v1/providers/billing/credentials"


def set_credential(admin: Persona, secret: str = SECRET, provider: str = "billing"):
    return admin.client.post(
        f"/api/v1/providers/{provider}/credentials", {"secret": secret}, format="json"
    )


def test_an_admin_sets_a_credential_shown_only_by_fingerprint_and_last4(admin):
    answer = set_credential(admin)
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert body["fingerprint"] == fingerprint(SECRET) and body["last4"] == "WXYZ"
    assert body["state"] == "active" and body["created_by"] == "admin:root"
    assert SECRET not in answer.content.decode()
    listed = admin.client.get(URL)
    assert listed.status_code == 200
    assert listed.json()["sends_with"] == "tenant"
    assert [row["fingerprint"] for row in listed.json()["results"]] == [fingerprint(SECRET)]
    assert SECRET not in listed.content.decode()
    row = ProviderCredential.objects.get()
    assert SECRET not in row.secret_sealed
    assert credentials.open_credential(row).secret == SECRET
    [event] = EffectEvent.objects.filter(kind="provider_credential_set")
    assert event.tenant_id == admin.principal.tenant_id and event.subject == "provider:billing"
    assert event.data == {"fingerprint": fingerprint(SECRET), "last4": "WXYZ"}
    assert SECRET not in repr(event.__dict__)


def test_rotation_keeps_the_old_credential_for_what_it_sent(admin):
    set_credential(admin)
    rotated = admin.client.post(f"{URL}/rotate", {"secret": ROTATED}, format="json")
    assert rotated.status_code == 201, rotated.content
    assert rotated.json()["replaces"] == fingerprint(SECRET)
    states = dict(ProviderCredential.objects.values_list("fingerprint", "state"))
    assert states == {fingerprint(SECRET): "rotated", fingerprint(ROTATED): "active"}
    old = ProviderCredential.objects.get(fingerprint=fingerprint(SECRET))
    assert old.rotated_at is not None
    [event] = EffectEvent.objects.filter(kind="provider_credential_rotated")
    assert event.data["replaces"] == fingerprint(SECRET)
    retired = admin.client.post(f"{URL}/{old.pk}/retire", {"reason": "leaked"}, format="json")
    assert retired.status_code == 200, retired.content
    assert retired.json()["state"] == "retired"
    assert EffectEvent.objects.filter(kind="provider_credential_retired").count() == 1


@pytest.mark.parametrize(
    "call, status, slug",
    [
        (lambda a: set_credential(a, provider="nowhere"), 404, "not-found"),
        (lambda a: set_credential(a, secret="short"), 400, "validation-error"),
        (lambda a: set_credential(a, secret="has a space inside 0123"), 400, "validation-error"),
        (lambda a: a.client.post(f"{URL}/rotate", {"secret": SECRET}, format="json"), 409, None),
        (lambda a: a.client.post(f"{URL}/99/retire", {}, format="json"), 404, "not-found"),
    ],
    ids=["unknown-provider", "short", "spaces", "rotate-nothing", "retire-nothing"],
)
def test_refusals_are_problems_that_change_nothing(admin, call, status, slug):
    answer = call(admin)
    assert answer.status_code == status, answer.content
    assert answer["Content-Type"] == "application/problem+json"
    if slug:
        assert answer.json()["type"].endswith(slug)
    assert not ProviderCredential.objects.exists()
    assert not EffectEvent.objects.filter(kind__startswith="provider_credential").exists()
    assert "short" not in answer.json()["detail"] and "space inside" not in answer.json()["detail"]


def test_a_second_set_is_a_conflict(admin):
    set_credential(admin)
    again = set_credential(admin, ROTATED)
    assert again.status_code == 409 and again.json()["type"].endswith("credential-conflict")
    assert ProviderCredential.objects.count() == 1


def test_only_admins_change_operators_read_agents_see_nothing(admin, operator, agent):
    assert set_credential(operator).status_code == 403
    assert set_credential(agent).status_code == 403
    set_credential(admin)
    assert operator.client.get(URL).status_code == 200
    assert agent.client.get(URL).status_code == 403
    row = ProviderCredential.objects.get()
    refused = operator.client.post(f"{URL}/{row.pk}/retire", {"reason": "x"}, format="json")
    assert refused.status_code == 403
    assert ProviderCredential.objects.get().state == "active"


def test_another_tenant_sees_and_touches_nothing(admin):
    set_credential(admin)
    row = ProviderCredential.objects.get()
    rival = Persona("globex", "gadmin", "admin")
    listed = rival.client.get(URL)
    assert listed.status_code == 200 and listed.json()["results"] == []
    assert listed.json()["sends_with"] == "deployment"
    retire = rival.client.post(f"{URL}/{row.pk}/retire", {"reason": "x"}, format="json")
    assert retire.status_code == 404
    assert ProviderCredential.objects.get().state == "active"


def test_a_sealed_secret_copied_into_another_tenants_row_does_not_open(admin):
    set_credential(admin)
    rival = Persona("globex", "gadmin", "admin")
    set_credential(rival, "sk_test_globex_own_account_0123456789ABCD")
    acme = ProviderCredential.objects.get(tenant=admin.principal.tenant)
    globex = ProviderCredential.objects.get(tenant=rival.principal.tenant)
    globex.secret_sealed = acme.secret_sealed
    with pytest.raises(SealBroken):
        credentials.open_credential(globex)


def test_the_secret_is_in_no_log_record_of_set_rotate_and_retire(admin, caplog):
    caplog.set_level(logging.DEBUG)
    set_credential(admin)
    admin.client.post(f"{URL}/rotate", {"secret": ROTATED}, format="json")
    old = ProviderCredential.objects.get(state="rotated")
    admin.client.post(f"{URL}/{old.pk}/retire", {"reason": "done"}, format="json")
    set_credential(admin, "bad secret with spaces 0123")  # a refusal logs too
    assert caplog.records, "nothing was logged: the check below would prove nothing"
    for record in caplog.records:
        text = record.getMessage() + repr(record.__dict__)
        assert SECRET not in text and ROTATED not in text and "with spaces" not in text


def test_the_console_page_sets_rotates_and_retires_for_admins(db):
    root = person("acme", "root", "admin")
    page = root.client.get("/providers/billing/credentials")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="credentials-billing"' in html and "Set a credential" in html
    made = root.client.post("/providers/billing/credentials/set", {"secret": SECRET})
    assert made.status_code == 302
    html = root.client.get("/providers/billing/credentials").content.decode()
    assert fingerprint(SECRET) in html and "…WXYZ" in html and SECRET not in html
    unconfirmed = root.client.post(
        "/providers/billing/credentials/rotate",
        {"secret": ROTATED},
        HTTP_HX_REQUEST="true",
    )
    assert unconfirmed.status_code == 400 and "confirm" in unconfirmed.content.decode()
    assert ProviderCredential.objects.count() == 1
    rotated = root.client.post(
        "/providers/billing/credentials/rotate",
        {"secret": ROTATED, "confirm": "on"},
        HTTP_HX_REQUEST="true",
    )
    assert rotated.status_code == 200
    fragment = rotated.content.decode()
    assert 'id="credentials-billing"' in fragment and "<html" not in fragment
    assert fingerprint(ROTATED) in fragment and ROTATED not in fragment and SECRET not in fragment
    old = ProviderCredential.objects.get(state="rotated")
    retired = root.client.post(
        f"/providers/billing/credentials/{old.pk}/retire", {"reason": "rotated out"}
    )
    assert retired.status_code == 302
    assert ProviderCredential.objects.get(pk=old.pk).state == "retired"
    html = root.client.get("/providers/billing/credentials").content.decode()
    assert f'data-credential="{old.pk}" data-state="retired"' in html
    assert "by admin:root" in html and "replaces " + fingerprint(SECRET) in html
    partial = root.client.get("/providers/billing/credentials", HTTP_HX_REQUEST="true")
    fragment = partial.content.decode()
    assert "<html" not in fragment and fragment.lstrip().startswith('<section id="credentials')


def test_the_console_shows_operators_no_forms_and_refuses_agents(db):
    root = person("acme", "root", "admin")
    root.client.post("/providers/billing/credentials/set", {"secret": SECRET})
    oscar = person("acme", "oscar", "operator")
    html = oscar.client.get("/providers/billing/credentials").content.decode()
    assert fingerprint(SECRET) in html and "Rotate…" not in html and "Retire…" not in html
    assert oscar.client.post(
        "/providers/billing/credentials/rotate", {"secret": ROTATED, "confirm": "on"}
    ).status_code in (302, 403)
    assert ProviderCredential.objects.get().state == "active"
    ada = person("acme", "ada", "approver")
    assert ada.client.get("/providers/billing/credentials").status_code == 403


def test_a_vault_key_rotation_reseals_the_credentials(admin, settings):
    from cryptography.fernet import Fernet
    from django.core.management import call_command

    from gateway.lib import vault

    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.GATEWAY_VAULT_KEY = old
    vault._fernet.cache_clear()
    try:
        set_credential(admin)
        before = ProviderCredential.objects.get().secret_sealed
        settings.GATEWAY_VAULT_KEY = f"{new},{old}"
        vault._fernet.cache_clear()
        call_command("rotate_vault_key", stdout=open("/dev/null", "w"))  # noqa: SIM115
        settings.GATEWAY_VAULT_KEY = new  # the old key is gone
        vault._fernet.cache_clear()
        row = ProviderCredential.objects.get()
        assert row.secret_sealed != before
        assert credentials.open_credential(row).secret == SECRET
    finally:
        vault._fernet.cache_clear()
