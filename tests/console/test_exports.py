"""Exports of the console's lists (``/export/<list>.<csv|jsonl>``): the page's filters, its
tenant scope and role check; streamed from a server-side cursor; CSV that no spreadsheet runs
as a formula. Each export is parsed back and compared with what the ledger holds."""

from __future__ import annotations

import csv
import io
import json

import pytest
from django.db import connection

from gateway.lib.exports import safe_cell
from gateway.models import EffectEvent
from tests.console.conftest import REFUND, TICKET, add_notes, open_case, person, set_state, submit


def body(response) -> str:
    assert response.streaming, "an export is streamed"
    return b"".join(response.streaming_content).decode()


def parse_csv(response) -> list[dict[str, str]]:
    assert response["Content-Type"].startswith("text/csv")
    return list(csv.DictReader(io.StringIO(body(response))))


def parse_jsonl(response) -> list[dict]:
    assert response["Content-Type"].startswith("application/jsonl")
    return [json.loads(line) for line in body(response).splitlines()]


@pytest.fixture
def globex_bot(db):
    agent = person("globex", "globex-bot", "agent")
    from gateway.capabilities import capability_grant

    capability_grant(granted_by="test", principal=agent.principal, effect_types=["*"])
    return agent


@pytest.fixture
def incident(bot, globex_bot):
    """Three UNKNOWN refunds and one ticket of acme; two UNKNOWN refunds of globex."""
    ours = [set_state(submit(bot.principal, REFUND), status="UNKNOWN") for _ in range(3)]
    ours.append(set_state(submit(bot.principal, TICKET), status="UNKNOWN"))
    theirs = [set_state(submit(globex_bot.principal, REFUND), status="UNKNOWN") for _ in range(2)]
    return ours, theirs


def test_triage_export_parses_back_with_the_pages_filters(oscar, incident):
    ours, _ = incident
    rows = parse_csv(oscar.client.get("/export/triage.csv", {"type": "billing.refund.create"}))
    refunds = [e.pk for e in ours if e.type == "billing.refund.create"]
    assert [row["effect_id"] for row in rows] == sorted(refunds)
    assert {row["status"] for row in rows} == {"UNKNOWN"}
    assert {row["at_stake"] for row in rows} == {"5.00 EUR"}
    assert rows[0]["cause"] == "outcome unknown" and rows[0]["provider"] == "billing"
    lines = parse_jsonl(oscar.client.get("/export/triage.jsonl"))
    assert sorted(line["effect_id"] for line in lines) == sorted(e.pk for e in ours)
    assert lines[0]["attempts"] == 0 and lines[0]["mismatch"] is False


def test_another_tenants_rows_never_appear(oscar, olga, incident):
    ours, theirs = incident
    for name in ("triage", "triage-groups", "audit", "cases"):
        for fmt in ("csv", "jsonl"):
            text = body(oscar.client.get(f"/export/{name}.{fmt}"))
            for effect in theirs:
                assert effect.pk not in text, (name, fmt)
    text = body(olga.client.get("/export/triage.csv"))
    assert all(effect.pk not in text for effect in ours)
    assert all(effect.pk in text for effect in theirs)
    # A search for acme's id from globex finds nothing to export.
    assert parse_jsonl(olga.client.get("/export/search.jsonl", {"q": ours[0].pk})) == []


def test_search_export_lists_the_pages_hits(oscar, bot):
    first = submit(bot.principal, REFUND, resource={"type": "order", "id": "ord_exp"})
    second = submit(bot.principal, REFUND, resource={"type": "order", "id": "ord_exp"})
    lines = parse_jsonl(oscar.client.get("/export/search.jsonl", {"q": "ord_exp"}))
    assert [line["label"].split(" ")[0] for line in lines] == [second.pk, first.pk]
    assert {line["matched"] for line in lines} == {"resource id"}


def test_triage_groups_export(oscar, incident):
    rows = parse_csv(oscar.client.get("/export/triage-groups.csv"))
    counts = {row["type"]: int(row["count"]) for row in rows}
    assert counts == {"billing.refund.create": 3, "ticket.create": 1}


