"""The sandbox provider over real HTTP: the protocol of SPEC §6, its faults, and its log.

The sandbox's operation log is the exactly-once oracle of the integration tests, so these
tests pin what it commits (and what it must not) for every request and fault. No database.
"""

import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.lib.digest import payload_digest
from gateway.providers.sandbox import BadRequest, SandboxProvider, SandboxServer

ROOT = Path(__file__).resolve().parents[2]
# The sandbox speaks plain HTTP, but every httpx.Client loads the CA bundle (~50 ms) unless
# handed a TLS context: one shared context keeps client set-up from dominating the suite.
_TLS = ssl.create_default_context()

REFUND = {
    "type": "billing.refund.create",
    "resource": {"type": "order", "id": "ord_881", "version": 17},
    "payload": {"amount": 500, "currency": "EUR", "reason": "duplicate charge"},
}
CHARGE = {
    "type": "billing.charge.create",
    "resource": {"type": "order", "id": "ord_882"},
    "payload": {"amount": 1200, "currency": "EUR"},
}


def body(command: dict[str, Any] = REFUND, **changes: Any) -> dict[str, Any]:
    """A §6 request body for ``command`` with its correct digest."""
    data = {**command, **changes}
    data["payload_digest"] = payload_digest(
        type=data["type"], resource=data["resource"], payload=data["payload"]
    )
    return data


def http_client(base_url: str, **options: Any) -> httpx.Client:
    options.setdefault("timeout", 5)
    return httpx.Client(base_url=base_url, verify=_TLS, **options)


def post(client: httpx.Client, key: str, data: dict[str, Any] | None = None) -> httpx.Response:
    return client.post(
        "/operations", json=data if data is not None else body(), headers={"Idempotency-Key": key}
    )


@pytest.fixture
def server():
    with SandboxServer() as running:
        yield running


@pytest.fixture
def sandbox(server: SandboxServer) -> SandboxProvider:
    return server.provider


@pytest.fixture
def client(server: SandboxServer):
    with http_client(server.base_url("billing")) as http:
        yield http


@pytest.fixture
def control(server: SandboxServer):
    with http_client(server.url) as http:
        yield http


# -- the protocol ------------------------------------------------------------------------------


def test_new_key_commits_and_answers_201(client, sandbox):
    sent = body()
    response = post(client, "refund-1", sent)

    assert response.status_code == 201
    op = response.json()
    assert op["id"].startswith("op_")
    assert op["status"] == "succeeded"
    assert op["payload_digest"] == sent["payload_digest"]
    assert op["idempotency_key"] == "refund-1"
    assert op["type"] == "billing.refund.create"
    assert op["resource"] == REFUND["resource"]
    assert op["created_at"].endswith("Z")
    assert op["result"]["refund_id"].startswith("re_")
    assert (op["result"]["amount"], op["result"]["currency"]) == (500, "EUR")
    assert [o["id"] for o in sandbox.operations()] == [op["id"]]
    assert sandbox.operations()[0]["provider"] == "billing"


@pytest.mark.parametrize(
    ("type_", "payload", "expected"),
    [
        ("email.message.send", {"to": "a@example.com"}, {"state": "sent"}),
        (
            "deployment.release.promote",
            {"environment": "staging", "revision": "r42"},
            {"environment": "staging", "revision": "r42"},
        ),
        ("ticket.close", {"ticket_id": "TCK-1"}, {"ticket_id": "TCK-1", "state": "closed"}),
        ("sandbox.verify", {}, {"verified": True}),
    ],
)
def test_results_are_realistic_per_type(client, type_, payload, expected):
    data = body({"type": type_, "resource": {"type": "x", "id": "1"}, "payload": payload})

    result = post(client, f"k-{type_}", data).json()["result"]

    assert expected.items() <= result.items()


def test_unknown_type_gets_a_generic_result(client):
    lead = {"type": "crm.lead.create", "resource": {"type": "lead", "id": "l1"}, "payload": {}}
    data = body(lead)

    response = post(client, "lead-1", data)

    assert response.status_code == 201
    assert response.json()["result"]["reference"].startswith("ref_")


