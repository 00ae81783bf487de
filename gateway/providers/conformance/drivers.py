"""The server's side of a conformance run: its own records (the oracle) and the faults it
can make of itself. The faults it cannot make come from the fault proxy (``proxy``).

A team writes a :class:`Driver` for its server: ``operations`` counts what the server
itself stored for an idempotency key (its database, its admin API, its own list endpoint:
never the adapter under test), ``inject`` makes a fault natively or returns False to let the
proxy make it, ``clear`` removes what ``inject`` set up. :class:`RecordsDriver` is the
smallest one (an oracle function, no native faults); :class:`SandboxDriver` drives the
bundled sandbox provider through its test controls (``/_operations``, ``/_faults``,
``/_resources``).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import urlencode, urlsplit, urlunsplit

from gateway.providers.base import ExecuteRequest
from gateway.providers.conformance.matrix import RETRY_AFTER_SECONDS, Fault


class Driver(Protocol):
    def operations(self, idempotency_key: str) -> int:
        """How many operations the server holds for this key, by its own records."""
        ...

    def inject(self, fault: Fault, request: ExecuteRequest, *, timeout: float) -> bool:
        """Make ``fault`` for the next ``request`` (``timeout``: the adapter's). False: the
        server cannot make it; the fault proxy will, if it can."""
        ...

    def clear(self) -> None:
        """Undo every ``inject``."""
        ...


class RecordsDriver:
    """A driver with an oracle only: every fault comes from the proxy."""

    def __init__(self, operations: Callable[[str], int]) -> None:
        self._operations = operations

    def operations(self, idempotency_key: str) -> int:
        return self._operations(idempotency_key)

    def inject(self, fault: Fault, request: ExecuteRequest, *, timeout: float) -> bool:
        return False

    def clear(self) -> None:
        pass


# The sandbox's own fault (POST {base}/_faults) for each fault of the matrix whose case it
# makes exactly: the adapter meets the server's reset, 5xx or 429, not a proxy's. With this
# driver the fault proxy makes one fault only, a refused connection (nothing listens).
_SANDBOX_FAULTS: dict[Fault, dict[str, Any]] = {
    # Reads the whole request, stores nothing, aborts the connection (TCP RST) unanswered.
    Fault.RESET_BEFORE_COMMIT: {"fault": "reset_before_commit"},
    Fault.DROP_AFTER_COMMIT: {"fault": "commit_then_drop"},
    # Commits, then answers its own 500 instead of the answer.
    Fault.ERROR_AFTER_COMMIT: {"fault": "error_after_commit"},
    # 429 with the case's Retry-After (whole seconds, as the sandbox takes it), not stored.
    Fault.RATE_LIMITED: {"fault": "throttle", "retry_after": int(RETRY_AFTER_SECONDS)},
    Fault.PROCESSING_THEN_SUCCEEDED: {"fault": "processing", "lookups": 2},
    Fault.PROCESSING_THEN_FAILED: {"fault": "processing", "lookups": 2, "then": "failed"},
    Fault.KEY_EXPIRED: {"fault": "key_expired", "times": None},
}


class SandboxDriver:
    """The bundled sandbox provider (``gateway.providers.sandbox``), over HTTP: in this
    process or a child process alike. ``base_url`` is the provider's (``.../tickets``)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        parts = urlsplit(self.base_url)
        self.server_url = urlunsplit((parts.scheme, parts.netloc, "", "", ""))
        # The test controls never go through a proxy of the environment.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def operations(self, idempotency_key: str) -> int:
        query = urlencode({"idempotency_key": idempotency_key})
        answer = self._call("GET", f"{self.base_url}/_operations?{query}")
        return len(answer["operations"])

    def inject(self, fault: Fault, request: ExecuteRequest, *, timeout: float) -> bool:
        if fault == Fault.SLOW:
            spec: dict[str, Any] = {"fault": "slow", "seconds": timeout + 1.5}
        elif fault == Fault.CONFLICT:
            resource = request.resource
            if "version" not in resource:
                raise ValueError("a conflict needs a command whose resource has a version")
            self._call(
                "POST",
                f"{self.base_url}/_resources",
                {
                    "type": resource["type"],
                    "id": resource["id"],
                    "version": f"newer-than-{resource['version']}",
                },
            )
            return True
        elif fault in _SANDBOX_FAULTS:
            spec = dict(_SANDBOX_FAULTS[fault])
        else:
            return False
        self._call("POST", f"{self.base_url}/_faults", {"type": request.type, **spec})
        return True

    def clear(self) -> None:
        self._call("DELETE", f"{self.server_url}/_faults")

    def healthy(self) -> bool:
        try:
            return self._call("GET", f"{self.server_url}/_health").get("ok") is True
        except (OSError, ValueError):
            return False

    def _call(self, method: str, url: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        with self._opener.open(request, timeout=10) as answer:
            return json.loads(answer.read())
