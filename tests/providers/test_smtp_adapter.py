"""The SMTP adapter against real servers the tests start: aiosmtpd (in a thread, with STARTTLS,
AUTH and fault modes) and Debian's Dovecot (a child process with its own configuration) as the
IMAP archive. The servers' own records are the oracle: the messages aiosmtpd accepted, the
files in the archive's Maildir."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from datetime import timedelta
from email import message_from_bytes, policy
from pathlib import Path

import pytest

from gateway.choices import Outcome
from gateway.contracts import CONTRACTS
from gateway.providers.base import ExecuteRequest, LookupStatus
from gateway.providers.http import classify_operation
from gateway.providers.smtp import ImapArchive, SmtpAdapter, message_id_for, queue_id_of
from tests.providers.mail_servers import (
    USERNAME,
    Dovecot,
    MailHandler,
    SmtpServer,
    dovecot_missing,
    free_port,
)
from tests.support.tls import self_signed_certificate

EMAIL = CONTRACTS["email.message.send"]
SENDER = "gateway@example.com"
ARCHIVE = "archive@example.com"
DOMAIN = "mail.example.com"
PASSWORD = "s3cret-Passw0rd-for-smtp"


def command(key: str = "", *, subject: str = "Your order has shipped") -> ExecuteRequest:
    payload = {"to": "ada@example.com", "subject": subject, "body": "Your order is on its way."}
    return ExecuteRequest(
        effect_id=str(uuid.uuid4()),
        type="email.message.send",
        idempotency_key=key or f"eg-{uuid.uuid4().hex}",
        resource={"type": "customer", "id": "cus_42"},
        payload=payload,
        payload_digest="sha256:"
        + hashlib.sha256(repr(sorted(payload.items())).encode()).hexdigest(),
        timeout=2.0,
    )


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed_certificate(tmp_path_factory.mktemp("mail-cert"))


@pytest.fixture
def handler() -> MailHandler:
    return MailHandler(archive_address=ARCHIVE)


@pytest.fixture
def smtp(handler: MailHandler) -> Iterator[SmtpServer]:
    with SmtpServer(handler) as server:
        yield server


@pytest.fixture(scope="module")
def dovecot(certificate: tuple[Path, Path]) -> Iterator[Dovecot]:
    if dovecot_missing():
        pytest.skip(dovecot_missing())
    # Not under pytest's temp dir: Dovecot's unprivileged processes must traverse the path.
    root = Path(tempfile.mkdtemp(prefix="effect-gateway-dovecot-"))
    try:
        with Dovecot(root, certificate) as server:
            yield server
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def archived(handler: MailHandler, dovecot: Dovecot) -> MailHandler:
    """The handler delivers the archive copy into Dovecot's Maildir."""
    handler.maildir, handler.maildir_owner = dovecot.maildir, dovecot.owner
    return handler


def archive_of(dovecot: Dovecot, **overrides: object) -> ImapArchive:
    fields: dict[str, object] = {
        "host": "127.0.0.1",
        "port": dovecot.port,
        "tls": "none",
        "username": "archive",
        "password": dovecot.password,
        **overrides,
    }
    return ImapArchive(**fields)  # type: ignore[arg-type]


def adapter(port: int, **kwargs: object) -> SmtpAdapter:
    options: dict[str, object] = {
        "host": "127.0.0.1",
        "port": port,
        "from_address": SENDER,
        "starttls": False,
        "message_id_domain": DOMAIN,
        "contract": EMAIL,
        "timeout": 2.0,
        **kwargs,
    }
    return SmtpAdapter(**options)  # type: ignore[arg-type]


def _secrets_in(text: str) -> list[str]:
    forms = [
        PASSWORD,
        base64.b64encode(PASSWORD.encode()).decode(),
        base64.b64encode(USERNAME.encode()).decode(),  # AUTH LOGIN's first line
        base64.b64encode(f"\0{USERNAME}\0{PASSWORD}".encode()).decode(),
    ]
    return [form for form in forms if form in text]


# --- sends ------------------------------------------------------------------------------------