def test_same_key_same_body_is_a_200_replay_of_the_one_operation(client, sandbox):
    first = post(client, "refund-1").json()
    # Same body with its keys in another order: compared canonically, still the same body.
    reordered = {k: body()[k] for k in reversed(list(body()))}
    reordered["payload"] = dict(reversed(list(REFUND["payload"].items())))

    replay = post(client, "refund-1", reordered)

    assert replay.status_code == 200
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json() == first
    assert len(sandbox.operations()) == 1
    assert [e["action"] for e in sandbox.log()] == ["commit", "replay"]


def test_same_key_other_body_is_422_and_commits_nothing(client, sandbox):
    first = post(client, "refund-1").json()
    other = body(payload={**REFUND["payload"], "amount": 5000})

    response = post(client, "refund-1", other)

    assert response.status_code == 422
    assert response.json()["error"] == "idempotency_key_reused"
    assert [o["id"] for o in sandbox.operations()] == [first["id"]]
    assert sandbox.operations()[0]["payload"]["amount"] == 500


def test_missing_idempotency_key_is_400(client, sandbox):
    response = client.post("/operations", json=body())

    assert response.status_code == 400
    assert response.json() == {"error": "missing_idempotency_key"}
    assert sandbox.operations() == []


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b"[]",
        json.dumps({k: v for k, v in body().items() if k != "payload_digest"}).encode(),
        json.dumps({**body(), "payload": "a string"}).encode(),
        b'{"type": "x", "resource": {}, "payload": {"n": NaN}, "payload_digest": "d"}',
    ],
    ids=["malformed", "not-an-object", "missing-digest", "payload-not-object", "nan"],
)
def test_bad_bodies_are_400_and_commit_nothing(client, sandbox, raw):
    response = client.post(
        "/operations",
        content=raw,
        headers={"Idempotency-Key": "k", "Content-Type": "application/json"},
    )

    assert response.status_code == 400
    assert response.json()["error"] == "bad_request"
    assert response.json()["detail"]
    assert sandbox.operations() == []


def test_keys_are_scoped_per_provider(server, client, control, sandbox):
    billing = post(client, "shared-key").json()
    with http_client(server.base_url("deploy")) as deploy:
        other = post(deploy, "shared-key", body(CHARGE))
    unprefixed = post(control, "shared-key")

    assert other.status_code == 201
    assert unprefixed.status_code == 201
    assert len({billing["id"], other.json()["id"], unprefixed.json()["id"]}) == 3
    assert [o["provider"] for o in sandbox.operations()] == ["billing", "deploy", "default"]


def test_lookup_by_key_and_by_id(server, client):
    op = post(client, "refund-1").json()

    by_key = client.get("/operations", params={"idempotency_key": "refund-1"})
    by_id = client.get(f"/operations/{op['id']}")
    missing_key = client.get("/operations", params={"idempotency_key": "never-sent"})
    missing_id = client.get("/operations/op_nope")
    with http_client(server.base_url("deploy")) as deploy:
        other_provider = deploy.get(f"/operations/{op['id']}")

    assert (by_key.status_code, by_key.json()) == (200, op)
    assert (by_id.status_code, by_id.json()) == (200, op)
    assert (missing_key.status_code, missing_key.json()) == (404, {"error": "not_found"})
    assert missing_id.status_code == 404
    assert other_provider.status_code == 404


def test_stale_resource_version_is_409_and_commits_nothing(client, control, sandbox):
    control.post(
        "/_resources", json={"provider": "billing", "type": "order", "id": "ord_881", "version": 18}
    )

    stale = post(client, "refund-1")
    current = post(client, "refund-2", body(resource={**REFUND["resource"], "version": 18}))
    unversioned = post(client, "refund-3", body(resource={"type": "order", "id": "ord_881"}))

    assert stale.status_code == 409
    assert stale.json() == {"error": "version_conflict", "current_version": 18}
    assert current.status_code == 201
    assert unversioned.status_code == 201
    assert [o["idempotency_key"] for o in sandbox.operations()] == ["refund-2", "refund-3"]
    assert sandbox.log()[0]["action"] == "conflict"


def test_resource_version_without_provider_applies_to_every_provider(server, client, sandbox):
    sandbox.set_resource_version(provider=None, type="order", id="ord_881", version=20)

    with http_client(server.base_url("deploy")) as deploy:
        assert post(deploy, "k").status_code == 409
    assert post(client, "k").status_code == 409
    assert sandbox.operations() == []


# -- faults ------------------------------------------------------------------------------------


