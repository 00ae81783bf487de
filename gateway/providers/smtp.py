"""The email adapter: ``email.message.send`` over SMTP, with lookups in an IMAP archive mailbox.

Email is irreversible. Once an SMTP server has accepted a message it may be delivered at any
time and nothing can call it back; the contract's compensation is a correction message, sent
by a human's decision, never automatically. So this adapter leans towards sending at most once.

The message. Built with the standard library's ``email`` package: ``From`` the configured
sender, ``To`` the payload's address, the subject and a plain-text body, and three headers that
name the command: ``Message-ID`` = ``<sha256(idempotency key)[:32]@domain>`` (the same key always
names the same message, so a send and a lookup agree on it), ``X-Effect-Id`` and
``X-Payload-Digest``. When an archive address is configured it is added as a blind envelope
recipient (a Bcc: no header names it), so that every message the server accepts is also
delivered to the archive mailbox the lookups search.

What the SMTP server's answers prove (the transcript of commands and replies, without the
message body and without the AUTH exchange, is kept as evidence in every result):

- nothing before ``MAIL FROM`` can queue a message: a failure to connect (refused, DNS,
  connect timeout), a refused greeting, a TLS handshake that fails, a server that does not
  offer the configured STARTTLS, a refused AUTH: NOT_STARTED;
- a 4xx at ``MAIL``, ``RCPT`` or ``DATA`` (before the body): the server turned it away for
  now, NOT_STARTED, sent again later with the same Message-ID; a 5xx there: REJECTED with the
  server's text; a connection lost or a timeout before the body is sent: NOT_STARTED (an
  SMTP server queues a message only after the body's final ``.``);
- once the body has been sent: ``250`` is CONFIRMED (the operation id is the Message-ID, its
  result holds the queue id from the server's answer and the recipients); a lost connection,
  a timeout or a 4xx/5xx answer is UNKNOWN: the server may have queued it anyway.

Lookups. With an IMAP archive configured, the archive mailbox is searched for
``HEADER Message-ID <id>``: a message found is FOUND, ``succeeded`` (the contract completes
at "sent", and the archive holds only what the server accepted), its ``X-Payload-Digest``
checked by the caller like any provider digest. "Not found" is NOT_FOUND only when the search
could have seen the message: the archive receives a copy of every message (the adapter's
Bcc, or the server's own copy when ``server_archives`` says so) and keeps it at least as
long as the contract's key retention (checked when the adapter is built), and the archive
copy has had time to arrive: within ``delivery_grace`` of a body this process sent, "not
found" is UNREACHABLE (a copy still in the mail system's queue is not yet in the mailbox). A
search that cannot run is UNREACHABLE. With no IMAP archive every lookup is UNREACHABLE, with the
Message-ID and the send's transcript as evidence: the reconciler counts each as an
inconclusive lookup and, after the contract's reconcile budget, pauses the effect and
escalates it to a human, who checks the mailbox and decides. Never sent again on its own.

Before sending, an adapter with an archive looks the Message-ID up first: a message already
in the archive is CONFIRMED without a second send, and an archive that cannot be searched
sends nothing (NOT_STARTED, tried again later).
"""

from __future__ import annotations

import contextlib
import hashlib
import imaplib
import os
import re
import smtplib
import ssl
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import timedelta
from email.message import EmailMessage
from email.policy import SMTP
from email.utils import formatdate, parseaddr
from typing import Any
from urllib.parse import urlsplit

from gateway.choices import Outcome
from gateway.contracts import EffectContract
from gateway.providers.base import (
    CallResult,
    ExecuteRequest,
    LookupResult,
    LookupStatus,
    ProviderConfig,
    ProviderOperation,
)
from gateway.providers.http import classify_operation

EMAIL_TYPE = "email.message.send"
_CRLF = b"\r\n"
# CRLF line ends, header lines up to RFC 5322's limit (no folding of the gateway's headers),
# and 7-bit content (non-ASCII text is encoded), which every SMTP server accepts.
SMTP_POLICY = SMTP.clone(max_line_length=998, cte_type="7bit")
_QUEUE_ID = (
    re.compile(r"queued as\s+<?([^\s>]+)>?", re.IGNORECASE),  # Postfix, Sendmail
    re.compile(r"\bid=(\S+)", re.IGNORECASE),  # Exim
)
_TRANSCRIPTS_KEPT = 256
_HEADER_FIELDS = "(MESSAGE-ID X-EFFECT-ID X-PAYLOAD-DIGEST DATE)"


