"""The approvals inbox: what each waiting command will do in plain words, its redacted
payload and digest, and approve-by-digest / reject in place."""

import re

from tests.console.conftest import BIG_REFUND, EMAIL, REFUND, set_state, submit


def cards(html: str) -> list[str]:
    return re.findall(r'<article id="approval-([^"]+)"', html)


def test_inbox_lists_the_tenants_waiting_commands_only(alice, olga, bot):
    waiting = submit(bot.principal, BIG_REFUND)
    submit(bot.principal, REFUND)  # under the approval threshold: never waits
    page = alice.client.get("/approvals")
    assert page.status_code == 200
    assert cards(page.content.decode()) == [waiting.pk]
    assert "1 command waiting for an approver" in page.content.decode()
    assert cards(olga.client.get("/approvals").content.decode()) == []


def test_full_page_and_fragment(alice, bot):
    submit(bot.principal, BIG_REFUND)
    page = alice.client.get("/approvals")
    fragment = alice.htmx("get", "/approvals")
    assert "<html" in page.content.decode()
    body = fragment.content.decode()
    assert "<html" not in body and body.lstrip().startswith('<section id="inbox"')
    for response in (page, fragment):
        assert "HX-Request" in response["Vary"]


def test_a_card_says_what_will_happen_and_shows_the_digest(alice, bot):
    effect = submit(bot.principal, BIG_REFUND)
    html = alice.client.get("/approvals").content.decode()
    assert "Refund money to a customer against an order — on order ord_881" in html
    assert "250.00 EUR" in html
    assert "Refunds over 100.00 need an approver." in html
    assert "refund the duplicate charge of incident 120" in html
    assert f'<code class="digest" id="approval-{effect.pk}-digest">' in html
    assert effect.command.payload_digest in html
    assert '<label for="approval-' in html and "Digest you read" in html


def test_personal_fields_are_redacted_on_cards(alice, bot):
    email = dict(EMAIL, payload={**EMAIL["payload"]})
    effect = submit(bot.principal, email)
    set_state(effect, status="AWAITING_APPROVAL", approval_state="pending")
    html = alice.client.get("/approvals").content.decode()
    assert "ada@example.com" not in html
    assert "[redacted]" in html


def test_approve_from_the_inbox_answers_with_the_card(alice, bot):
    effect = submit(bot.principal, BIG_REFUND)
    response = alice.htmx(
        "post",
        f"/effects/{effect.pk}/approve",
        {"payload_digest": effect.command.payload_digest, "view": "approvals"},
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith(f'<article id="approval-{effect.pk}"')
    assert "Now PREPARED: approved by alice" in html
    assert '<span id="approvals-badge" class="count count-zero" hx-swap-oob="true">0' in html
    assert 'id="flash"' in html and "Approved" in html


def test_a_wrong_digest_from_the_inbox_lands_in_the_card(alice, bot):
    effect = submit(bot.principal, BIG_REFUND)
    response = alice.htmx(
        "post",
        f"/effects/{effect.pk}/approve",
        {"payload_digest": "sha256:" + "1" * 64, "view": "approvals"},
    )
    assert response.status_code == 409
    assert response["HX-Retarget"] == f"#approval-{effect.pk}-error"
    effect.refresh_from_db()
    assert effect.status == "AWAITING_APPROVAL"


def test_approve_without_javascript_returns_to_the_inbox(alice, bot):
    effect = submit(bot.principal, BIG_REFUND)
    response = alice.client.post(
        f"/effects/{effect.pk}/approve",
        {"payload_digest": effect.command.payload_digest, "view": "approvals"},
    )
    assert response.status_code == 302
    assert response["Location"] == "/approvals"
    page = alice.client.get("/approvals").content.decode()
    assert "Approved" in page and cards(page) == []


def test_who_may_decide(oscar, root, bot):
    effect = submit(root.principal, BIG_REFUND)
    mine = root.client.get("/approvals").content.decode()
    assert "You requested this command: another approver must approve it." in mine
    assert f'action="/effects/{effect.pk}/approve"' not in mine
    assert f'action="/effects/{effect.pk}/reject"' in mine
    operator = oscar.client.get("/approvals").content.decode()
    assert "can read this inbox but not decide" in operator
    assert f'action="/effects/{effect.pk}/' not in operator


def test_poll_answers_204_until_the_inbox_changes(alice, bot):
    submit(bot.principal, BIG_REFUND)
    html = alice.client.get("/approvals").content.decode()
    url = re.search(r'<section id="inbox"[^>]*hx-get="([^"]+)"', html).group(1)
    assert alice.htmx("get", url).status_code == 204
    submit(bot.principal, BIG_REFUND, resource={"type": "order", "id": "ord_2"})
    again = alice.htmx("get", url)
    assert again.status_code == 200
    assert len(cards(again.content.decode())) == 2
