"""The fault matrix, as data: each case names a fault, how it is produced, what the adapter
must answer, what lookups must prove, the outcome the gateway reaches, and how many
operations the provider may hold (the provider's own records are the oracle).

The outcome the gateway reaches is the one its rules give for the adapter's answers: a
CONFIRMED or REJECTED answer is recorded; NOT_STARTED is sent again with the same key;
IN_PROGRESS and UNKNOWN are looked up by key, and the lookup decides (a found operation is
classified by ``classify_operation``; "not found" means not started only within the key
retention, ``not_found_proves_not_started``); a mismatch is never sent again nor confirmed.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gateway.choices import Outcome


class Fault(StrEnum):
    """What goes wrong. A driver produces it on the server itself when it can; the fault
    proxy (``conformance.proxy``) produces the ones marked "proxy" in front of any server."""

    REFUSE = "refuse"  # proxy: nothing listens
    # server or proxy: reads the request, resets unanswered, stores (or forwards) nothing
    RESET_BEFORE_COMMIT = "reset_before_commit"
    DROP_AFTER_COMMIT = "drop_after_commit"  # server or proxy: commits, then no answer
    ERROR_AFTER_COMMIT = "error_after_commit"  # server (500) or proxy (502): commits, then 5xx
    SLOW = "slow"  # server or proxy: commits, answers after the client's timeout
    CONFLICT = "conflict"  # server (a stale resource version) or proxy: 409
    KEY_REUSED = "key_reused"  # any server: the key is sent again with another body
    RATE_LIMITED = "rate_limited"  # server or proxy: 429 with Retry-After, nothing stored
    PROCESSING_THEN_SUCCEEDED = "processing_then_succeeded"  # server only
    PROCESSING_THEN_FAILED = "processing_then_failed"  # server only
    KEY_EXPIRED = "key_expired"  # server: lookups by key find nothing, the operation stays


class Decision(StrEnum):
    """Where the gateway ends up with one effect after the adapter's answers."""

    CONFIRMED = "confirmed"
    REJECTED = "rejected"
    SEND_AGAIN = "send_again"  # NOT_STARTED: sent again with the same key, then confirmed
    TO_A_HUMAN = "to_a_human"  # nothing proves what happened: never sent again


@dataclass(frozen=True)
class Case:
    name: str
    title: str
    # Made before the call; KEY_EXPIRED acts on the lookups after it.
    faults: tuple[Fault, ...]
    produced_by: str
    # The outcomes ``execute`` may classify the faulty call as.
    execute: frozenset[Outcome]
    # What the gateway reaches after its lookups (and a second send when NOT_STARTED).
    reaches: Decision
    # Operations the provider holds for the key right after the faulty call, and at the end.
    held_after_call: int
    held_at_end: int
    # The adapter must say the provider holds the key for something else.
    mismatch: bool = False
    # The adapter must report the provider's Retry-After (seconds).
    retry_after: float | None = None
    # How old the command is when it is looked up, in key retentions (0: just sent).
    age_in_retentions: float = 0.0
    explanation: str = ""


_ANY_UNCERTAIN = frozenset({Outcome.UNKNOWN})
RETRY_AFTER_SECONDS = 7.0