def test_commit_then_drop_commits_once_and_sends_nothing(client, control, sandbox):
    control.post("/_faults", json={"fault": "commit_then_drop", "times": 1})

    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        post(client, "refund-1")

    ops = sandbox.operations()
    assert len(ops) == 1
    assert ops[0]["status"] == "succeeded"
    lookup = client.get("/operations", params={"idempotency_key": "refund-1"})
    assert lookup.json()["id"] == ops[0]["id"]
    # The rule is used up: the client's retry with the same key is a replay, not a second op.
    assert post(client, "refund-1").status_code == 200
    assert len(sandbox.operations()) == 1
    assert sandbox.log()[0]["fault"] == "commit_then_drop"
    assert sandbox.log()[0]["status"] is None


def test_fail_before_commit_is_503_and_commits_nothing(client, sandbox):
    sandbox.add_fault("fail_before_commit")

    response = post(client, "refund-1")

    assert response.status_code == 503
    assert response.json() == {"error": "unavailable"}
    assert sandbox.operations() == []
    assert client.get("/operations", params={"idempotency_key": "refund-1"}).status_code == 404
    # Nothing was committed, so the same key is new to the provider.
    assert post(client, "refund-1").status_code == 201
    assert len(sandbox.operations()) == 1


def test_slow_commits_first_and_answers_after_the_client_gave_up(client, sandbox):
    sandbox.add_fault("slow", seconds=1)

    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        client.post(
            "/operations", json=body(), headers={"Idempotency-Key": "refund-1"}, timeout=0.3
        )

    assert len(sandbox.operations(idempotency_key="refund-1")) == 1
    # The slow answer is still pending in its thread; other requests are not held up.
    lookup = client.get("/operations", params={"idempotency_key": "refund-1"})
    assert lookup.status_code == 200
    assert time.monotonic() - started < 0.9


def test_processing_stays_for_n_lookups_then_succeeds(client, sandbox):
    sandbox.add_fault("processing", lookups=2)

    created = post(client, "refund-1").json()
    replay = post(client, "refund-1").json()  # a replay is not a lookup
    statuses = [
        client.get("/operations", params={"idempotency_key": "refund-1"}).json()["status"],
        client.get(f"/operations/{created['id']}").json()["status"],
        client.get(f"/operations/{created['id']}").json()["status"],
        client.get("/operations", params={"idempotency_key": "refund-1"}).json()["status"],
    ]

    assert created["status"] == "processing"
    assert replay["status"] == "processing"
    assert statuses == ["processing", "processing", "succeeded", "succeeded"]
    assert sandbox.operations()[0]["status"] == "succeeded"


def test_processing_can_end_failed(client, sandbox):
    sandbox.add_fault("processing", lookups=1, then="failed")

    created = post(client, "refund-1").json()
    looked_up = [
        client.get("/operations", params={"idempotency_key": "refund-1"}).json() for _ in range(2)
    ]

    assert created["status"] == "processing"
    assert [op["status"] for op in looked_up] == ["processing", "failed"]
    assert looked_up[1]["result"]["error"] == "operation_failed"
    assert [op["status"] for op in sandbox.operations()] == ["failed"]
    with pytest.raises(BadRequest, match=r"processing\.then"):
        sandbox.add_fault("processing", then="done")


def test_key_expired_forgets_the_key_not_the_operation(client, control, sandbox):
    op = post(client, "refund-1").json()
    control.post("/_faults", json={"fault": "key_expired", "times": None})

    by_key = client.get("/operations", params={"idempotency_key": "refund-1"})
    by_id = client.get(f"/operations/{op['id']}")

    assert by_key.status_code == 404
    assert by_id.status_code == 200 and by_id.json()["id"] == op["id"]
    assert len(sandbox.operations(idempotency_key="refund-1")) == 1
    assert sandbox.log()[1]["action"] == "lookup_miss"
    assert sandbox.log()[1]["fault"] == "key_expired"


def test_digest_mismatch_is_visible_in_response_and_lookup(client, sandbox):
    sandbox.add_fault("digest_mismatch")
    sent = body()

    created = post(client, "refund-1", sent).json()
    looked_up = client.get(f"/operations/{created['id']}").json()

    assert created["payload_digest"] != sent["payload_digest"]
    assert created["payload_digest"].startswith("sha256:")
    assert looked_up["payload_digest"] == created["payload_digest"]
    assert sandbox.operations()[0]["sent_payload_digest"] == sent["payload_digest"]