def message_id_for(idempotency_key: str, domain: str) -> str:
    """The Message-ID of the command with this provider key: the same key, the same id."""
    digest = hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]
    return f"<{digest}@{domain}>"


def _address(value: str, what: str) -> str:
    """One bare ASCII mailbox address (``a@b``), or ValueError."""
    _, addr = parseaddr(value)
    if not addr or addr != value.strip() or "@" not in addr or not addr.isascii():
        raise ValueError(f"{what} must be one plain ASCII address (a@example.com), not {value!r}")
    local, _, domain = addr.rpartition("@")
    if not local or not domain or any(c.isspace() or c in "<>,;" for c in addr):
        raise ValueError(f"{what} must be one plain ASCII address (a@example.com), not {value!r}")
    return addr


@dataclass(frozen=True)
class ImapArchive:
    """The IMAP mailbox that receives a copy of every message sent, searched by lookups.

    ``tls`` is ``"ssl"`` (IMAPS, implicit TLS), ``"starttls"`` or ``"none"`` (loopback and tests
    only). ``retention`` is how long the mailbox keeps the copies; ``server_archives`` says the
    SMTP server itself copies every accepted message here, so the adapter needs no Bcc.
    ``delivery_grace`` is how long after this process sent a message's body a "not found"
    is not trusted: the archive copy may still be on its way."""

    host: str
    username: str
    password: str = field(repr=False)
    port: int = 993
    tls: str = "ssl"
    mailbox: str = "INBOX"
    ca_file: str | None = None
    retention: timedelta = timedelta(days=30)
    server_archives: bool = False
    delivery_grace: timedelta = timedelta(minutes=5)

    def __post_init__(self) -> None:
        if not self.host or not self.username or not self.password:
            raise ValueError("the IMAP archive needs a host, a username and a password")
        if self.tls not in ("ssl", "starttls", "none"):
            raise ValueError(f"IMAP tls must be ssl, starttls or none, not {self.tls!r}")
        if not 0 < self.port < 65536:
            raise ValueError(f"IMAP port {self.port} is out of range")
        if '"' in self.mailbox or "\\" in self.mailbox or not self.mailbox:
            raise ValueError(f"IMAP mailbox name {self.mailbox!r} is not supported")


class _RecordingSMTP(smtplib.SMTP):
    """``smtplib.SMTP`` that keeps a transcript of the commands it sends and the replies it
    reads. The AUTH exchange is recorded as ``AUTH <mechanism> [redacted]`` and its
    continuation lines as ``[redacted]``; the message body is never recorded."""

    def __init__(self, *, host: str, timeout: float, local_hostname: str | None) -> None:
        self.transcript: list[str] = []
        self._in_auth = False
        self.body_sent_at: float | None = None
        super().__init__(timeout=timeout, local_hostname=local_hostname)
        # The name STARTTLS checks the certificate against (smtplib sets it only when the
        # constructor connects, and this one connects later, in ``_open``).
        self._host = host

    def putcmd(self, cmd: str, args: str = "") -> None:
        if cmd.upper() == "AUTH":
            self._in_auth = True
            mechanism = args.split(" ", 1)[0]
            self.transcript.append(f"C: AUTH {mechanism} [redacted]")
        elif self._in_auth:
            self.transcript.append("C: [redacted]")
        else:
            self.transcript.append(f"C: {cmd.upper()} {args}".rstrip())
        super().putcmd(cmd, args)

    def getreply(self) -> tuple[int, bytes]:
        try:
            code, message = super().getreply()
        except smtplib.SMTPServerDisconnected:
            self.transcript.append("S: (connection closed)")
            raise
        except OSError as exc:
            self.transcript.append(f"S: (no reply: {type(exc).__name__}: {exc})")
            raise
        if code != 334:
            self._in_auth = False
        text = message.decode("utf-8", "replace").replace("\n", " | ")
        self.transcript.append(f"S: {code} {text}")
        return code, message