def test_cases_export_keeps_the_pages_filters(oscar, bot, globex_bot):
    escalated = set_state(submit(bot.principal, REFUND), status="UNKNOWN", escalated=True)
    open_case(escalated, reason="escalated")
    other = set_state(submit(bot.principal, TICKET), status="UNKNOWN")
    open_case(other, reason="lookup_budget_exhausted")
    theirs = set_state(submit(globex_bot.principal, REFUND), status="UNKNOWN")
    open_case(theirs)
    rows = parse_csv(oscar.client.get("/export/cases.csv", {"reason": "escalated"}))
    assert [row["effect_id"] for row in rows] == [escalated.pk]
    assert rows[0]["state"] == "open" and rows[0]["at_stake"] == "5.00 EUR"
    assert len(parse_jsonl(oscar.client.get("/export/cases.jsonl"))) == 2


def test_audit_export_has_the_role_check_of_its_page(oscar, bot, alice):
    effect = submit(bot.principal, REFUND)
    events = parse_jsonl(oscar.client.get("/export/audit.jsonl", {"effect": effect.pk}))
    stored = EffectEvent.objects.filter(effect_id=effect.pk).order_by("-pk")
    assert [e["event_id"] for e in events] == [e.pk for e in stored]
    assert events[0]["actor"] == stored[0].actor
    assert {e["effect_type"] for e in events} == {"billing.refund.create"}
    assert alice.client.get("/export/audit.csv").status_code == 200
    # An agent reads its own effects' events on their pages, not the tenant's list.
    refused = bot.client.get("/export/audit.csv")
    assert refused.status_code == 403 and not refused.streaming


def test_unknown_list_or_format_is_404(oscar):
    assert oscar.client.get("/export/effects.csv").status_code == 404
    assert oscar.client.get("/export/triage.xlsx").status_code == 404


def test_signed_out_export_goes_to_login(client, db):
    response = client.get("/export/triage.csv")
    assert response.status_code == 302 and "/login" in response["Location"]


@pytest.mark.parametrize(
    ("value", "cell"),
    [
        ('=HYPERLINK("http://evil")', '\'=HYPERLINK("http://evil")'),
        ("+1+1", "'+1+1"),
        ("-2+3", "'-2+3"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\tcmd", "'\tcmd"),
        ("plain", "plain"),
        (-5, -5),
        (None, ""),
        (True, "true"),
        ({"a": 1}, '{"a": 1}'),
    ],
)
def test_csv_cells_never_start_a_formula(value, cell):
    assert safe_cell(value) == cell


def test_a_formula_in_the_ledger_is_exported_quoted(oscar, bot):
    """A reason typed by someone (here, a freeze's) reaches the CSV as text, not a formula."""
    effect = submit(bot.principal, REFUND)
    from gateway import services

    services.effect_set_frozen(
        effect=effect, principal=oscar.principal, frozen=True, reason="=cmd|'/c calc'!A1"
    )
    rows = parse_csv(oscar.client.get("/export/audit.csv", {"action": "frozen"}))
    assert [row["reason"] for row in rows] == ["'=cmd|'/c calc'!A1"]
    lines = parse_jsonl(oscar.client.get("/export/audit.jsonl", {"action": "frozen"}))
    assert [line["reason"] for line in lines] == ["=cmd|'/c calc'!A1"]


def test_export_reads_from_a_server_side_cursor_in_chunks(oscar, bot):
    """The rows come from a named cursor that is open while the response is being written,
    and the body arrives in many chunks, not as one string built in memory."""
    effect = submit(bot.principal, REFUND)
    add_notes(effect, 2500, created_at=effect.created_at)
    response = oscar.client.get("/export/audit.csv", {"effect": effect.pk})
    chunks = iter(response.streaming_content)
    first = next(chunks)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_cursors WHERE name LIKE '_django_curs_%%'")
        (open_cursors,) = cursor.fetchone()
    assert open_cursors == 1
    rest = list(chunks)
    assert len(rest) >= 10
    rows = list(csv.DictReader(io.StringIO((first + b"".join(rest)).decode())))
    assert len(rows) == EffectEvent.objects.filter(effect_id=effect.pk).count()
    assert rows[0]["reason"] == "note 2499"
