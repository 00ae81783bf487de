"""Acme's effect type and adapter: a contract module (docs/guides/effect-types.md)."""

import http.client
import json
from urllib.parse import quote, urlsplit

from gateway.choices import EffectClass, Outcome
from gateway.contracts import ApprovalPolicy, EffectContract
from gateway.providers.base import CallResult, LookupResult, LookupStatus, ProviderOperation

CONTRACTS = [
    EffectContract(
        type="acme.ticket.create",
        version=1,
        provider="acme-tickets",
        effect_class=EffectClass.EXTERNAL_WRITE,
        description="Open a ticket in Acme Tickets.",
        resource_type="queue",
        payload_schema={
            "type": "object",
            "properties": {
                "summary": {"type": "string", "minLength": 1, "maxLength": 200},
                "severity": {"enum": ["low", "high", "critical"]},
            },
            "required": ["summary", "severity"],
        },
        example={
            "resource": {"type": "queue", "id": "ops"},
            "payload": {"summary": "Disk full on db-3", "severity": "high"},
        },
        owner="acme-ops",
        commit_semantics="The ticket exists once Acme answers with its number.",
        completion_semantics="open",
        completion_statuses=frozenset({"open"}),
        lookup=("idempotency_key",),  # Acme finds a ticket by the request id it came with
        approval=ApprovalPolicy(
            "rule", "Critical tickets need an approver.", "severity", "==", "critical"
        ),
    )
]


class AcmeTicketsAdapter:
    def __init__(self, config):  # a ProviderConfig: name, base_url, timeout, contract
        self.url, self.done = urlsplit(config.base_url), config.contract.completion_statuses

    def _call(self, method, path, timeout, body=None, headers={}):  # noqa: B006
        conn = http.client.HTTPConnection(self.url.hostname, self.url.port, timeout=timeout)
        try:
            try:
                conn.connect()
            except OSError as exc:
                return None, repr(exc)  # never connected: Acme cannot have received anything
            conn.request(method, self.url.path + path, body, headers)  # from here: it may have
            response = conn.getresponse()
            return response.status, json.loads(response.read() or b"{}")
        finally:
            conn.close()

    def _operation(self, ticket):
        digest = ticket["metadata"].get("gateway_digest", "")
        return ProviderOperation(str(ticket["number"]), ticket["state"], digest, ticket)

    def execute(self, request):
        metadata = {"gateway_digest": request.payload_digest}  # Acme keeps it with the ticket
        body = json.dumps({**request.payload, "metadata": metadata})
        headers = {"Content-Type": "application/json", "X-Request-Id": request.idempotency_key}
        try:
            code, answer = self._call("POST", "/v2/tickets", request.timeout, body, headers)
            op = self._operation(answer["ticket"]) if code in (200, 201) else None
        except (OSError, ValueError, KeyError, TypeError) as exc:  # sent; no answer we can read
            return CallResult(Outcome.UNKNOWN, "no answer after sending", error=repr(exc))
        if code is None:
            return CallResult(Outcome.NOT_STARTED, "could not connect", error=answer)
        if op is not None and op.payload_digest != request.payload_digest:
            return CallResult(Outcome.UNKNOWN, "Acme holds another body", op, code, mismatch=True)
        if op is not None:
            outcome = Outcome.CONFIRMED if op.status in self.done else Outcome.IN_PROGRESS
            return CallResult(outcome, f"ticket {op.status}", op, code)
        if code == 409:  # the request id was used with another body: never confirm, never resend
            return CallResult(Outcome.UNKNOWN, "request id reused", None, code, mismatch=True)
        if 400 <= code < 500 and code not in (408, 429):
            return CallResult(Outcome.REJECTED, "Acme refused it", None, code, str(answer))
        return CallResult(Outcome.UNKNOWN, f"HTTP {code} after sending", None, code, str(answer))

    def lookup(self, *, idempotency_key, provider_operation_id="", timeout, **_):
        path = f"/v2/tickets?request_id={quote(idempotency_key)}"
        try:
            code, answer = self._call("GET", path, timeout)
            tickets = [self._operation(t) for t in answer["tickets"]] if code == 200 else None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return LookupResult(LookupStatus.UNREACHABLE, error=repr(exc))
        if tickets is None:
            return LookupResult(LookupStatus.UNREACHABLE, http_status=code, error=str(answer))
        found = LookupStatus.FOUND if tickets else LookupStatus.NOT_FOUND
        return LookupResult(found, tickets[0] if tickets else None, code)


ADAPTERS = {"acme-tickets": AcmeTicketsAdapter}