class _Stop(Exception):
    """Ends a send with its classified result."""

    def __init__(self, result: CallResult) -> None:
        super().__init__(result.reason)
        self.result = result


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _text(message: bytes | str) -> str:
    return message.decode("utf-8", "replace") if isinstance(message, bytes) else message


def _evidence(transcript: list[str], extra: str = "") -> str:
    lines = "\n".join(transcript)
    return f"{extra}\nSMTP transcript:\n{lines}" if extra else f"SMTP transcript:\n{lines}"


def _body_bytes(message: EmailMessage) -> bytes:
    """The message as DATA content: CRLF line ends, leading dots doubled, the final ``.``."""
    data = message.as_bytes(policy=SMTP_POLICY)
    data = re.sub(rb"(?:\r\n|\n|\r(?!\n))", _CRLF, data)
    data = re.sub(rb"(?m)^\.", b"..", data)
    if not data.endswith(_CRLF):
        data += _CRLF
    return data + b"." + _CRLF


def queue_id_of(answer: str) -> str:
    """The queue id in a server's answer to the end of DATA ("" when it names none)."""
    for pattern in _QUEUE_ID:
        match = pattern.search(answer)
        if match:
            return match.group(1).rstrip(".,;")
    return ""


class SmtpAdapter:
    """Sends ``email.message.send`` through one SMTP submission server, with one credential,
    and looks messages up in an optional IMAP archive mailbox (see the module docstring)."""

    def __init__(
        self,
        *,
        host: str,
        from_address: str,
        port: int = 587,
        starttls: bool = True,
        username: str = "",
        password: str = "",
        ca_file: str | None = None,
        message_id_domain: str = "",
        archive_address: str = "",
        imap: ImapArchive | None = None,
        timeout: float = 10.0,
        local_hostname: str | None = None,
        contract: EffectContract | None = None,
    ) -> None:
        if not host:
            raise ValueError("host is empty: configure the SMTP server")
        if not 0 < port < 65536:
            raise ValueError(f"SMTP port {port} is out of range")
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        if bool(username) != bool(password):
            raise ValueError("SMTP AUTH needs both a username and a password")
        if password and not starttls:
            raise ValueError("SMTP AUTH needs starttls: a password is never sent in clear")
        if contract is not None and contract.type != EMAIL_TYPE:
            raise ValueError(f"the SMTP adapter does not serve {contract.type!r}")
        self.from_address = _address(from_address, "from_address")
        self.archive_address = (
            _address(archive_address, "archive_address") if archive_address else ""
        )
        domain = message_id_domain or self.from_address.rpartition("@")[2]
        if not re.fullmatch(r"[A-Za-z0-9.-]+", domain):
            raise ValueError(f"message_id_domain {domain!r} is not a domain name")
        if imap is not None:
            _check_archive(imap, self.archive_address, contract)
        self.host, self.port, self.starttls = host, port, starttls
        self.message_id_domain = domain
        self.imap = imap
        self.timeout = timeout
        self.local_hostname = local_hostname
        self.contract = contract
        self.completion_statuses = (
            contract.completion_statuses if contract else frozenset({"succeeded"})
        )
        self._username, self._password, self._ca_file = username, password, ca_file
        # What this process sent, by key: the transcript, and when the body left (if it did).
        self._sent: OrderedDict[str, tuple[list[str], float | None]] = OrderedDict()

    def message_id(self, idempotency_key: str) -> str:
        return message_id_for(idempotency_key, self.message_id_domain)

    # --- writes -------------------------------------------------------------------------------

    def execute(self, request: ExecuteRequest) -> CallResult:
        if request.type != EMAIL_TYPE:
            return CallResult(Outcome.REJECTED, f"the SMTP adapter does not serve {request.type!r}")
        message_id = self.message_id(request.idempotency_key)
        try:
            body, to = self._message(request, message_id)
        except (KeyError, ValueError, TypeError) as exc:
            return CallResult(
                Outcome.REJECTED, f"the message cannot be built: {exc}: nothing was sent"
            )
        if self.imap is not None:
            found = self._lookup_before_send(message_id, request)
            if found is not None:
                return found
        recipients = [to] + ([self.archive_address] if self.archive_address else [])
        smtp = _RecordingSMTP(
            host=self.host, timeout=request.timeout, local_hostname=self.local_hostname
        )
        try:
            result = self._send(smtp, body, recipients, message_id, request)
            _quit(smtp)
        except _Stop as stop:
            result = stop.result
        finally:
            smtp.close()
        self._remember(request.idempotency_key, smtp)
        return result

    def _message(self, request: ExecuteRequest, message_id: str) -> tuple[bytes, str]:
        """The message as DATA content, and its recipient (ValueError on what cannot be sent)."""
        payload = request.payload
        to = _address(str(payload["to"]), "the payload's to")
        message = EmailMessage(policy=SMTP_POLICY)
        message["From"] = self.from_address
        message["To"] = to
        message["Subject"] = str(payload["subject"])
        message["Date"] = formatdate(localtime=False, usegmt=True)
        message["Message-ID"] = message_id
        message["X-Effect-Id"] = request.effect_id
        message["X-Effect-Type"] = request.type
        message["X-Payload-Digest"] = request.payload_digest
        message.set_content(str(payload["body"]))
        return _body_bytes(message), to

    def _lookup_before_send(self, message_id: str, request: ExecuteRequest) -> CallResult | None:
        """The archive's word before a send: a copy already there is the earlier send's
        (CONFIRMED, not sent again); an archive that cannot be searched sends nothing."""
        found = self.lookup(
            idempotency_key=request.idempotency_key,
            provider_operation_id=message_id,
            timeout=request.timeout,
        )
        if found.status == LookupStatus.FOUND and found.operation is not None:
            result = classify_operation(
                found.operation,
                expected_digest=request.payload_digest,
                completion_statuses=self.completion_statuses,
            )
            return CallResult(
                result.outcome,
                f"{message_id} is already in the archive: not sent again ({result.reason})",
                operation=result.operation,
                mismatch=result.mismatch,
            )
        if found.status == LookupStatus.UNREACHABLE:
            return CallResult(
                Outcome.NOT_STARTED,
                f"the archive could not be searched for {message_id} before sending: "
                "nothing was sent; tried again later",
                error=found.error,
            )
        return None

    def _send(
        self,
        smtp: _RecordingSMTP,
        body: bytes,
        recipients: list[str],
        message_id: str,
        request: ExecuteRequest,
    ) -> CallResult:
        self._open(smtp)
        self._envelope(smtp, recipients)
        answer = self._data(smtp, body)
        operation = ProviderOperation(
            id=message_id,
            status="succeeded",
            payload_digest=request.payload_digest,
            result={
                "message_id": message_id,
                "queue_id": queue_id_of(answer),
                "answer": answer,
                "recipients": recipients[:1],
                "archived_to": self.archive_address,
                "transcript": list(smtp.transcript),
            },
        )
        return CallResult(
            Outcome.CONFIRMED
            if operation.status in self.completion_statuses
            else Outcome.IN_PROGRESS,
            f"the SMTP server accepted {message_id}: {answer}",
            operation=operation,
        )

    def _open(self, smtp: _RecordingSMTP) -> None:
        """Connect, greet, STARTTLS and AUTH: whatever fails here, no message can be queued."""
        try:
            code, greeting = smtp.connect(self.host, self.port)
            if code != 220:
                raise smtplib.SMTPConnectError(code, greeting)
            smtp.ehlo_or_helo_if_needed()
            if self.starttls:
                context = ssl.create_default_context(cafile=self._ca_file)
                smtp.starttls(context=context)
                smtp.ehlo()
            if self._username:
                smtp.login(self._username, self._password)
        except (OSError, smtplib.SMTPException, ssl.SSLError) as exc:
            raise _Stop(
                CallResult(
                    Outcome.NOT_STARTED,
                    f"could not open an SMTP session with {self.host}:{self.port}: "
                    "nothing was sent",
                    error=_evidence(smtp.transcript, _describe(exc)),
                )
            ) from exc

    def _envelope(self, smtp: _RecordingSMTP, recipients: list[str]) -> None:
        """MAIL FROM and one RCPT TO per recipient; any refusal ends the send before DATA."""
        try:
            code, answer = smtp.mail(self.from_address)
            _refused(code, answer, "MAIL FROM", smtp)
            for recipient in recipients:
                code, answer = smtp.rcpt(recipient)
                _refused(code, answer, f"RCPT TO {recipient}", smtp)
        except (OSError, smtplib.SMTPException) as exc:
            raise _Stop(
                CallResult(
                    Outcome.NOT_STARTED,
                    "the SMTP session failed before DATA: nothing was queued; sent again later",
                    error=_evidence(smtp.transcript, _describe(exc)),
                )
            ) from exc

    def _data(self, smtp: _RecordingSMTP, body: bytes) -> str:
        """DATA, the body, the server's answer to the final ``.`` (returned on 250)."""
        try:
            code, answer = smtp.docmd("DATA")
        except (OSError, smtplib.SMTPException) as exc:
            raise _Stop(
                CallResult(
                    Outcome.NOT_STARTED,
                    "the SMTP session failed before the message body was sent: nothing was queued",
                    error=_evidence(smtp.transcript, _describe(exc)),
                )
            ) from exc
        if code != 354:
            _refused(code, answer, "DATA", smtp, expected=354)
        smtp.transcript.append(f"C: (message body, {len(body)} bytes)")
        smtp.body_sent_at = time.monotonic()
        try:
            smtp.send(body)
            code, answer = smtp.getreply()
        except (OSError, smtplib.SMTPException) as exc:
            raise _Stop(
                CallResult(
                    Outcome.UNKNOWN,
                    "the connection failed after the message body was sent: the server may "
                    "have queued it; settled by a lookup",
                    error=_evidence(smtp.transcript, _describe(exc)),
                )
            ) from exc
        if code != 250:
            raise _Stop(
                CallResult(
                    Outcome.UNKNOWN,
                    f"the SMTP server answered {code} after the message body: it may have "
                    f"queued it anyway; settled by a lookup ({_text(answer)})",
                    error=_evidence(smtp.transcript),
                )
            )
        return _text(answer)

    def _remember(self, key: str, smtp: _RecordingSMTP) -> None:
        self._sent[key] = (list(smtp.transcript), smtp.body_sent_at)
        self._sent.move_to_end(key)
        while len(self._sent) > _TRANSCRIPTS_KEPT:
            self._sent.popitem(last=False)

    # --- lookups ------------------------------------------------------------------------------

    def lookup(
        self,
        *,
        idempotency_key: str,
        provider_operation_id: str = "",
        timeout: float,
        payload_digest: str = "",
    ) -> LookupResult:
        message_id = provider_operation_id or self.message_id(idempotency_key)
        if not re.fullmatch(r"<[!-~]+>", message_id) or '"' in message_id or "\\" in message_id:
            return LookupResult(
                LookupStatus.UNREACHABLE, error=f"{message_id!r} is not a Message-ID to search for"
            )
        if self.imap is None:
            transcript, _ = self._sent.get(idempotency_key, ([], None))
            sent = (
                _evidence(transcript)
                if transcript
                else "the send's SMTP transcript is in the send attempt's evidence"
            )
            return LookupResult(
                LookupStatus.UNREACHABLE,
                error=f"no IMAP archive is configured: {message_id} cannot be looked up; "
                f"a human checks the mailbox and decides\n{sent}",
            )
        try:
            found = _search_archive(self.imap, message_id, timeout)
        except (OSError, imaplib.IMAP4.error, ssl.SSLError, _ImapRefused) as exc:
            return LookupResult(
                LookupStatus.UNREACHABLE,
                error=f"the IMAP archive {self.imap.host}:{self.imap.port} could not be "
                f"searched for {message_id}: {_describe(exc)}",
            )
        _, body_sent_at = self._sent.get(idempotency_key, ([], None))
        grace = self.imap.delivery_grace.total_seconds()
        if found.status == LookupStatus.NOT_FOUND and body_sent_at is not None:
            age = time.monotonic() - body_sent_at
            if age < grace:
                return LookupResult(
                    LookupStatus.UNREACHABLE,
                    error=f"{message_id} is not in the archive yet, but its body was sent "
                    f"{age:.0f}s ago: the archive copy may still be in delivery (a "
                    f"'not found' is trusted {grace:.0f}s after the send)",
                )
        return found


