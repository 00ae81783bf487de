"""A provider's answer that the ledger cannot store as it came: ``\\u0000`` (PostgreSQL's text
and jsonb refuse it), NaN (no JSON, no jsonb), a lone surrogate (no UTF-8), an integer past
2^53 (no RFC 8785 digest). None of them may stop the ledger: the effect is recorded with what
can be said of it, and the other effects of the same drain are recorded as usual.

The provider here is a small server of the test's own that speaks SPEC §6 and answers every
request with the body the test gives it; its request log is the oracle for "sent once".
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

import pytest
from django.utils import timezone

from gateway import dispatcher, services
from gateway.choices import EffectStatus
from gateway.models import Attempt, Effect, EffectEvent, Receipt
from tests.conftest import TICKET

pytestmark = pytest.mark.django_db


class _Provider(BaseHTTPRequestHandler):
    """POST /operations and the lookup by key. A key that ends in ``poisoned`` is answered
    with ``status`` and ``body`` (``{digest}`` replaced by the request's payload digest),
    any other with a plain success; the sandbox answers the other providers' calls."""

    protocol_version = "HTTP/1.1"
    status = 201
    body = b""
    posts: list[str] = []
    digests: dict[str, str] = {}

    def _answer(self, key: str) -> None:
        status, body = (self.status, self.body) if key.endswith("poisoned") else (201, GOOD)
        if self.command == "GET":
            status = 200
        content = body.replace(b"{digest}", self.digests.get(key, "").encode())
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        key = self.headers["Idempotency-Key"]
        self.posts.append(key)
        self.digests[key] = request["payload_digest"]
        self._answer(key)

    def do_GET(self):
        key = unquote(self.path.partition("idempotency_key=")[2])
        self._answer(key)

    def log_message(self, *args):
        pass


@pytest.fixture
def provider(sandbox, sandbox_server, settings):
    _Provider.posts, _Provider.digests, _Provider.status = [], {}, 201
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Provider)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    settings.GATEWAY_PROVIDER_URLS = {
        **settings.GATEWAY_PROVIDER_URLS,
        "tickets": f"http://127.0.0.1:{server.server_port}",
    }
    yield _Provider
    server.shutdown()
    server.server_close()


def _operation(result: bytes, op_id: bytes = b"op_1") -> bytes:
    return b'{"id": "%s", "status": "succeeded", "payload_digest": "{digest}", "result": %s}' % (
        op_id,
        result,
    )


GOOD = _operation(b'{"ticket_id": "tk_1"}')
UNSTORABLE = {
    "NUL in a result string": _operation(b'{"note": "a\\u0000b"}'),
    "NUL in the operation id": _operation(b"{}", op_id=b"op\\u0000"),
    "NaN in the result": _operation(b'{"ratio": NaN}'),
    "a lone surrogate": _operation(b'{"note": "\\ud800"}'),
    "an integer past 2^53": _operation(b'{"amount": 9007199254740993}'),
    "a raw NUL byte": _operation(b'{"note": "a\x00b"}'),
}


def _submit(agent, key: str) -> str:
    response = agent.submit({**TICKET, "payload": {"title": key, "priority": "P3"}}, key)
    assert response.status_code == 201, response.json()
    return response.json()["effect_id"]


@pytest.mark.parametrize("answer", list(UNSTORABLE.values()), ids=list(UNSTORABLE))
def test_an_answer_the_ledger_cannot_store_leaves_the_effect_unknown(provider, agent, answer):
    provider.body = answer
    effect_id = _submit(agent, "k1-poisoned")
    services.effect_dispatch(effect_id=effect_id, worker="test")
    effect = Effect.objects.select_related("command").get(pk=effect_id)
    # It was sent and may have been done: not confirmed on an answer that cannot be kept,
    # and not sent again before the reconciler has asked.
    assert effect.status == EffectStatus.UNKNOWN
    assert provider.posts == [effect.command.provider_key]
    attempt = Attempt.objects.get(effect_id=effect_id)
    assert attempt.outcome == "unknown" and "\x00" not in attempt.error
    assert not Receipt.objects.filter(effect_id=effect_id).exists()
    event = EffectEvent.objects.get(effect_id=effect_id, to_status="UNKNOWN")
    assert "not an operation" in event.reason


@pytest.mark.parametrize(
    ("body", "kept"),
    [
        (b'{"error": "no\\u0000pe"}', '{"error": "no\\u0000pe"}'),  # the text, as it came
        (b'{"error": "no\x00pe"}', '{"error": "no\ufffdpe"}'),  # not JSON: NUL replaced
    ],
)
def test_a_rejection_whose_error_holds_nul_is_recorded_without_it(provider, agent, body, kept):
    provider.status, provider.body = 400, body
    effect_id = _submit(agent, "k1-poisoned")
    services.effect_dispatch(effect_id=effect_id, worker="test")
    assert Effect.objects.get(pk=effect_id).status == EffectStatus.REJECTED
    assert Attempt.objects.get(effect_id=effect_id).error == kept


@pytest.mark.parametrize("answer", list(UNSTORABLE.values()), ids=list(UNSTORABLE))
def test_one_unstorable_answer_does_not_hold_up_the_drain_it_is_in(provider, agent, answer):
    """The drainer records a batch in one statement: one bad row must not fail the others."""
    provider.body = answer
    healthy = [_submit(agent, f"k{n}-healthy") for n in range(3)]
    poisoned = _submit(agent, "k9-poisoned")
    assert dispatcher.drain(flag=None, worker="test") == 4
    assert sorted(provider.posts) == sorted(
        Effect.objects.filter(pk__in=[poisoned, *healthy]).values_list(
            "command__provider_key", flat=True
        )
    )
    statuses = dict(Effect.objects.filter(pk__in=[poisoned, *healthy]).values_list("pk", "status"))
    assert statuses == {poisoned: "UNKNOWN", **dict.fromkeys(healthy, "CONFIRMED")}


def test_the_reconciler_asks_again_later_and_sends_nothing(provider, agent):
    """The lookup by key gets the same answer: the provider counts as unreachable for it (the
    check is pushed back), the effect stays UNKNOWN, and nothing is sent a second time."""
    from reconciliation import services as reconciliation

    provider.body = UNSTORABLE["NUL in a result string"]
    effect_id = _submit(agent, "k1-poisoned")
    services.effect_dispatch(effect_id=effect_id, worker="test")
    asked_at = timezone.now()
    reconciliation.effect_reconcile(effect_id=effect_id)
    effect = Effect.objects.get(pk=effect_id)
    assert effect.status == EffectStatus.UNKNOWN and effect.check_count >= 1
    # Asked again later, not due now (the backoff's jitter may land before the check time
    # the dispatch had set, so "later than that" is not the promise).
    assert effect.next_check_at > asked_at
    assert len(provider.posts) == 1
