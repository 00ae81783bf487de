"""The real-client checks, against a running gateway (``make demo``).

    export GATEWAY_URL=http://127.0.0.1:8000 GATEWAY_TOKEN=egw_…
    .venv/bin/python scripts/check_real_clients.py

Real clients only: the official MCP SDK client over stdio (the ``effect-gateway-mcp`` program)
and over streamable HTTP with bearer tokens (four protocol versions), the MCP tools' schemas
under strict-mode portability rules, the TypeScript package from its ``npm pack`` tarball, the
real Claude Code CLI running the docs' headless config (``scripts/check_agent_clients.py``), a
LangGraph graph with a checkpointer (two and three threads, one intention; a cancel that
resumes the thread), and a webhook receiver verifying every delivery with ``standardwebhooks``.
The sandbox provider's own operation log (``$SANDBOX_URL/_operations``) is the oracle for "one
operation per key".

Tokens: ``GATEWAY_TOKEN`` (an agent of the demo tenant), ``OPERATOR_TOKEN``,
``APPROVER_TOKEN`` and ``ADMIN_TOKEN`` (it registers the approver's Ed25519 key, which signs
the approvals); the last three are issued with ``manage.py issue_token`` when missing (run
from the repository, with the demo's DATABASE_URL). Exits 1 if any check fails.
"""

from __future__ import annotations

import functools
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypedDict

import anyio
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "clients" / "python" / "src"))

import check_agent_clients  # noqa: E402
from effect_gateway_client import GatewayClient  # noqa: E402

URL = os.environ.get("GATEWAY_URL", "http://127.0.0.1:8000").rstrip("/")
SANDBOX = os.environ.get("SANDBOX_URL", "http://127.0.0.1:8765").rstrip("/")
TENANT = os.environ.get("GATEWAY_TENANT", "demo")
RUN = os.environ.get("CHECK_RUN", time.strftime("%Y%m%d%H%M%S"))
results: list[tuple[str, bool, str]] = []
# The approver's registered Ed25519 key (check_agent_clients.MachineSigner), set by main().
SIGNER: dict[str, Any] = {}


def check(name: str) -> Callable:
    def wrap(fn: Callable) -> Callable:
        def run(*args: Any) -> None:
            started = time.monotonic()
            try:
                detail = fn(*args) or ""
                results.append((name, True, f"{detail} ({time.monotonic() - started:.1f} s)"))
            except Exception as error:  # a failed check is reported, the others still run
                traceback.print_exc(file=sys.stderr)
                results.append((name, False, f"{type(error).__name__}: {error}"))

        return run

    return wrap


def token(env: str, principal: str, role: str) -> str:
    if os.environ.get(env):
        return os.environ[env]
    out = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "issue_token",
            "--tenant",
            TENANT,
            "--principal",
            principal,
            "--role",
            role,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip().splitlines()[-1]


def provider_operations(key: str) -> list[dict]:
    """The sandbox's own log of operations under this gateway key (provider key)."""
    response = httpx.get(
        f"{SANDBOX}/_operations", params={"idempotency_key": f"{TENANT}:{key}"}, trust_env=False
    )
    response.raise_for_status()
    return response.json()["operations"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# --- MCP -------------------------------------------------------------------------------------


def mcp_command() -> list[str]:
    script = Path(sys.executable).parent / "effect-gateway-mcp"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "effect_gateway_client.mcp_server"]


