"""Correlation: the command's context (runtime, agent, session, run, thread, call) on the
effect page, each value linking to the triage queue filtered by it; the triage filters and
rows that say which runtime and agent an effect came from."""

import re
from urllib.parse import unquote

import pytest

from gateway import selectors
from gateway.console.selectors import CORRELATION_KEYS
from tests.console.conftest import REFUND, TICKET, set_state, submit

CLAUDE = {
    "runtime": "claude-code",
    "agent": "refund-bot",
    "session_id": "sess-42",
    "run_id": "run-7",
    "thread_id": "thr-1",
    "call_id": "call-9",
    "tool": "refund",  # not a correlation id: shown as plain context
}


def effect_ids(html: str) -> list[str]:
    return re.findall(r'<tr data-effect="([^"]+)"', html)


@pytest.fixture
def runs(bot):
    agent = bot.principal
    return {
        "claude": set_state(submit(agent, REFUND, context=CLAUDE), status="UNKNOWN"),
        "same_run": set_state(
            submit(agent, TICKET, context={**CLAUDE, "call_id": "call-10"}), status="UNKNOWN"
        ),
        "langgraph": set_state(
            submit(agent, TICKET, context={"runtime": "langgraph", "run_id": "run-8"}),
            status="UNKNOWN",
        ),
        "bare": set_state(submit(agent, TICKET), status="UNKNOWN"),
    }


def test_the_console_filters_on_the_apis_context_keys():
    assert set(CORRELATION_KEYS) == set(selectors.CONTEXT_FILTERS)


def test_effect_page_lists_correlation_ids_linking_to_triage(oscar, runs):
    html = oscar.client.get(f"/effects/{runs['claude'].pk}").content.decode()
    section = html[html.index('id="correlation-heading"') :]
    section = section[: section.index("</dl>")]
    links = re.findall(
        r'<dt class="mono">([a-z_]+)</dt>\s*<dd class="mono"><a href="([^"]+)"', section
    )
    assert [key for key, _ in links] == list(CORRELATION_KEYS)
    hrefs = dict(links)
    assert unquote(hrefs["run_id"].replace("&amp;", "&")) == "/?context.run_id=run-7"
    assert unquote(hrefs["runtime"]) == "/?context.runtime=claude-code"
    assert "tool=refund" in html  # the rest of the context, as it was
    bare = oscar.client.get(f"/effects/{runs['bare'].pk}").content.decode()
    assert "correlation-heading" not in bare


def test_triage_filters_by_context_keys(oscar, runs):
    def shown(query: str) -> set[str]:
        return set(effect_ids(oscar.client.get("/?" + query).content.decode()))

    assert shown("context.run_id=run-7") == {runs["claude"].pk, runs["same_run"].pk}
    assert shown("context.call_id=call-10") == {runs["same_run"].pk}
    assert shown("context.runtime=langgraph") == {runs["langgraph"].pk}
    assert shown("context.run_id=run-7&context.runtime=langgraph") == set()
    assert shown("context.run_id=run-7&status=UNKNOWN&type=ticket.create") == {runs["same_run"].pk}
    # Keys that are not correlation ids are ignored, as the API ignores them.
    assert len(shown("context.tool=refund")) == 4


def test_a_context_filter_is_kept_by_the_form_the_poll_and_the_pages(oscar, runs):
    html = oscar.client.get("/?context.run_id=run-7").content.decode()
    assert '<input type="hidden" name="context.run_id" value="run-7">' in html
    poll = re.search(r'<section id="queue"[^>]*hx-get="([^"]+)"', html).group(1)
    assert "context.run_id=run-7" in poll
    assert "(filtered)" in html
    chip = html[html.index('class="context-filters"') :]
    chip = chip[: chip.index("</p>")]
    assert "run_id = run-7" in chip and 'href="/"' in chip  # remove it: back to everything
    two = oscar.client.get("/?context.run_id=run-7&context.runtime=claude-code").content.decode()
    assert 'href="/?context.runtime=claude-code"' in two
    assert 'href="/?context.run_id=run-7"' in two


def test_rows_show_runtime_and_agent(oscar, runs):
    html = oscar.client.get("/").content.decode()

    def row(effect) -> str:
        found = html[html.index(f'data-effect="{effect.pk}"') :]
        return found[: found.index("</tr>")]

    assert "claude-code · refund-bot" in row(runs["claude"])
    assert ">langgraph<" in row(runs["langgraph"])
    assert 'class="small muted correlation"' not in row(runs["bare"])
