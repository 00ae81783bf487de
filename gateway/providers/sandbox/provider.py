"""The sandbox provider's state and rules, without HTTP (see the package's docstring)."""

from __future__ import annotations

import copy
import gc
import json
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.lib.digest import payload_digest
from gateway.lib.ids import new_id
from gateway.providers.sandbox.journal import Journal

DEFAULT_PROVIDER = "default"

SUCCEEDED = "succeeded"
PROCESSING = "processing"
FAILED = "failed"

# Fault name -> the parameters it accepts (with their defaults). Unknown names or parameters
# are refused loudly: a typo in a test's fault set-up must not silently test nothing.
FAULT_PARAMS: dict[str, dict[str, Any]] = {
    "commit_then_drop": {},
    "fail_before_commit": {},
    "slow": {"seconds": 15.0},
    "processing": {"lookups": 2, "then": "succeeded"},
    "digest_mismatch": {"digest": None},
    "lookup_unreachable": {},
    "lookup_unavailable": {"status": 503, "window": None, "retry_after": None},
    "key_expired": {},
    "reset_before_commit": {},
    "error_after_commit": {"status": 500},
    "throttle": {"retry_after": 1},
    "reject": {"status": 400, "error": "business_rejected", "retry_after": None},
    "fail": {"error": "operation_failed"},
}
FAULTS = frozenset(FAULT_PARAMS)
_LOOKUP_FAULTS = frozenset({"lookup_unreachable", "lookup_unavailable", "key_expired"})
_MISMATCHED_DIGEST = "sha256:" + "f" * 64

# The data file is compacted once its superseded lines outnumber its live ones (one per
# operation, log entry and resource version) and number at least this many: it stays under
# twice the live state, and small files are never rewritten.
COMPACT_MIN_DEAD_LINES = 1000


class BadRequest(ValueError):
    """A request (or a fault set-up) the sandbox refuses with ``400 bad_request``."""


@dataclass(frozen=True)
class Reply:
    """What the HTTP layer must do for one request, decided under the provider's lock."""

    status: int
    body: dict[str, Any] | None
    drop: bool = False  # close the connection without sending a byte
    reset: bool = False  # abort the connection (TCP RST) without sending a byte
    delay: float = 0.0  # seconds to wait before answering
    headers: dict[str, str] = field(default_factory=dict)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _reject_constant(name: str) -> Any:
    raise BadRequest(f"{name} is not JSON")


def parse_json(raw: bytes) -> Any:
    """Strict JSON: UTF-8, no NaN/Infinity (they have no canonical form)."""
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"malformed JSON: {exc}") from exc