def _check_archive(
    imap: ImapArchive, archive_address: str, contract: EffectContract | None
) -> None:
    """A "not found" in the archive proves something only if every sent message reaches it
    and stays there as long as the gateway trusts a "not found"."""
    if not archive_address and not imap.server_archives:
        raise ValueError(
            "an IMAP archive needs archive_address (the adapter's Bcc) or server_archives=True: "
            "a mailbox that does not receive every message cannot prove one was not sent"
        )
    if contract is not None and imap.retention < contract.recovery.key_retention:
        raise ValueError(
            f"the IMAP archive keeps messages {imap.retention}, less than the contract's key "
            f"retention {contract.recovery.key_retention}"
        )


def _refused(
    code: int, answer: bytes | str, step: str, smtp: _RecordingSMTP, expected: int = 250
) -> None:
    """A refusal before the body: 4xx is "try later" (NOT_STARTED), 5xx is REJECTED."""
    if code == expected or (expected == 250 and code == 251):  # 251: forwarded, accepted
        return
    text = _text(answer)
    with_rset = _reset(smtp)
    if 500 <= code < 600:
        raise _Stop(
            CallResult(
                Outcome.REJECTED,
                f"the SMTP server refused {step}: {code} {text}",
                error=_evidence(with_rset),
            )
        )
    raise _Stop(
        CallResult(
            Outcome.NOT_STARTED,
            f"the SMTP server turned {step} away for now ({code} {text}): nothing was queued; "
            "sent again later with the same Message-ID",
            error=_evidence(with_rset),
        )
    )