@check("MCP SDK client over stdio (effect-gateway-mcp)")
def mcp_stdio(agent_token: str) -> str:
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    command = mcp_command()
    params = StdioServerParameters(
        command=command[0],
        args=command[1:],
        env={
            "GATEWAY_URL": URL,
            "GATEWAY_TOKEN": agent_token,
            "PYTHONPATH": str(ROOT / "clients" / "python" / "src"),
        },
    )
    key = f"ticket.create:support:mcp-stdio-{RUN}:v1"
    ticket = {
        "idempotency_key": key,
        "resource": {"type": "queue", "id": "support"},
        "payload": {"title": f"real-client check {RUN}", "priority": "P3"},
    }

    async def main():
        async with stdio_client(params) as (read, write), ClientSession(read, write) as c:
            init = await c.initialize()
            tools = {t.name: t for t in (await c.list_tools()).tools}
            first = await c.call_tool("ticket_create", ticket)
            second = await c.call_tool("ticket_create", ticket)
            waited = await c.call_tool(
                "wait_for_effect",
                {"effect_id": first.structuredContent["effect_id"], "timeout_seconds": 30},
            )
            stringified = await c.call_tool(
                "ticket_create", {**ticket, "payload": json.dumps(ticket["payload"])}
            )
            big = await c.call_tool(
                "billing_refund_create",
                {
                    "idempotency_key": f"billing.refund.create:ord_mcp:{RUN}:v1",
                    "resource": {"type": "order", "id": f"ord_mcp_{RUN}", "version": 1},
                    "payload": {"amount": 25_000, "currency": "EUR", "reason": "check"},
                },
            )
            return init, tools, first, second, waited, stringified, big

    init, tools, first, second, waited, stringified, big = anyio.run(main)
    check("MCP tool schemas: OpenAI strict mode and MCP Inspector --strict rules")(
        check_agent_clients.strict_schemas
    )(list(tools.values()))
    assert "ticket_create" in tools and "wait_for_effect" in tools
    assert tools["billing_refund_create"].annotations.destructiveHint is True
    assert tools["ticket_create"].annotations.destructiveHint is False
    assert (first.structuredContent["replayed"], second.structuredContent["replayed"]) == (
        False,
        True,
    )
    assert waited.structuredContent["status"] == "CONFIRMED", waited.structuredContent
    assert len(provider_operations(key)) == 1
    assert (
        stringified.isError
        and "not a string holding JSON" in (stringified.structuredContent["error"])
    )
    data = big.structuredContent
    assert data["status"] == "AWAITING_APPROVAL" and "wait_for_effect" in data["next_step"]
    return (
        f"protocol {init.protocolVersion}, {len(tools)} tools, 2 calls = 1 provider "
        f"operation, stringified payload -> fix-it error, approval -> next_step "
        f"wait_for_effect ({data['approval_url']})"
    )


@check("MCP over streamable HTTP with bearer tokens, 4 protocol versions")
def mcp_http(agent_token: str) -> str:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    port = free_port()
    command = mcp_command()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "clients" / "python" / "src")}
    env.pop("GATEWAY_TOKEN", None)
    server = subprocess.Popen(
        [*command, "--gateway-url", URL, "--transport", "streamable-http", "--port", str(port)],
        env=env,
        stdin=subprocess.DEVNULL,
    )
    mcp_url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        accept = {"Accept": "application/json, text/event-stream"}
        unauth = httpx.post(mcp_url, json={}, headers=accept, trust_env=False)
        forged = httpx.post(
            mcp_url,
            json={},
            headers={**accept, "Authorization": "Bearer egw_forged"},
            trust_env=False,
        )
        assert (unauth.status_code, forged.status_code) == (401, 401)
        negotiated = []
        for version in ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"):
            answer = httpx.post(
                mcp_url,
                headers={**accept, "Authorization": f"Bearer {agent_token}"},
                json={
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "initialize",
                    "params": {
                        "protocolVersion": version,
                        "capabilities": {},
                        "clientInfo": {"name": "check", "version": "1"},
                    },
                },
                trust_env=False,
            )
            assert answer.status_code == 200, answer.text
            text = answer.text
            body = json.loads(text.split("data: ", 1)[1]) if "data: " in text else answer.json()
            negotiated.append(f"{version}->{body['result']['protocolVersion']}")

        async def main():
            headers = {"Authorization": f"Bearer {agent_token}"}
            async with (
                httpx.AsyncClient(headers=headers, timeout=30, trust_env=False) as http,
                streamable_http_client(mcp_url, http_client=http) as (read, write, _),
                ClientSession(read, write) as c,
            ):
                await c.initialize()
                tools = [t.name for t in (await c.list_tools()).tools]
                result = await c.call_tool("get_effect", {"effect_id": "eff_does_not_exist"})
                return tools, result

        tools, result = anyio.run(main)
        assert "ticket_create" in tools and result.isError
        return f"401 without/with a forged token; {', '.join(negotiated)}; {len(tools)} tools"
    finally:
        server.terminate()
        server.wait(timeout=10)


# --- webhooks and LangGraph ---------------------------------------------------------------


class Receiver:
    def __init__(self) -> None:
        self.deliveries: list[tuple[bytes, dict]] = []
        self.arrived: queue.Queue = queue.Queue()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                headers = {k.lower(): v for k, v in self.headers.items()}
                receiver.deliveries.append((body, headers))
                receiver.arrived.put((body, headers))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/gateway"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self, secret: str) -> list[dict]:
        from standardwebhooks import Webhook

        return [Webhook(secret).verify(body, headers) for body, headers in self.deliveries]

    def wait_for(self, secret: str, predicate: Callable[[list[dict]], bool], timeout=60.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self.events(secret)):
                return
            time.sleep(0.2)
        raise AssertionError(f"webhooks seen: {[e['type'] for e in self.events(secret)]}")