def test_lookup_unreachable_drops_lookups_but_not_posts(client, control, sandbox):
    op = post(client, "refund-1").json()
    control.post("/_faults", json={"fault": "lookup_unreachable", "times": None})

    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        client.get("/operations", params={"idempotency_key": "refund-1"})
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        client.get(f"/operations/{op['id']}")
    assert post(client, "refund-2").status_code == 201
    assert post(client, "refund-1").status_code == 200

    control.delete("/_faults")
    assert client.get(f"/operations/{op['id']}").status_code == 200
    assert [e["action"] for e in sandbox.log()] == [
        "commit", "fault", "fault", "commit", "replay", "lookup"
    ]  # fmt: skip
    assert sandbox.log()[1]["fault"] == "lookup_unreachable"


def test_reject_answers_its_4xx_and_commits_nothing(client, control, sandbox):
    control.post("/_faults", json={"fault": "reject", "status": 402, "error": "card_declined"})

    response = post(client, "charge-1", body(CHARGE))

    assert response.status_code == 402
    assert response.json() == {"error": "card_declined"}
    assert sandbox.operations() == []
    assert sandbox.log()[0]["action"] == "reject"


def test_reject_defaults_to_400_business_rejected(client, sandbox):
    sandbox.add_fault("reject")

    response = post(client, "charge-1", body(CHARGE))

    assert (response.status_code, response.json()) == (400, {"error": "business_rejected"})


def test_fail_commits_a_failed_operation(client, sandbox):
    sandbox.add_fault("fail")

    response = post(client, "refund-1")
    lookup = client.get("/operations", params={"idempotency_key": "refund-1"})

    assert response.status_code == 201
    assert response.json()["status"] == "failed"
    assert lookup.json()["status"] == "failed"
    assert [o["status"] for o in sandbox.operations()] == ["failed"]


def test_times_counts_the_requests_a_rule_applies_to(client, control, sandbox):
    control.post("/_faults", json={"fault": "fail_before_commit", "times": 2})

    statuses = [post(client, "refund-1").status_code for _ in range(3)]

    assert statuses == [503, 503, 201]
    assert control.get("/_faults").json() == {"faults": []}
    assert len(sandbox.operations()) == 1


def test_times_null_applies_until_cleared(client, control, sandbox):
    control.post("/_faults", json={"fault": "fail_before_commit", "times": None})

    statuses = [post(client, f"k{i}").status_code for i in range(3)]
    listed = control.get("/_faults").json()["faults"]
    control.delete("/_faults")

    assert statuses == [503, 503, 503]
    assert [(r["fault"], r["times"], r["applied"]) for r in listed] == [
        ("fail_before_commit", None, 3)
    ]
    assert post(client, "k0").status_code == 201


def test_type_filter_only_matches_that_type(client, sandbox):
    sandbox.add_fault("fail_before_commit", type="billing.charge.create", times=None)

    refund = post(client, "refund-1")
    charge = post(client, "charge-1", body(CHARGE))

    assert (refund.status_code, charge.status_code) == (201, 503)
    assert [o["type"] for o in sandbox.operations()] == ["billing.refund.create"]


def test_faults_posted_under_a_prefix_apply_to_that_provider(server, client, sandbox):
    with http_client(server.base_url("deploy")) as deploy:
        deploy.post("/_faults", json={"fault": "fail_before_commit"})

        assert post(client, "k").status_code == 201
        assert post(deploy, "k").status_code == 503
        assert post(deploy, "k").status_code == 201


def test_faults_compose_processing_behind_a_dropped_answer(client, sandbox):
    sandbox.add_fault("processing", lookups=1)
    sandbox.add_fault("commit_then_drop")

    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        post(client, "refund-1")
    first = client.get("/operations", params={"idempotency_key": "refund-1"}).json()
    second = client.get("/operations", params={"idempotency_key": "refund-1"}).json()

    assert (first["status"], second["status"]) == ("processing", "succeeded")
    assert sandbox.log()[0]["fault"] == "processing+commit_then_drop"


def test_unknown_fault_or_parameter_is_refused(control, sandbox):
    assert control.post("/_faults", json={"fault": "explode"}).status_code == 400
    assert control.post("/_faults", json={"fault": "slow", "second": 1}).status_code == 400
    assert control.post("/_faults", json={"fault": "reject", "status": 503}).status_code == 400
    with pytest.raises(BadRequest):
        sandbox.add_fault("slow", times=0)
    assert sandbox.faults() == []