def test_a_sent_message_is_confirmed_and_held_once_by_the_server(
    smtp: SmtpServer, handler: MailHandler
) -> None:
    request = command()
    result = adapter(smtp.port).execute(request)

    message_id = message_id_for(request.idempotency_key, DOMAIN)
    assert result.outcome == Outcome.CONFIRMED, result
    assert result.operation is not None and result.operation.id == message_id
    assert result.operation.status == "succeeded"
    assert result.operation.result["queue_id"] == "Q0001"
    assert result.operation.result["recipients"] == ["ada@example.com"]
    assert handler.count(message_id) == 1
    stored = handler.messages[0]
    assert stored.mail_from == SENDER and stored.rcpt_tos == ["ada@example.com"]
    headers = message_from_bytes(stored.content)
    assert headers["X-Effect-Id"] == request.effect_id
    assert headers["X-Payload-Digest"] == request.payload_digest
    assert headers["Subject"] == "Your order has shipped"
    assert "Bcc" not in headers


def test_non_ascii_text_and_leading_dots_arrive_intact(
    smtp: SmtpServer, handler: MailHandler
) -> None:
    request = command(subject="Ihre Bestellung ist unterwegs — Größe 42")
    request = dataclasses.replace(request, payload={**request.payload, "body": "Grüße, Zoë ✓\n.\n"})
    assert adapter(smtp.port).execute(request).outcome == Outcome.CONFIRMED

    stored = message_from_bytes(handler.messages[0].content, policy=policy.default)
    assert stored["Subject"] == "Ihre Bestellung ist unterwegs — Größe 42"
    assert stored.get_content().replace("\r\n", "\n") == "Grüße, Zoë ✓\n.\n"
    assert handler.messages[0].content.isascii()

    dots = dataclasses.replace(request, payload={**request.payload, "body": "a\n.\n..b\n"})
    assert adapter(smtp.port).execute(dots).outcome == Outcome.CONFIRMED
    stored = message_from_bytes(handler.messages[1].content, policy=policy.default)
    assert stored.get_content().replace("\r\n", "\n") == "a\n.\n..b\n"  # dot-stuffed, unstuffed


def test_the_message_id_is_derived_from_the_key_alone() -> None:
    assert message_id_for("k-1", DOMAIN) == message_id_for("k-1", DOMAIN)
    assert message_id_for("k-1", DOMAIN) != message_id_for("k-2", DOMAIN)
    expected = hashlib.sha256(b"k-1").hexdigest()[:32]
    assert message_id_for("k-1", DOMAIN) == f"<{expected}@{DOMAIN}>"


@pytest.mark.parametrize(("mechanism", "other"), [("PLAIN", "LOGIN"), ("LOGIN", "PLAIN")])
def test_starttls_and_auth_send_and_the_transcript_never_holds_the_password(
    certificate: tuple[Path, Path], handler: MailHandler, mechanism: str, other: str
) -> None:
    with SmtpServer(
        handler, certificate=certificate, password=PASSWORD, auth_exclude=(other,)
    ) as server:
        secure = {"starttls": True, "ca_file": str(certificate[0]), "username": USERNAME}
        sent = adapter(server.port, password=PASSWORD, **secure).execute(command())
        refused = adapter(server.port, password="not-the-password", **secure).execute(command())

    assert sent.outcome == Outcome.CONFIRMED, sent
    assert sent.operation is not None
    transcript = "\n".join(sent.operation.result["transcript"])
    assert "C: STARTTLS" in transcript and "S: 220" in transcript
    assert f"AUTH {mechanism} [redacted]" in transcript and "S: 235" in transcript
    assert _secrets_in(repr(sent)) == []
    assert refused.outcome == Outcome.NOT_STARTED, refused
    assert "535" in refused.error and _secrets_in(repr(refused)) == []
    assert len(handler.messages) == 1


def test_a_certificate_the_adapter_does_not_trust_sends_nothing(
    certificate: tuple[Path, Path], handler: MailHandler
) -> None:
    with SmtpServer(handler, certificate=certificate) as server:
        result = adapter(server.port, starttls=True).execute(command())
    assert result.outcome == Outcome.NOT_STARTED, result
    assert "CERTIFICATE_VERIFY_FAILED" in result.error
    assert handler.messages == []


def test_a_server_that_is_down_is_not_started() -> None:
    result = adapter(free_port()).execute(command())
    assert result.outcome == Outcome.NOT_STARTED, result
    assert "ConnectionRefusedError" in result.error