registered: list[str] = []


def register(operator: GatewayClient, receiver: Receiver, **filters) -> str:
    response = operator._request(
        "POST", "/api/v1/webhook-endpoints", json={"url": receiver.url, **filters}
    )
    registered.append(response.json()["id"])
    return response.json()["secret"]


def unregister(operator: GatewayClient) -> None:
    """Switch this run's endpoints off: their receivers die with this process, and deliveries
    retried to dead receivers would queue ahead of the demo's dispatches."""
    for endpoint_id in registered:
        operator._request(
            "POST",
            f"/api/v1/webhook-endpoints/{endpoint_id}/disable",
            json={"reason": "check_real_clients.py finished"},
        )


class State(TypedDict, total=False):
    order_id: str
    amount: int
    refund: dict


def refund_graph(agent: GatewayClient, *, poll_first: float = 0.0):
    from effect_gateway_client.langgraph import submit_effect, wait_for_effect
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, StateGraph

    def refund(state: State) -> State:
        effect = submit_effect(
            agent,
            "billing.refund.create",
            resource={"type": "order", "id": state["order_id"], "version": 1},
            payload={"amount": state["amount"], "currency": "EUR", "reason": "duplicate"},
            business_resource=state["order_id"],
            revision=f"check-{RUN}",
        )
        # A real worker dispatches in the background: long poll a little before interrupting.
        done = wait_for_effect(agent, effect, poll_first=poll_first)
        return {
            "refund": {
                "effect_id": done.effect_id,
                "status": done.status,
                "replayed": effect.replayed,
            }
        }

    builder = StateGraph(State)
    builder.add_node("refund", refund)
    builder.add_edge(START, "refund")
    builder.add_edge("refund", END)
    return builder.compile(checkpointer=InMemorySaver())


@check("LangGraph: the same refund on two threads is one refund")
def langgraph_two_threads(agent: GatewayClient) -> str:
    graph = refund_graph(agent, poll_first=30)
    order = f"ord_two_{RUN}"
    a = graph.invoke({"order_id": order, "amount": 500}, {"configurable": {"thread_id": "A"}})
    b = graph.invoke({"order_id": order, "amount": 500}, {"configurable": {"thread_id": "B"}})
    assert a["refund"]["effect_id"] == b["refund"]["effect_id"]
    assert (a["refund"]["replayed"], b["refund"]["replayed"]) == (False, True)
    assert a["refund"]["status"] == "CONFIRMED"
    ops = provider_operations(f"billing.refund.create:{order}:check-{RUN}")
    assert len(ops) == 1, ops
    return f"threads A and B -> {a['refund']['effect_id']}, 1 provider operation"


@check("LangGraph: a cancelled effect resumes the waiting thread; other effects ignored")
def langgraph_cancel(agent: GatewayClient, operator: GatewayClient, agent_name: str) -> str:
    from effect_gateway_client.langgraph import resume_thread

    receiver = Receiver()
    secret = register(operator, receiver, principals=[agent_name])
    graph = refund_graph(agent)
    config = {"configurable": {"thread_id": f"cancel-{RUN}"}}
    state = graph.invoke({"order_id": f"ord_cancel_{RUN}", "amount": 25_000}, config)
    effect_id = state["__interrupt__"][0].value["effect_id"]
    unrelated = agent.submit(  # another effect of the tenant: its webhook must not disturb it
        "ticket.create",
        {"type": "queue", "id": "support"},
        {"title": f"unrelated {RUN}", "priority": "P4"},
        key=f"ticket.create:support:unrelated-{RUN}:v1",
    )
    agent.cancel(effect_id, reason="the customer withdrew the claim")
    ignored = 0
    seen_unrelated = False  # the unrelated ticket's webhook, whenever it arrives, resumes nothing
    deadline = time.monotonic() + 60
    while "__interrupt__" in state and time.monotonic() < deadline:
        body, headers = receiver.arrived.get(timeout=max(deadline - time.monotonic(), 0.1))
        seen_unrelated = seen_unrelated or unrelated.effect_id in body.decode()
        resumed = resume_thread(graph, body, headers, secret)
        if resumed is None:
            ignored += 1
        else:
            state = resumed
    assert state["refund"]["status"] == "CANCELLED", state
    while not seen_unrelated and time.monotonic() < deadline + 30:
        body, headers = receiver.arrived.get(timeout=30)
        seen_unrelated = unrelated.effect_id in body.decode()
        assert resume_thread(graph, body, headers, secret) is None
        ignored += 1
    assert seen_unrelated
    assert provider_operations(f"billing.refund.create:ord_cancel_{RUN}:check-{RUN}") == []
    return f"{effect_id} CANCELLED resumed the thread; {ignored} other deliveries ignored"