def _reset(smtp: _RecordingSMTP) -> list[str]:
    """RSET and QUIT after a refusal (best effort): nothing half-built stays on the session."""
    with contextlib.suppress(OSError, smtplib.SMTPException):
        smtp.rset()
    _quit(smtp)
    return smtp.transcript


def _quit(smtp: _RecordingSMTP) -> None:
    """QUIT on a healthy session. A session that failed is only closed: a QUIT there would
    wait for an answer that may never come."""
    with contextlib.suppress(OSError, smtplib.SMTPException):
        if smtp.sock is not None:
            smtp.quit()


class _ImapRefused(Exception):
    """The IMAP server answered a command with something other than OK."""


def _ok(answer: tuple[str, Any], what: str) -> Any:
    status, data = answer
    if status != "OK":
        raise _ImapRefused(f"{what}: {status} {data!r}")
    return data


def _connect_imap(imap: ImapArchive, timeout: float) -> imaplib.IMAP4:
    context = ssl.create_default_context(cafile=imap.ca_file)
    if imap.tls == "ssl":
        return imaplib.IMAP4_SSL(imap.host, imap.port, ssl_context=context, timeout=timeout)
    client = imaplib.IMAP4(imap.host, imap.port, timeout=timeout)
    if imap.tls == "starttls":
        client.starttls(ssl_context=context)
    return client