@pytest.mark.parametrize(
    ("fault", "outcome", "code"),
    [("rcpt_550", Outcome.REJECTED, "550"), ("rcpt_451", Outcome.NOT_STARTED, "451")],
)
def test_a_refused_recipient_queues_nothing(
    smtp: SmtpServer, handler: MailHandler, fault: str, outcome: Outcome, code: str
) -> None:
    handler.fault = fault
    result = adapter(smtp.port).execute(command())
    assert result.outcome == outcome, result
    assert code in result.reason and "RCPT TO ada@example.com" in result.reason
    assert "C: RCPT to:<ada@example.com>" in result.error and "C: DATA" not in result.error
    assert handler.messages == []


@pytest.mark.parametrize("fault", ["drop_after_data", "451_after_data", "slow_after_data"])
def test_a_lost_answer_after_the_body_is_unknown(
    smtp: SmtpServer, handler: MailHandler, fault: str
) -> None:
    handler.fault, handler.delay = fault, 3.0
    request = dataclasses.replace(command(), timeout=0.5)
    result = adapter(smtp.port).execute(request)
    assert result.outcome == Outcome.UNKNOWN, result
    assert "C: (message body," in result.error
    assert handler.count(message_id_for(request.idempotency_key, DOMAIN)) == 1


def test_a_header_injection_is_refused_before_anything_is_sent(
    smtp: SmtpServer, handler: MailHandler
) -> None:
    result = adapter(smtp.port).execute(command(subject="Hi\r\nBcc: everyone@example.com"))
    assert result.outcome == Outcome.REJECTED, result
    assert handler.messages == []


def test_without_an_archive_an_unknown_send_goes_to_a_human_with_its_evidence(
    smtp: SmtpServer, handler: MailHandler
) -> None:
    handler.fault = "drop_after_data"
    mail = adapter(smtp.port)
    request = command()
    sent = mail.execute(request)
    found = mail.lookup(idempotency_key=request.idempotency_key, timeout=2.0)

    message_id = message_id_for(request.idempotency_key, DOMAIN)
    assert sent.outcome == Outcome.UNKNOWN
    assert found.status == LookupStatus.UNREACHABLE
    assert message_id in found.error and "a human" in found.error
    assert "SMTP transcript" in found.error and "C: MAIL from:<gateway@example.com>" in found.error
    assert "S: (connection closed)" in found.error
    assert handler.count(message_id) == 1


# --- the IMAP archive (Dovecot) ---------------------------------------------------------------


def test_a_send_lost_after_data_is_found_in_the_archive(
    smtp: SmtpServer, archived: MailHandler, dovecot: Dovecot
) -> None:
    archived.fault = "drop_after_data"
    mail = adapter(smtp.port, archive_address=ARCHIVE, imap=archive_of(dovecot))
    request = command()
    sent = mail.execute(request)
    found = mail.lookup(idempotency_key=request.idempotency_key, timeout=5.0)

    message_id = message_id_for(request.idempotency_key, DOMAIN)
    assert sent.outcome == Outcome.UNKNOWN, sent
    assert archived.messages[0].rcpt_tos == ["ada@example.com", ARCHIVE]
    assert found.status == LookupStatus.FOUND, found
    assert found.operation is not None and found.operation.id == message_id
    assert found.operation.result["copies"] == 1
    settled = classify_operation(
        found.operation,
        expected_digest=request.payload_digest,
        completion_statuses=EMAIL.completion_statuses,
    )
    assert settled.outcome == Outcome.CONFIRMED, settled
    assert archived.count(message_id) == 1


def test_a_resend_after_unknown_finds_the_message_first_and_sends_nothing(
    smtp: SmtpServer, archived: MailHandler, dovecot: Dovecot
) -> None:
    archived.fault = "drop_after_data"
    mail = adapter(smtp.port, archive_address=ARCHIVE, imap=archive_of(dovecot))
    request = command()
    assert mail.execute(request).outcome == Outcome.UNKNOWN

    archived.fault = None
    again = mail.execute(request)

    assert again.outcome == Outcome.CONFIRMED, again
    assert "already in the archive" in again.reason
    assert archived.count(message_id_for(request.idempotency_key, DOMAIN)) == 1
    assert len(archived.messages) == 1