@check("LangGraph: three threads waiting on one effect are all resumed")
def langgraph_three_threads(agent: GatewayClient, operator: GatewayClient, agent_name: str) -> str:
    from effect_gateway_client.langgraph import resume_threads

    receiver = Receiver()
    secret = register(operator, receiver, principals=[agent_name])
    graph = refund_graph(agent)
    order = f"ord_three_{RUN}"
    threads = [f"three-{n}-{RUN}" for n in range(3)]
    started = [
        graph.invoke({"order_id": order, "amount": 25_000}, {"configurable": {"thread_id": t}})
        for t in threads
    ]
    (effect_id,) = {state["__interrupt__"][0].value["effect_id"] for state in started}
    agent.cancel(effect_id, reason="one refund was enough")
    resumed: dict[str, dict] = {}
    deadline = time.monotonic() + 60
    while len(resumed) < len(threads) and time.monotonic() < deadline:
        body, headers = receiver.arrived.get(timeout=max(deadline - time.monotonic(), 0.1))
        states = resume_threads(graph, body, headers, secret)  # awaiting_approval: re-interrupts
        resumed.update({t: state for t, state in states.items() if "__interrupt__" not in state})
    assert sorted(resumed) == sorted(threads), resumed
    assert all(state["refund"]["status"] == "CANCELLED" for state in resumed.values()), resumed
    assert provider_operations(f"billing.refund.create:{order}:check-{RUN}") == []
    return f"{effect_id} CANCELLED resumed {len(resumed)} threads"


@check("Webhooks: every waited-on state announced, signed, filtered, User-Agent")
def webhook_coverage(
    agent: GatewayClient, operator: GatewayClient, approver: GatewayClient, agent_name: str
) -> str:
    receiver = Receiver()
    secret = register(operator, receiver, principals=[agent_name], run_ids=[f"run-{RUN}"])
    wanted = _effects_in_every_waited_on_state(agent, approver, {"run_id": f"run-{RUN}"})
    receiver.wait_for(
        secret,
        lambda events: wanted <= {(e["data"].get("effect_id"), e["type"]) for e in events},
        timeout=90,
    )
    events = receiver.events(secret)
    assert all(e["data"]["context"].get("run_id") == f"run-{RUN}" for e in events)
    agents = {h.get("user-agent", "") for _, h in receiver.deliveries}
    assert all(a.startswith("effect-gateway/") for a in agents), agents
    approval = next(e for e in events if e["type"] == "effect.awaiting_approval")
    saga_id, saga_states = _saga_state_changes(agent, operator)
    types = sorted({e["type"] for e in events})
    return (
        f"{len(events)} signed deliveries ({', '.join(types)}); approval url "
        f"{approval['data']['approval']['url']}; other run filtered out; "
        f"User-Agent {sorted(agents)[0]}; saga {saga_id} -> {saga_states}"
    )


def _effects_in_every_waited_on_state(
    agent: GatewayClient, approver: GatewayClient, context: dict[str, str]
) -> set[tuple[str, str]]:
    """Drive effects of this run through every state an agent waits on (and one of another
    run, to be filtered out); return the (effect id, event type) pairs to be announced."""
    refund = {"amount": 30_000, "currency": "EUR", "reason": "check"}

    def big(name: str, **extra):
        return agent.submit(
            "billing.refund.create",
            {"type": "order", "id": f"ord_{name}_{RUN}", "version": 1},
            refund,
            key=f"billing.refund.create:ord_{name}_{RUN}:v1",
            context=context,
            **extra,
        )

    approved = big("approved")
    SIGNER["approver"].approve(approver, approved.effect_id)
    rejected = big("rejected")
    approver.reject(rejected.effect_id, reason="not this one")
    cancelled = big("cancelled")
    agent.cancel(cancelled.effect_id, reason="plan changed")
    expiring = big("expiring", expires_in=1)
    ticket = agent.submit(
        "ticket.create",
        {"type": "queue", "id": "support"},
        {"title": f"compensate me {RUN}", "priority": "P4"},
        key=f"ticket.create:support:comp-{RUN}:v1",
        context=context,
    )
    agent.wait(ticket.effect_id, 30)
    agent.compensate(ticket.effect_id, reason="opened by mistake")
    # Not this run: filtered out.
    agent.submit(
        "ticket.create",
        {"type": "queue", "id": "support"},
        {"title": f"other run {RUN}", "priority": "P4"},
        key=f"ticket.create:support:other-{RUN}:v1",
        context={"run_id": "other"},
    )
    return {
        (approved.effect_id, "effect.awaiting_approval"),
        (approved.effect_id, "effect.approved"),
        (approved.effect_id, "effect.confirmed"),
        (rejected.effect_id, "effect.rejected"),
        (cancelled.effect_id, "effect.cancelled"),
        (expiring.effect_id, "effect.expired"),
        (ticket.effect_id, "effect.confirmed"),
        (ticket.effect_id, "effect.compensated"),
    }