def _search_archive(imap: ImapArchive, message_id: str, timeout: float) -> LookupResult:
    client = _connect_imap(imap, timeout)
    try:
        _ok(client.login(imap.username, imap.password), "LOGIN")
        _ok(client.select(f'"{imap.mailbox}"', readonly=True), f"SELECT {imap.mailbox}")
        data = _ok(client.uid("SEARCH", "HEADER", "Message-ID", f'"{message_id}"'), "SEARCH")
        uids = b" ".join(d for d in data if d).split()
        copies = [h for h in (_headers(client, uid) for uid in uids) if _same_id(h, message_id)]
    finally:
        with contextlib.suppress(OSError, imaplib.IMAP4.error):
            client.logout()
    if not copies:
        return LookupResult(
            LookupStatus.NOT_FOUND,
            error=f"{message_id} is not in {imap.mailbox} on {imap.host}, which receives a copy "
            "of every message sent",
        )
    first = copies[0]
    operation = ProviderOperation(
        id=message_id,
        status="succeeded",
        payload_digest=first.get("x-payload-digest", ""),
        result={
            "message_id": message_id,
            "effect_id": first.get("x-effect-id", ""),
            "date": first.get("date", ""),
            "archive": f"{imap.host}/{imap.mailbox}",
            "copies": len(copies),
        },
    )
    return LookupResult(LookupStatus.FOUND, operation=operation)