def test_a_key_never_sent_is_not_found_and_over_imaps_too(
    smtp: SmtpServer, archived: MailHandler, dovecot: Dovecot, certificate: tuple[Path, Path]
) -> None:
    imaps = archive_of(dovecot, port=dovecot.tls_port, tls="ssl", ca_file=str(certificate[0]))
    mail = adapter(smtp.port, archive_address=ARCHIVE, imap=imaps)
    request = command()
    missing = mail.lookup(idempotency_key=f"never-{uuid.uuid4().hex}", timeout=5.0)
    sent = mail.execute(request)
    found = mail.lookup(idempotency_key=request.idempotency_key, timeout=5.0)

    assert missing.status == LookupStatus.NOT_FOUND, missing
    assert sent.outcome == Outcome.CONFIRMED, sent
    assert found.status == LookupStatus.FOUND, found
    assert found.operation is not None
    assert found.operation.payload_digest == request.payload_digest


def test_a_not_found_right_after_a_lost_answer_is_not_trusted(
    smtp: SmtpServer, handler: MailHandler, dovecot: Dovecot
) -> None:
    """The server stored the message, its archive copy has not been delivered yet (the
    handler has no Maildir here): within the delivery grace "not found" proves nothing."""
    handler.fault = "drop_after_data"
    request = command()
    waiting = adapter(smtp.port, archive_address=ARCHIVE, imap=archive_of(dovecot))
    assert waiting.execute(request).outcome == Outcome.UNKNOWN
    unsure = waiting.lookup(idempotency_key=request.idempotency_key, timeout=5.0)
    handler.fault = None
    again = waiting.execute(request)

    assert unsure.status == LookupStatus.UNREACHABLE, unsure
    assert "may still be in delivery" in unsure.error
    assert again.outcome == Outcome.NOT_STARTED, again
    assert handler.count(message_id_for(request.idempotency_key, DOMAIN)) == 1

    no_grace = archive_of(dovecot, delivery_grace=timedelta(0))
    trusting = adapter(smtp.port, archive_address=ARCHIVE, imap=no_grace)
    handler.fault = "drop_after_data"
    other = command()
    assert trusting.execute(other).outcome == Outcome.UNKNOWN
    missing = trusting.lookup(idempotency_key=other.idempotency_key, timeout=5.0)
    assert missing.status == LookupStatus.NOT_FOUND, missing


def test_an_archive_that_cannot_be_searched_is_unreachable_and_blocks_a_send(
    smtp: SmtpServer, archived: MailHandler, dovecot: Dovecot
) -> None:
    wrong = archive_of(dovecot, password="wrong")
    mail = adapter(smtp.port, archive_address=ARCHIVE, imap=wrong)
    looked = mail.lookup(idempotency_key="any", timeout=5.0)
    sent = mail.execute(command())
    down = adapter(smtp.port, archive_address=ARCHIVE, imap=archive_of(dovecot, port=free_port()))

    assert looked.status == LookupStatus.UNREACHABLE
    assert "AUTHENTICATIONFAILED" in looked.error
    assert sent.outcome == Outcome.NOT_STARTED, sent
    assert down.lookup(idempotency_key="any", timeout=5.0).status == LookupStatus.UNREACHABLE
    assert archived.messages == []


# --- configuration ----------------------------------------------------------------------------


def test_bad_configuration_is_refused_when_the_adapter_is_built() -> None:
    archive = ImapArchive(host="imap.example.com", username="a", password="p")
    short = dataclasses.replace(archive, retention=timedelta(hours=1))
    cases: list[tuple[dict[str, object], str]] = [
        ({"password": "p", "username": "u"}, "starttls"),
        ({"imap": archive}, "archive_address"),
        ({"imap": short, "archive_address": ARCHIVE}, "key retention"),
        ({"from_address": "Gateway <gateway@example.com>"}, "from_address"),
        ({"contract": CONTRACTS["billing.charge.create"]}, "does not serve"),
        ({"username": "u"}, "username and a password"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            adapter(25, **kwargs)
    with pytest.raises(ValueError, match="tls"):
        ImapArchive(host="h", username="u", password="p", tls="maybe")


def test_the_queue_id_is_read_from_the_common_answers() -> None:
    assert queue_id_of("2.0.0 Ok: queued as 4BqP3x1Zz7") == "4BqP3x1Zz7"
    assert queue_id_of("OK id=1rXyZ-000abc-Qr") == "1rXyZ-000abc-Qr"
    assert queue_id_of("Message accepted for delivery") == ""
