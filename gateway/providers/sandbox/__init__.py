"""The bundled sandbox provider: a fake external provider that speaks SPEC §6.

It stands in for the payment, inventory, shipping, deployment, ticketing and mail APIs in
``make demo`` and in every integration test, and its operation log is the oracle for
exactly-once: a test compares what the sandbox committed with what the gateway's ledger
says happened. So every request is decided and logged under one lock, and a fault never
commits "a bit": an operation is either in the log once or not at all.

Standard library only (plus the digest helper), no Django: the module runs without
settings, in-process (:class:`SandboxServer` on port 0) or as
``manage.py run_sandbox_provider``. With a data file it keeps its operations, log and
resource versions in an append-only JSON Lines journal, replayed on start and compacted
(:mod:`gateway.providers.sandbox.journal`); requests never read the file.

Routes (``{p}`` is an optional single path segment naming the provider, ``default`` when
absent; the gateway gives each provider its own base URL such as ``http://host:port/billing``):

- ``POST /{p}/operations``, ``GET /{p}/operations?idempotency_key=K``,
  ``GET /{p}/operations/{id}``: the provider protocol.
- ``/_health``, ``/_faults`` (GET, POST, DELETE), ``/_resources`` (GET, POST),
  ``/_operations``, ``/_log``, ``POST /_reset``: test controls. They also answer under a
  provider prefix (SPEC says ``{base}/_faults``); there the prefix is the default
  ``provider`` of a new fault or resource version and filters ``_operations`` and
  ``_log``. Listing, clearing faults and reset stay global.

Fault semantics, decided here where the contract is silent:

- Faults only match well-formed protocol requests (a 400 never consumes a rule). Each rule
  has ``times`` (``None``: until cleared) and optional ``type``/``provider`` filters; the
  oldest matching rule of each fault name applies, and ``times`` counts the requests it
  actually changed.
- ``fail_before_commit`` is decided first: 503 and nothing else happens for that request.
- ``commit_then_drop`` and ``slow`` are transport faults: they apply to every POST
  (a new commit, a replay or a refusal) after it has been decided and logged.
- ``processing``, ``digest_mismatch``, ``fail`` and ``reject`` shape a *new* operation, so
  they only apply to a request that would commit (a new key whose version check passed);
  ``reject`` then answers its 4xx instead of committing.
- ``lookup_unreachable`` applies to ``GET`` lookups, by key or id; its ``type`` filter
  matches the type of the operation looked up.
- ``reset_before_commit`` (the connection aborted, a TCP reset) and ``throttle`` (``429`` with
  ``Retry-After``) turn a POST away before anything is committed, like
  ``fail_before_commit``; ``error_after_commit`` commits a new operation and answers a 5xx
  instead of it.
- ``lookup_unavailable`` answers lookups with a 5xx (``status``, 503 by default, with
  ``Retry-After`` when ``retry_after`` is set); with ``window`` (seconds) it lapses that long
  after it was added (``times`` null: every lookup meanwhile).
- ``key_expired`` applies to lookups by key only: they answer 404 as a provider does once
  its key retention has passed, while the operation is still there (by id, and in
  ``/_operations``).
- A ``processing`` operation answers ``processing`` to its next ``lookups`` lookups and
  ``then`` (``succeeded``, the default, or ``failed``) from the one after; replays and
  ``/_operations`` do not count as lookups.
"""

from gateway.providers.sandbox.provider import (
    DEFAULT_PROVIDER,
    FAILED,
    FAULTS,
    PROCESSING,
    SUCCEEDED,
    BadRequest,
    Reply,
    SandboxProvider,
    parse_json,
)
from gateway.providers.sandbox.server import SandboxServer

__all__ = [
    "DEFAULT_PROVIDER",
    "FAILED",
    "FAULTS",
    "PROCESSING",
    "SUCCEEDED",
    "BadRequest",
    "Reply",
    "SandboxProvider",
    "SandboxServer",
    "parse_json",
]