def _headers(client: imaplib.IMAP4, uid: bytes) -> dict[str, str]:
    data = _ok(
        client.uid("FETCH", uid.decode(), f"(BODY.PEEK[HEADER.FIELDS {_HEADER_FIELDS}])"), "FETCH"
    )
    raw = b"".join(part[1] for part in data if isinstance(part, tuple))
    headers: dict[str, str] = {}
    for line in re.sub(rb"\r?\n[ \t]+", b" ", raw).splitlines():
        name, sep, value = line.decode("utf-8", "replace").partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return headers


def _same_id(headers: dict[str, str], message_id: str) -> bool:
    """IMAP's HEADER search matches substrings; only the exact Message-ID counts."""
    return headers.get("message-id", "") == message_id


__all__ = [
    "EMAIL_TYPE",
    "ImapArchive",
    "SmtpAdapter",
    "message_id_for",
    "queue_id_of",
]


def from_config(config: ProviderConfig) -> SmtpAdapter:
    """The SMTP adapter of a ``GATEWAY_PROVIDERS`` entry (``"adapter": "smtp"``): the entry's
    base URL is the submission server, ``smtp://host:port``; its credential, when there is
    one, is the AUTH password of the ``username`` option. Options: ``from_address``
    (required), ``starttls`` (true), ``username``, ``message_id_domain``, ``archive_address``,
    ``ca_file``, ``local_hostname``, and ``imap``: the archive mailbox's ``host``, ``port``,
    ``tls``, ``username``, ``password_env`` (the environment variable that holds its
    password, never the password), ``mailbox``, ``retention_days``, ``server_archives``,
    ``delivery_grace_seconds``. Without ``imap`` every lookup goes to a human."""
    parts = urlsplit(config.base_url)
    if parts.scheme != "smtp" or not parts.hostname:
        raise ValueError(f"base_url must be smtp://host:port, not {config.base_url!r}")
    options = config.options
    imap = _imap_from_options(options.get("imap"))
    return SmtpAdapter(
        host=parts.hostname,
        port=parts.port or 587,
        from_address=str(options.get("from_address", "")),
        starttls=bool(options.get("starttls", True)),
        username=str(options.get("username", "")) if config.credential else "",
        password=config.credential,
        ca_file=options.get("ca_file") or None,
        message_id_domain=str(options.get("message_id_domain", "")),
        archive_address=str(options.get("archive_address", "")),
        imap=imap,
        timeout=config.timeout,
        local_hostname=options.get("local_hostname") or None,
        contract=config.contract,
    )


def _imap_from_options(raw: Any) -> ImapArchive | None:
    if not raw:
        return None
    if not isinstance(raw, dict):
        raise ValueError("the imap option must be a JSON object")
    variable = str(raw.get("password_env", ""))
    password = os.environ.get(variable, "").strip() if variable else ""
    if not password:
        raise ValueError(f"imap: password_env names no set variable ({variable or 'none'})")
    return ImapArchive(
        host=str(raw.get("host", "")),
        username=str(raw.get("username", "")),
        password=password,
        port=int(raw.get("port", 993)),
        tls=str(raw.get("tls", "ssl")),
        mailbox=str(raw.get("mailbox", "INBOX")),
        retention=timedelta(days=float(raw.get("retention_days", 30))),
        server_archives=bool(raw.get("server_archives", False)),
        delivery_grace=timedelta(seconds=float(raw.get("delivery_grace_seconds", 300))),
    )