CASES: tuple[Case, ...] = (
    Case(
        "connection_refused",
        "Connection refused",
        (Fault.REFUSE,),
        "the adapter is pointed at a port where nothing listens",
        frozenset({Outcome.NOT_STARTED}),
        Decision.SEND_AGAIN,
        held_after_call=0,
        held_at_end=1,
        explanation="Nothing was sent: sent again with the same key, which then confirms.",
    ),
    Case(
        "reset_before_commit",
        "Reset before the provider commits",
        (Fault.RESET_BEFORE_COMMIT,),
        "the server reads the whole request, then resets the connection without storing it "
        "(the sandbox's reset_before_commit, or the fault proxy resets without forwarding)",
        _ANY_UNCERTAIN,
        Decision.SEND_AGAIN,
        held_after_call=0,
        held_at_end=1,
        explanation="The request left: UNKNOWN. The lookup by key finds nothing within the "
        "key retention, which proves it was not received: sent again.",
    ),
    Case(
        "drop_after_commit",
        "Connection dropped after the provider commits",
        (Fault.DROP_AFTER_COMMIT,),
        "the server commits and closes without answering (the sandbox's commit_then_drop, "
        "or the fault proxy forwards and drops the answer)",
        _ANY_UNCERTAIN,
        Decision.CONFIRMED,
        held_after_call=1,
        held_at_end=1,
        explanation="UNKNOWN, never NOT_STARTED: the lookup finds the operation.",
    ),
    Case(
        "error_after_commit",
        "5xx after the provider commits",
        (Fault.ERROR_AFTER_COMMIT,),
        "the server commits, then answers 500 instead of the answer (the sandbox's "
        "error_after_commit, or the fault proxy forwards and answers 502)",
        _ANY_UNCERTAIN,
        Decision.CONFIRMED,
        held_after_call=1,
        held_at_end=1,
        explanation="A 5xx proves nothing about the effect: the lookup finds the operation.",
    ),
    Case(
        "timeout",
        "Answer slower than the timeout",
        (Fault.SLOW,),
        "the server commits and answers after the adapter's timeout (the sandbox's slow, or "
        "the fault proxy holds the answer)",
        _ANY_UNCERTAIN,
        Decision.CONFIRMED,
        held_after_call=1,
        held_at_end=1,
        explanation="A read timeout is UNKNOWN, never NOT_STARTED: the lookup finds it.",
    ),
    Case(
        "conflict_409",
        "409 conflict (stale resource version)",
        (Fault.CONFLICT,),
        "the server holds a newer version of the resource than the command names (the "
        "fault proxy answers 409 when the server cannot)",
        frozenset({Outcome.REJECTED}),
        Decision.REJECTED,
        held_after_call=0,
        held_at_end=0,
        explanation="A refusal on the merits: REJECTED, nothing committed, never sent again.",
    ),
    Case(
        "idempotency_mismatch_422",
        "422: the key was used with another body",
        (Fault.KEY_REUSED,),
        "the command is sent, then the same key with another payload",
        _ANY_UNCERTAIN | {Outcome.REJECTED},
        Decision.TO_A_HUMAN,
        held_after_call=1,
        held_at_end=1,
        mismatch=True,
        explanation="Never CONFIRMED, never sent again: the provider holds the key for "
        "something else (mismatch), a human decides.",
    ),
    Case(
        "rate_limited_429",
        "429 with Retry-After",
        (Fault.RATE_LIMITED,),
        f"the server answers 429 with Retry-After: {RETRY_AFTER_SECONDS:g} and stores nothing "
        "(the sandbox's throttle, or the fault proxy answers without forwarding)",
        _ANY_UNCERTAIN | {Outcome.NOT_STARTED},
        Decision.SEND_AGAIN,
        held_after_call=0,
        held_at_end=1,
        retry_after=RETRY_AFTER_SECONDS,
        explanation="Not a refusal: come back later, after the wait the provider asked for, "
        "with the same key.",
    ),
    Case(
        "processing_then_succeeded",
        "Processing, then succeeded",
        (Fault.PROCESSING_THEN_SUCCEEDED,),
        "the server answers processing, then succeeded to a later lookup",
        frozenset({Outcome.IN_PROGRESS}),
        Decision.CONFIRMED,
        held_after_call=1,
        held_at_end=1,
        explanation="IN_PROGRESS until a lookup says done.",
    ),
    Case(
        "processing_then_failed",
        "Processing, then failed",
        (Fault.PROCESSING_THEN_FAILED,),
        "the server answers processing, then failed to a later lookup",
        frozenset({Outcome.IN_PROGRESS}),
        Decision.REJECTED,
        held_after_call=1,
        held_at_end=1,
        explanation="IN_PROGRESS, then REJECTED by the lookup; never sent again.",
    ),
    Case(
        "not_found_within_retention",
        "Not found within the key retention",
        (),
        "a key the provider never received is looked up",
        frozenset(),
        Decision.SEND_AGAIN,
        held_after_call=0,
        held_at_end=1,
        explanation="Not found while the provider keeps keys: never received, sent again.",
    ),
    Case(
        "not_found_after_retention",
        "Not found after the key retention",
        (Fault.DROP_AFTER_COMMIT, Fault.KEY_EXPIRED),
        "the provider commits and the answer is lost; looked up past the key retention, "
        "the provider no longer knows the key (the sandbox's key_expired)",
        _ANY_UNCERTAIN,
        Decision.TO_A_HUMAN,
        held_after_call=1,
        held_at_end=1,
        age_in_retentions=1.5,
        explanation="Not found proves nothing once the key may have expired: never "
        "NOT_STARTED, never sent again (it would execute twice).",
    ),
)

CASES_BY_NAME = {case.name: case for case in CASES}

# The cases that do not apply to an SMTP server (gateway.providers.smtp), and why. The others
# apply: a refused connection; a connection reset after the body left but before the server
# stored it; a connection dropped, a 4xx/5xx answer, or an answer slower than the timeout,
# after the server stored the message; the key (Message-ID) sent again with another body;
# "not found" within and after the archive's retention. The server's own records (what it
# accepted) are the oracle, and the IMAP archive mailbox answers the lookups.
NOT_FOR_MAIL: dict[str, str] = {
    "conflict_409": "SMTP has no resource versions: a server cannot refuse a message as stale",
    "rate_limited_429": "SMTP has no Retry-After: a server that wants the client to come back "
    "answers 4xx before the body (NOT_STARTED, sent again later), with no wait to report",
    "processing_then_succeeded": "SMTP has no 'in progress': once the body's final dot is "
    "answered the message is queued or it is not; delivery is the mail system's business",
    "processing_then_failed": "SMTP has no 'in progress' (see processing_then_succeeded); a "
    "bounce after acceptance is a new message, not a status of the send",
}