# -- controls ----------------------------------------------------------------------------------


def test_operations_endpoint_lists_commits_in_order_with_provider(server, client, control):
    a = post(client, "a").json()
    post(client, "a")  # replay: not a new operation
    b = post(client, "b", body(CHARGE)).json()
    with http_client(server.base_url("deploy")) as deploy:
        c = post(deploy, "c").json()
        deploy_only = deploy.get("/_operations").json()

    everything = control.get("/_operations").json()["operations"]
    charges = control.get("/_operations", params={"type": "billing.charge.create"}).json()

    assert [(o["id"], o["provider"]) for o in everything] == [
        (a["id"], "billing"),
        (b["id"], "billing"),
        (c["id"], "deploy"),
    ]
    assert everything[0]["payload"] == REFUND["payload"]
    assert [o["id"] for o in charges["operations"]] == [b["id"]]
    assert [o["id"] for o in deploy_only["operations"]] == [c["id"]]


def test_log_records_every_protocol_request(client, control, sandbox):
    op = post(client, "a").json()
    post(client, "a")
    post(client, "a", body(CHARGE))
    client.get("/operations", params={"idempotency_key": "a"})
    client.get("/operations", params={"idempotency_key": "zzz"})
    sandbox.add_fault("fail_before_commit")
    post(client, "b")

    log = control.get("/_log").json()["log"]

    assert [(e["seq"], e["action"], e["status"]) for e in log] == [
        (1, "commit", 201),
        (2, "replay", 200),
        (3, "key_reused", 422),
        (4, "lookup", 200),
        (5, "lookup_miss", 404),
        (6, "fault", 503),
    ]
    assert log[0]["operation_id"] == op["id"]
    assert log[0]["type"] == "billing.refund.create"
    assert {e["provider"] for e in log} == {"billing"}
    assert [e["idempotency_key"] for e in log] == ["a", "a", "a", "a", "zzz", "b"]
    assert log[5]["fault"] == "fail_before_commit"
    assert all(e["at"].endswith("Z") for e in log)


def test_reset_forgets_everything(client, control, sandbox):
    post(client, "a")
    sandbox.add_fault("fail_before_commit", times=None)
    sandbox.set_resource_version(provider="billing", type="order", id="ord_881", version=99)

    assert control.post("/_reset").json() == {"ok": True}

    assert control.get("/_operations").json() == {"operations": []}
    assert control.get("/_log").json() == {"log": []}
    assert control.get("/_faults").json() == {"faults": []}
    assert post(client, "a").status_code == 201  # no fault, no stale version, key is new


def test_health(control):
    assert control.get("/_health").json() == {"ok": True}
    assert control.get("/nowhere").status_code == 404


# -- persistence, concurrency, lifecycle -------------------------------------------------------


def test_data_file_survives_a_restart(tmp_path):
    data_file = tmp_path / "sandbox.json"
    first = SandboxProvider(data_file=data_file)
    first.add_fault("processing", lookups=1)
    with SandboxServer(first) as server, http_client(server.base_url("billing")) as c:
        op = post(c, "refund-1").json()
        c.get(f"/operations/{op['id']}")

    second = SandboxProvider(data_file=data_file)

    assert second.operations() == first.operations()
    assert second.log() == first.log()
    assert [p.name for p in tmp_path.iterdir()] == ["sandbox.json"]  # no temp file left
    with SandboxServer(second) as server, http_client(server.base_url("billing")) as c:
        replay = post(c, "refund-1")
        # The one allowed "processing" lookup was used before the restart.
        assert c.get(f"/operations/{op['id']}").json()["status"] == "succeeded"
        post(c, "refund-2")
    assert replay.status_code == 200
    assert replay.json()["id"] == op["id"]
    third = SandboxProvider(data_file=data_file)
    assert [o["idempotency_key"] for o in third.operations()] == ["refund-1", "refund-2"]
    assert [e["seq"] for e in third.log()] == [1, 2, 3, 4, 5]