def _saga_state_changes(agent: GatewayClient, operator: GatewayClient) -> tuple[str, list[str]]:
    """Saga state changes, to an endpoint of their own (sagas carry no run id): start a saga
    and return its id with the states announced for it."""
    saga_receiver = Receiver()
    saga_secret = register(operator, saga_receiver, event_types=["saga.state_changed"])
    definitions = agent._request("GET", "/api/v1/saga-definitions").json()["results"]
    definition = next(d for d in definitions if d["name"] == "order.fulfillment")
    inputs = {**definition["example"], "order_id": f"ord_saga_{RUN}"}
    started = agent._request(
        "POST",
        "/api/v1/sagas",
        json={"definition": "order.fulfillment", "inputs": inputs},
        headers={"Idempotency-Key": f"saga:order.fulfillment:{RUN}"},
        idempotent=True,
    ).json()
    saga_receiver.wait_for(
        saga_secret,
        lambda events: any(e["data"].get("saga_id") == started["saga_id"] for e in events),
        timeout=90,
    )
    saga_states = [
        e["data"]["state"]
        for e in saga_receiver.events(saga_secret)
        if e["data"].get("saga_id") == started["saga_id"]
    ]
    return started["saga_id"], saga_states


def main() -> int:
    agent_token = os.environ.get("GATEWAY_TOKEN")
    if not agent_token:
        print("set GATEWAY_TOKEN to the demo agent's token (make demo prints it)", file=sys.stderr)
        return 2
    operator_token = token("OPERATOR_TOKEN", "oscar", "operator")
    approver_token = token("APPROVER_TOKEN", "alice", "approver")
    admin_token = token("ADMIN_TOKEN", "admin", "admin")
    SIGNER["approver"] = check_agent_clients.MachineSigner(URL, admin_token, "alice")
    agent = GatewayClient(URL, agent_token)
    operator = GatewayClient(URL, operator_token)
    approver = GatewayClient(URL, approver_token)
    me = agent.list(limit=1)  # reachability, and the agent's name from any effect
    agent_name = os.environ.get("AGENT_NAME", "demo-agent")
    print(
        f"gateway {URL}, sandbox {SANDBOX}, run {RUN}, agent {agent_name}"
        f" ({len(me.results)} effect seen)"
    )
    try:
        mcp_stdio(agent_token)
        mcp_http(agent_token)
        check("TypeScript package from its npm pack tarball")(
            check_agent_clients.typescript_tarball
        )(URL, agent_token, RUN, provider_operations)
        check("Claude Code CLI, headless, the docs' config verbatim")(
            check_agent_clients.claude_code_headless
        )(URL, agent_token, RUN, provider_operations)
        check("Remote MCP with OAuth 2.1: the MCP SDK's own client flow")(
            functools.partial(
                check_agent_clients.mcp_oauth,
                login=(
                    os.environ.get("ADMIN_LOGIN", f"admin@{TENANT}"),
                    os.environ.get("ADMIN_PASSWORD", "admin-demo-pw"),
                ),
                agent=os.environ.get("AGENT_NAME", "demo-agent"),
            )
        )(URL, RUN, provider_operations)
        langgraph_two_threads(agent)
        langgraph_cancel(agent, operator, agent_name)
        langgraph_three_threads(agent, operator, agent_name)
        webhook_coverage(agent, operator, approver, agent_name)
    finally:
        unregister(operator)
    for name, ok, detail in results:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
    failed = sum(not ok for _, ok, _ in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