def _short(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


def _result_for(type: str, resource: dict[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
    """A small, realistic provider result for each shipped effect type."""
    rid = resource.get("id")
    get = payload.get
    if type == "billing.charge.create":
        return {
            "charge_id": _short("ch"),
            "amount": get("amount"),
            "currency": get("currency"),
            "state": "captured",
        }
    if type == "billing.refund.create":
        return {
            "refund_id": _short("re"),
            "charge_id": get("charge_id"),
            "amount": get("amount"),
            "currency": get("currency"),
            "state": "accepted",
        }
    if type == "inventory.reservation.create":
        return {
            "reservation_id": _short("rsv"),
            "items": get("items", [{"sku": get("sku"), "quantity": get("quantity")}]),
            "state": "reserved",
        }
    if type == "inventory.reservation.release":
        return {"reservation_id": get("reservation_id", rid), "state": "released"}
    if type == "shipment.create":
        return {
            "shipment_id": _short("shp"),
            "carrier": get("carrier", "sandbox-post"),
            "tracking_number": "SBX" + secrets.token_hex(6).upper(),
            "state": "label_created",
        }
    if type == "shipment.cancel":
        return {"shipment_id": get("shipment_id", rid), "state": "cancelled"}
    if type == "deployment.release.promote":
        return {
            "deployment_id": _short("dep"),
            "environment": get("environment"),
            "revision": get("revision"),
            "previous_revision": get("expected_revision"),
            "state": "live",
        }
    if type == "deployment.release.rollback":
        return {
            "deployment_id": _short("dep"),
            "environment": get("environment"),
            "revision": get("revision", get("to_revision")),
            "state": "rolled_back",
        }
    if type == "ticket.create":
        number = secrets.randbelow(90000) + 10000
        return {
            "ticket_id": f"TCK-{number}",
            "url": f"https://tickets.sandbox.invalid/TCK-{number}",
            "state": "open",
        }
    if type == "ticket.close":
        return {"ticket_id": get("ticket_id", rid), "state": "closed"}
    if type == "email.message.send":
        return {"message_id": f"<{secrets.token_hex(12)}@sandbox.invalid>", "state": "sent"}
    if type == "sandbox.verify":
        return {"verified": True, "checks": get("checks", ["health"]), "target": rid}
    return {"reference": _short("ref"), "state": "accepted"}


def _public(op: dict[str, Any]) -> dict[str, Any]:
    """The operation as the protocol returns it (no provider-internal fields)."""
    keys = (
        "id",
        "status",
        "payload_digest",
        "result",
        "idempotency_key",
        "type",
        "resource",
        "created_at",
    )
    return {k: copy.deepcopy(op[k]) for k in keys}


def _oracle(op: dict[str, Any]) -> dict[str, Any]:
    """The operation as tests see it: the public view plus provider, payload, sent digest."""
    view = _public(op)
    view["provider"] = op["provider"]
    view["payload"] = copy.deepcopy(op["payload"])
    view["sent_payload_digest"] = op["sent_payload_digest"]
    return view


class SandboxProvider:
    """All sandbox state and logic, thread-safe, without HTTP.

    One lock guards everything: a request is validated, matched against faults, decided,
    committed, logged and persisted while holding it, so twenty threads racing on one key
    see exactly one commit and nineteen replays, in a log whose order is the commit order.

    With a ``data_file``, every change (a new operation, a status change, a log entry, a
    resource version) is also a line appended to that JSON Lines journal before the lock is
    released (see :mod:`gateway.providers.sandbox.journal`); a new provider on the same file
    replays it. Lookups only read the in-memory indexes. Fault rules live in memory only: a
    restarted sandbox starts without faults.
    """

    def __init__(self, data_file: Path | str | None = None) -> None:
        self._lock = threading.Lock()
        self._ops: list[dict[str, Any]] = []
        self._by_key: dict[tuple[str, str], dict[str, Any]] = {}
        self._by_id: dict[str, dict[str, Any]] = {}
        # idempotency key -> its operations at every provider, for operations(idempotency_key=)
        self._by_bare_key: dict[str, list[dict[str, Any]]] = {}
        self._log: list[dict[str, Any]] = []
        self._faults: list[dict[str, Any]] = []
        self._fault_seq = 0
        # (provider or None, resource type, resource id) -> current version; None = any provider.
        self._resources: dict[tuple[str | None, str, str], Any] = {}
        self._journal = Journal(Path(data_file)) if data_file is not None else None
        self._pending: list[str] = []  # this request's changes, serialized, not yet appended
        if self._journal is not None:
            self._load(self._journal)

    # -- reads ---------------------------------------------------------------------------

    def operations(
        self,
        *,
        provider: str | None = None,
        idempotency_key: str | None = None,
        type: str | None = None,
    ) -> list[dict[str, Any]]:
        """Committed operations in commit order (copies), each with its provider and payload."""
        with self._lock:
            ops = (
                self._ops if idempotency_key is None else self._by_bare_key.get(idempotency_key, [])
            )
            return [
                _oracle(op)
                for op in ops
                if (provider is None or op["provider"] == provider)
                and (type is None or op["type"] == type)
            ]

    def log(self, *, provider: str | None = None) -> list[dict[str, Any]]:
        """Every protocol request handled, in order (copies)."""
        with self._lock:
            return [
                dict(entry)
                for entry in self._log
                if provider is None or entry["provider"] == provider
            ]

    def faults(self) -> list[dict[str, Any]]:
        """The active fault rules, oldest first (copies)."""
        with self._lock:
            return copy.deepcopy(self._faults)

    def resources(self) -> list[dict[str, Any]]:
        """The resource versions set with :meth:`set_resource_version`."""
        with self._lock:
            return [
                {"provider": p, "type": t, "id": i, "version": v}
                for (p, t, i), v in self._resources.items()
            ]

    # -- controls ------------------------------------------------------------------------

    def add_fault(
        self,
        fault: str,
        /,
        *,
        times: int | None = 1,
        type: str | None = None,
        provider: str | None = None,
        **params: Any,
    ) -> dict[str, Any]:
        """Add a fault rule; raises :class:`BadRequest` for an unknown fault or parameter."""
        if fault not in FAULTS:
            raise BadRequest(f"unknown fault {fault!r}; known: {', '.join(sorted(FAULTS))}")
        if times is not None and (isinstance(times, bool) or not isinstance(times, int)):
            raise BadRequest("times must be a positive integer or null")
        if times is not None and times < 1:
            raise BadRequest("times must be a positive integer or null")
        for name, value in (("type", type), ("provider", provider)):
            if value is not None and not isinstance(value, str):
                raise BadRequest(f"{name} must be a string or null")
        unknown = set(params) - set(FAULT_PARAMS[fault])
        if unknown:
            raise BadRequest(f"fault {fault!r} takes no parameter {', '.join(sorted(unknown))}")
        merged = {**FAULT_PARAMS[fault], **params}
        _check_params(fault, merged)
        with self._lock:
            self._fault_seq += 1
            rule = {
                "id": self._fault_seq,
                "fault": fault,
                "times": times,
                "type": type,
                "provider": provider,
                "params": merged,
                "applied": 0,
                # A rule with a ``window`` (lookup_unavailable) lasts that long, then lapses.
                "until": (
                    time.monotonic() + float(merged["window"])
                    if merged.get("window") is not None
                    else None
                ),
            }
            self._faults.append(rule)
            return copy.deepcopy(rule)

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def set_resource_version(
        self, *, provider: str | None, type: str, id: str | int, version: Any
    ) -> None:
        """Make ``version`` the current one; ``provider=None`` means for every provider."""
        if not isinstance(type, str) or not type or id is None or version is None:
            raise BadRequest("type, id and version are required")
        resource = {"kind": "resource", "provider": provider, "type": type, "id": str(id)}
        with self._lock:
            self._change({**resource, "version": version})
            self._persist()

    def reset(self) -> None:
        """Forget operations, log, faults and resource versions (the data file too)."""
        with self._lock:
            self._ops.clear()
            self._by_key.clear()
            self._by_id.clear()
            self._by_bare_key.clear()
            self._log.clear()
            self._faults.clear()
            self._resources.clear()
            self._pending.clear()
            if self._journal is not None:
                self._journal.rewrite([])

    def compact(self) -> None:
        """Rewrite the data file with one line per live object (also done automatically)."""
        with self._lock:
            self._compact()

    def close(self) -> None:
        """Close the data file; a later change reopens it."""
        with self._lock:
            self._persist()
            if self._journal is not None:
                self._journal.close()

    # -- the protocol --------------------------------------------------------------------

    def handle_create(self, *, provider: str, idempotency_key: str | None, body: bytes) -> Reply:
        """``POST /{provider}/operations``."""
        if not idempotency_key:
            with self._lock:
                self._append_log(provider, "bad_request", status=400)
                self._persist()
            return Reply(400, {"error": "missing_idempotency_key"})
        try:
            request = _parse_operation(body)
        except BadRequest as exc:
            with self._lock:
                self._append_log(provider, "bad_request", key=idempotency_key, status=400)
                self._persist()
            return Reply(400, {"error": "bad_request", "detail": str(exc)})

        type_, body_digest = request["type"], request["body_digest"]
        with self._lock:
            faults = self._matching_faults(provider, type_, lookup=False)
            applied: list[str] = []

            if "fail_before_commit" in faults:
                self._consume(faults["fail_before_commit"], applied)
                self._append_log(
                    provider, "fault", key=idempotency_key, type=type_, faults=applied, status=503
                )
                self._persist()
                return Reply(503, {"error": "unavailable"})
            if before := self._before_commit(provider, idempotency_key, type_, faults):
                return before

            existing = self._by_key.get((provider, idempotency_key))
            op_id: str | None = None
            headers: dict[str, str] = {}
            if existing is not None:
                op_id = existing["id"]
                if existing["body_digest"] == body_digest:
                    action, status = "replay", 200
                    answer: dict[str, Any] = _public(existing)
                    headers["Idempotent-Replayed"] = "true"
                else:
                    action, status = "key_reused", 422
                    answer = {"error": "idempotency_key_reused", "operation_id": op_id}
            elif (current := self._conflicting_version(provider, request["resource"])) is not None:
                action, status = "conflict", 409
                answer = {"error": "version_conflict", "current_version": current}
            elif "reject" in faults:
                params = self._consume(faults["reject"], applied)
                action, status = "reject", int(params["status"])
                answer = {"error": params["error"]}
                if params["retry_after"] is not None:  # a 429 or 409 that says when to come back
                    headers["Retry-After"] = f"{params['retry_after']:g}"
            else:
                op = self._commit(
                    provider=provider,
                    idempotency_key=idempotency_key,
                    request=request,
                    faults=faults,
                    applied=applied,
                )
                op_id, action, status = op["id"], "commit", 201
                answer = _public(op)

            drop, delay, error = self._after_commit(faults, applied, committed=action == "commit")
            if error is not None:
                status, answer, headers = error, {"error": "internal_error"}, {}
            self._append_log(
                provider,
                action,
                key=idempotency_key,
                op_id=op_id,
                type=type_,
                faults=applied,
                status=None if drop else status,
            )
            self._persist()
        return Reply(status, answer, drop=drop, delay=delay, headers=headers)

    def _after_commit(
        self, faults: dict[str, Any], applied: list[str], *, committed: bool
    ) -> tuple[bool, float, int | None]:
        """What happens to the answer once the write is decided: (drop it, delay it, the 5xx
        that replaces it)."""
        if "commit_then_drop" in faults:
            self._consume(faults["commit_then_drop"], applied)
            return True, 0.0, None
        if "error_after_commit" in faults and committed:
            return False, 0.0, int(self._consume(faults["error_after_commit"], applied)["status"])
        if "slow" in faults:
            return False, float(self._consume(faults["slow"], applied)["seconds"]), None
        return False, 0.0, None

    def handle_lookup(
        self,
        *,
        provider: str,
        idempotency_key: str | None = None,
        operation_id: str | None = None,
    ) -> Reply:
        """``GET /{provider}/operations?idempotency_key=K`` or ``.../operations/{id}``."""
        if not idempotency_key and not operation_id:
            with self._lock:
                self._append_log(provider, "bad_request", status=400)
                self._persist()
            return Reply(
                400, {"error": "bad_request", "detail": "idempotency_key query parameter required"}
            )
        with self._lock:
            if operation_id:
                op = self._by_id.get(operation_id)
                if op is not None and op["provider"] != provider:
                    op = None  # another provider's operation does not exist here
            else:
                op = self._by_key.get((provider, str(idempotency_key)))
            key = op["idempotency_key"] if op is not None else idempotency_key
            op_type = op["type"] if op is not None else None
            faults = self._matching_faults(provider, op_type, lookup=True)
            applied: list[str] = []
            op_ref = op["id"] if op is not None else operation_id
            if refused := self._lookup_refused(provider, key, op_ref, op_type, faults, applied):
                return refused
            if "key_expired" in faults and not operation_id:
                # Past its key retention a provider forgets the key, not the operation.
                self._consume(faults["key_expired"], applied)
                op = None
            if op is None:
                self._append_log(
                    provider,
                    "lookup_miss",
                    key=key,
                    op_id=operation_id,
                    faults=applied,
                    status=404,
                )
                self._persist()
                return Reply(404, {"error": "not_found"})
            if op["status"] == PROCESSING:
                remaining = op["lookups_remaining"]
                status = PROCESSING if remaining > 0 else op.get("then", SUCCEEDED)
                change: dict[str, Any] = {
                    "kind": "status",
                    "id": op["id"],
                    "status": status,
                    "lookups_remaining": max(remaining - 1, 0),
                }
                if status == FAILED:
                    change["result"] = {
                        "error": "operation_failed",
                        "detail": "the operation failed at the provider",
                    }
                self._change(change)
            self._append_log(provider, "lookup", key=key, op_id=op["id"], type=op_type, status=200)
            self._persist()
            return Reply(200, _public(op))

    # -- internals (call with the lock held) ---------------------------------------------

    def _lookup_refused(
        self,
        provider: str,
        key: str | None,
        op_id: str | None,
        op_type: str | None,
        faults: dict[str, dict[str, Any]],
        applied: list[str],
    ) -> Reply | None:
        """The faults that leave a lookup unanswered: the connection dropped
        (``lookup_unreachable``) or a 5xx (``lookup_unavailable``)."""
        if "lookup_unreachable" in faults:
            self._consume(faults["lookup_unreachable"], applied)
            self._append_log(
                provider, "fault", key=key, op_id=op_id, type=op_type, faults=applied, status=None
            )
            self._persist()
            return Reply(0, None, drop=True)
        if "lookup_unavailable" in faults:
            params = self._consume(faults["lookup_unavailable"], applied)
            status = int(params["status"])
            self._append_log(
                provider, "fault", key=key, op_id=op_id, type=op_type, faults=applied, status=status
            )
            self._persist()
            retry = params["retry_after"]
            headers = {"Retry-After": str(retry)} if retry is not None else {}
            return Reply(status, {"error": "unavailable"}, headers=headers)
        return None

    def _before_commit(
        self, provider: str, key: str, type_: str, faults: dict[str, dict[str, Any]]
    ) -> Reply | None:
        """The faults that turn a POST away before anything is committed: a connection reset
        (``reset_before_commit``) or a 429 with ``Retry-After`` (``throttle``)."""
        applied: list[str] = []
        if "reset_before_commit" in faults:
            self._consume(faults["reset_before_commit"], applied)
            self._append_log(provider, "fault", key=key, type=type_, faults=applied, status=None)
            self._persist()
            return Reply(0, None, reset=True)
        if "throttle" in faults:
            retry = self._consume(faults["throttle"], applied)["retry_after"]
            self._append_log(provider, "fault", key=key, type=type_, faults=applied, status=429)
            self._persist()
            return Reply(429, {"error": "rate_limited"}, headers={"Retry-After": str(retry)})
        return None

    def _commit(
        self,
        *,
        provider: str,
        idempotency_key: str,
        request: dict[str, Any],
        faults: dict[str, dict[str, Any]],
        applied: list[str],
    ) -> dict[str, Any]:
        type_, resource, payload = request["type"], request["resource"], request["payload"]
        status, lookups_remaining, then = SUCCEEDED, 0, SUCCEEDED
        result = _result_for(type_, resource, payload)
        recorded_digest = request["payload_digest"]
        if "fail" in faults:
            params = self._consume(faults["fail"], applied)
            status = FAILED
            result = {"error": params["error"], "detail": "the operation failed at the provider"}
        elif "processing" in faults:
            params = self._consume(faults["processing"], applied)
            status, lookups_remaining = PROCESSING, int(params["lookups"])
            then = params["then"]
        if "digest_mismatch" in faults:
            params = self._consume(faults["digest_mismatch"], applied)
            recorded_digest = params["digest"] or _MISMATCHED_DIGEST
            if recorded_digest == request["payload_digest"]:
                recorded_digest = "sha256:" + "0" * 64
        op = {
            "kind": "operation",
            "id": new_id("op"),
            "status": status,
            "payload_digest": recorded_digest,
            "result": result,
            "idempotency_key": idempotency_key,
            "type": type_,
            "resource": resource,
            "created_at": _now(),
            "provider": provider,
            "payload": payload,
            "sent_payload_digest": request["payload_digest"],
            "body_digest": request["body_digest"],
            "lookups_remaining": lookups_remaining,
            "then": then,
        }
        self._change(op)
        return op

    def _change(self, record: dict[str, Any]) -> None:
        """Apply one change to the state and queue it for the data file (see _persist)."""
        if self._journal is not None:
            # Serialized first: a value JSON cannot encode raises before the state changes.
            self._pending.append(json.dumps(record))
        self._apply(record)

    def _apply(self, record: dict[str, Any]) -> None:
        """The one definition of each change, for a live request and for a replay alike.

        An operation or log record becomes the stored object itself (its ``kind`` removed):
        the caller hands it over, which keeps a replay of 100 k operations to one dict each.
        """
        kind = record.pop("kind")
        if kind == "operation":
            op = record
            self._ops.append(op)
            self._by_key[(op["provider"], op["idempotency_key"])] = op
            self._by_id[op["id"]] = op
            self._by_bare_key.setdefault(op["idempotency_key"], []).append(op)
        elif kind == "status":
            op = self._by_id[record["id"]]
            op["status"] = record["status"]
            op["lookups_remaining"] = record["lookups_remaining"]
            if "result" in record:  # processing that ended failed
                op["result"] = record["result"]
        elif kind == "log":
            self._log.append(record)
        elif kind == "resource":
            self._resources[(record["provider"], record["type"], record["id"])] = record["version"]
        else:
            raise ValueError(f"unknown change kind {kind!r}")

    def _conflicting_version(self, provider: str, resource: dict[str, Any]) -> Any:
        """The known current version when the request names another one, else None.

        A version set for this provider wins over one set for every provider (``None``).
        """
        if "version" not in resource or "type" not in resource or "id" not in resource:
            return None
        for scope in (provider, None):
            current = self._resources.get((scope, str(resource["type"]), str(resource["id"])))
            if current is not None:
                return current if current != resource["version"] else None
        return None

    def _matching_faults(
        self, provider: str, type: str | None, *, lookup: bool
    ) -> dict[str, dict[str, Any]]:
        """The oldest active rule per fault name that matches this request."""
        found: dict[str, dict[str, Any]] = {}
        now = time.monotonic()
        self._faults[:] = [r for r in self._faults if r["until"] is None or r["until"] > now]
        for rule in self._faults:
            if (rule["fault"] in _LOOKUP_FAULTS) != lookup or rule["fault"] in found:
                continue
            if rule["provider"] is not None and rule["provider"] != provider:
                continue
            if rule["type"] is not None and rule["type"] != type:
                continue
            found[rule["fault"]] = rule
        return found

    def _consume(self, rule: dict[str, Any], applied: list[str]) -> dict[str, Any]:
        """Count one application of ``rule``; it disappears when its ``times`` run out."""
        rule["applied"] += 1
        applied.append(rule["fault"])
        if rule["times"] is not None:
            rule["times"] -= 1
            if rule["times"] <= 0:
                self._faults.remove(rule)
        return dict(rule["params"])

    def _append_log(
        self,
        provider: str,
        action: str,
        *,
        key: str | None = None,
        op_id: str | None = None,
        type: str | None = None,
        faults: list[str] | None = None,
        status: int | None,
    ) -> None:
        self._change(
            {
                "kind": "log",
                "seq": (self._log[-1]["seq"] + 1) if self._log else 1,
                "at": _now(),
                "provider": provider,
                "action": action,
                "idempotency_key": key,
                "operation_id": op_id,
                "type": type,
                "fault": "+".join(faults) if faults else None,
                "status": status,
            }
        )

    def _persist(self) -> None:
        """Append this request's changes to the data file in one flushed write.

        Called before the lock is released, so the file's order is the commit order; when
        superseded lines outnumber live ones (past a floor), the file is compacted.
        """
        if self._journal is None:
            return
        if self._pending:
            self._journal.append(self._pending)
            self._pending = []
        live = self._live_lines()
        if self._journal.lines - live > max(live, COMPACT_MIN_DEAD_LINES):
            self._compact()

    def _live_lines(self) -> int:
        return 1 + len(self._ops) + len(self._log) + len(self._resources)

    def _compact(self) -> None:
        if self._journal is None:
            return
        self._pending.clear()  # the snapshot below already holds every applied change
        self._journal.rewrite(self._snapshot())

    def _snapshot(self) -> Iterator[dict[str, Any]]:
        """The live state as changes: one line per operation, log entry, resource version."""
        for op in self._ops:
            yield {"kind": "operation", **op}
        for entry in self._log:
            yield {"kind": "log", **entry}
        for (provider, type_, id_), version in self._resources.items():
            resource = {"provider": provider, "type": type_, "id": id_, "version": version}
            yield {"kind": "resource", **resource}

    def _load(self, journal: Journal) -> None:
        """Replay the data file; rewrite it when it is new, empty or of the earlier format."""
        # A replay allocates a few dicts per line and frees none: the cyclic collector would
        # scan the growing heap again and again for nothing (40% of a 100 k replay).
        collecting = gc.isenabled()
        gc.disable()
        try:
            contents = journal.read()
            for line, record in contents.records:
                try:
                    self._apply(record)
                except (KeyError, TypeError, ValueError) as exc:
                    raise ValueError(f"{journal.path}:{line}: bad change ({exc!r})") from exc
        finally:
            if collecting:
                gc.enable()
        if contents.rewrite:
            journal.rewrite(self._snapshot())


def _check_params(fault: str, params: dict[str, Any]) -> None:
    def number(name: str, *, integer: bool = False) -> None:
        value = params[name]
        kinds = (int,) if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds) or value < 0:
            raise BadRequest(f"{fault}.{name} must be a non-negative number")

    if fault == "slow":
        number("seconds")
    elif fault == "processing":
        number("lookups", integer=True)
        if params["then"] not in (SUCCEEDED, FAILED):
            raise BadRequest("processing.then must be succeeded or failed")
    elif fault == "reject":
        status = params["status"]
        if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 499:
            raise BadRequest("reject.status must be a 4xx status code")
        if not isinstance(params["error"], str):
            raise BadRequest("reject.error must be a string")
        if params["retry_after"] is not None:
            number("retry_after")
    elif fault in ("error_after_commit", "lookup_unavailable"):
        status = params["status"]
        if isinstance(status, bool) or not isinstance(status, int) or not 500 <= status <= 599:
            raise BadRequest(f"{fault}.status must be a 5xx status code")
        for name in ("window", "retry_after"):
            if params.get(name) is not None:
                number(name)
    elif fault == "throttle":
        number("retry_after", integer=True)
    elif fault == "fail":
        if not isinstance(params["error"], str):
            raise BadRequest("fail.error must be a string")
    elif fault == "digest_mismatch":
        digest = params["digest"]
        if digest is not None and not isinstance(digest, str):
            raise BadRequest("digest_mismatch.digest must be a string")


def _parse_operation(body: bytes) -> dict[str, Any]:
    data = parse_json(body)
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    missing = [k for k in ("type", "resource", "payload", "payload_digest") if k not in data]
    if missing:
        raise BadRequest(f"missing fields: {', '.join(missing)}")
    if not isinstance(data["type"], str) or not data["type"]:
        raise BadRequest("type must be a non-empty string")
    if not isinstance(data["resource"], dict):
        raise BadRequest("resource must be an object")
    if not isinstance(data["payload"], dict):
        raise BadRequest("payload must be an object")
    if not isinstance(data["payload_digest"], str):
        raise BadRequest("payload_digest must be a string")
    try:
        # Replays are recognised by the canonical body, not by the digest the client sent:
        # the sandbox must catch a client whose digest and body disagree.
        body_digest = payload_digest(
            type=data["type"], resource=data["resource"], payload=data["payload"]
        )
    except ValueError as exc:  # rfc8785: numbers outside the JSON-safe domain
        raise BadRequest(str(exc)) from exc
    return {
        "type": data["type"],
        "resource": data["resource"],
        "payload": data["payload"],
        "payload_digest": data["payload_digest"],
        "body_digest": body_digest,
    }