def test_twenty_concurrent_posts_of_one_key_commit_exactly_once(server, sandbox):
    barrier = threading.Barrier(20)
    responses: list[httpx.Response] = []
    lock = threading.Lock()
    limits = httpx.Limits(max_connections=20)

    def send(http: httpx.Client) -> None:
        barrier.wait()
        response = post(http, "refund-1")
        with lock:
            responses.append(response)

    with http_client(server.base_url("billing"), limits=limits) as http:
        threads = [threading.Thread(target=send, args=(http,)) for _ in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    assert sorted(r.status_code for r in responses) == [200] * 19 + [201]
    assert len({r.json()["id"] for r in responses}) == 1
    assert len(sandbox.operations()) == 1
    assert Counter(e["action"] for e in sandbox.log()) == {"commit": 1, "replay": 19}
    assert sandbox.log()[0]["action"] == "commit"


def test_stop_cuts_kept_alive_connections(server):
    with http_client(server.base_url("billing"), timeout=2) as http:
        assert http.get("/operations", params={"idempotency_key": "x"}).status_code == 404
        server.stop()
        with pytest.raises(httpx.TransportError):
            http.get("/operations", params={"idempotency_key": "x"})


def test_management_command_serves_until_sigterm(tmp_path):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "gateway.settings",
        # Unreachable on purpose: the sandbox must not touch the ledger database.
        "DATABASE_URL": "postgres://nobody:nothing@127.0.0.1:9/none",
    }
    command = [sys.executable, "manage.py", "run_sandbox_provider", "--port", "0"]
    command += ["--data-file", str(tmp_path / "ops.json")]
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    watchdog = threading.Timer(20, process.kill)
    watchdog.start()
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        assert line.startswith("Sandbox provider listening on http://127.0.0.1:"), (
            line + process.stderr.read() if process.stderr else line
        )
        url = line.rsplit(" ", 1)[-1]
        with http_client(f"{url}/billing") as billing:
            created = post(billing, "k")
        assert created.status_code == 201

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        watchdog.cancel()
        process.kill()
        process.wait()
    lines = [json.loads(line) for line in (tmp_path / "ops.json").read_text().splitlines()]
    assert [o["idempotency_key"] for o in lines if o["kind"] == "operation"] == ["k"]


def test_reset_before_commit_aborts_the_connection_and_commits_nothing(client, sandbox):
    sandbox.add_fault("reset_before_commit")

    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        post(client, "refund-1")

    assert sandbox.operations() == []
    assert (sandbox.log()[0]["fault"], sandbox.log()[0]["status"]) == ("reset_before_commit", None)
    assert post(client, "refund-1").status_code == 201
    assert len(sandbox.operations()) == 1


def test_error_after_commit_commits_and_answers_a_5xx(client, sandbox):
    sandbox.add_fault("error_after_commit", status=502)

    response = post(client, "refund-1")

    assert response.status_code == 502
    assert len(sandbox.operations()) == 1
    assert sandbox.log()[0]["action"] == "commit"
    assert (sandbox.log()[0]["fault"], sandbox.log()[0]["status"]) == ("error_after_commit", 502)
    assert post(client, "refund-1").status_code == 200  # a replay: still one operation
    assert len(sandbox.operations()) == 1


def test_a_slow_rule_lasts_until_its_times_run_out(client, sandbox):
    """``seconds`` of ``slow`` is how slow, not how long the rule lasts."""
    sandbox.add_fault("slow", times=1, seconds=0.2)
    time.sleep(0.3)
    started = time.monotonic()
    assert post(client, "refund-1").status_code == 201
    assert time.monotonic() - started >= 0.2
    assert sandbox.log()[0]["fault"] == "slow"


def test_throttle_is_429_with_retry_after_and_commits_nothing(client, sandbox):
    sandbox.add_fault("throttle", retry_after=2)

    response = post(client, "refund-1")

    assert response.status_code == 429
    assert response.headers["Retry-After"] == "2"
    assert sandbox.operations() == []
    assert post(client, "refund-1").status_code == 201


def test_lookup_unavailable_answers_503_until_its_window_lapses(client, control, sandbox):
    post(client, "refund-1")
    control.post(
        "/_faults",
        json={"fault": "lookup_unavailable", "times": None, "window": 0.5, "retry_after": 1},
    )

    for _ in range(2):
        refused = client.get("/operations", params={"idempotency_key": "refund-1"})
        assert refused.status_code == 503
        assert refused.headers["Retry-After"] == "1"
    assert post(client, "refund-2").status_code == 201  # sends are not lookups
    time.sleep(0.6)
    assert client.get("/operations", params={"idempotency_key": "refund-1"}).status_code == 200
    assert sandbox.faults() == []
