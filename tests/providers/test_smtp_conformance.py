"""The SMTP adapter through the conformance kit: aiosmtpd (in a thread) as the server, whose
accepted messages are the oracle, and Debian's Dovecot (a child process) as the IMAP archive
the lookups search. The fault proxy speaks HTTP only, so the server makes every fault itself
(``MailDriver``) but a refused connection; the cases that do not apply to mail are the kit's
``NOT_FOR_MAIL``, each reported with its reason."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from gateway.contracts import CONTRACTS
from gateway.providers.base import ExecuteRequest
from gateway.providers.conformance import (
    CASES,
    NOT_FOR_MAIL,
    SKIP,
    Fault,
    Sample,
    Subject,
    run_matrix,
)
from gateway.providers.conformance.pytest_plugin import assert_conformant
from gateway.providers.smtp import ImapArchive, SmtpAdapter, message_id_for
from tests.providers.mail_servers import Dovecot, MailHandler, SmtpServer, dovecot_missing
from tests.support.tls import self_signed_certificate

pytest_plugins = ["gateway.providers.conformance.pytest_plugin"]
pytestmark = pytest.mark.skipif(bool(dovecot_missing()), reason=dovecot_missing() or "here")

EMAIL = CONTRACTS["email.message.send"]
SENDER, ARCHIVE, DOMAIN = "gateway@example.com", "archive@example.com", "mail.example.com"
SAMPLE = Sample(
    "email.message.send",
    {"type": "customer", "id": "cus_42"},
    {"to": "ada@example.com", "subject": "Your order has shipped", "body": "On its way."},
    {"to": "ada@example.com", "subject": "Your order has shipped", "body": "Another text."},
)
# The fault modes of the test server (tests/providers/mail_servers.py) per fault of the matrix.
MODES = {
    Fault.RESET_BEFORE_COMMIT: "reset_at_data",
    Fault.DROP_AFTER_COMMIT: "drop_after_data",
    Fault.ERROR_AFTER_COMMIT: "554_after_data",
    Fault.SLOW: "slow_after_data",
}


class MailDriver:
    """The SMTP server's side: the messages it accepted, by Message-ID (its own records), and
    its fault modes; KEY_EXPIRED keeps the accepted message out of the archive mailbox."""

    def __init__(self, handler: MailHandler) -> None:
        self.handler = handler

    def operations(self, idempotency_key: str) -> int:
        return self.handler.count(message_id_for(idempotency_key, DOMAIN))

    def inject(self, fault: Fault, request: ExecuteRequest, *, timeout: float) -> bool:
        if fault == Fault.KEY_EXPIRED:
            self.handler.archive_off = True
            return True
        if fault not in MODES:
            return False
        self.handler.fault = MODES[fault]
        self.handler.delay = timeout + 1.5
        return True

    def clear(self) -> None:
        self.handler.fault, self.handler.archive_off = None, False


@pytest.fixture(scope="module")
def conformance_subject(tmp_path_factory) -> Iterator[Subject]:
    certificate = self_signed_certificate(tmp_path_factory.mktemp("mail-cert"))
    root = Path(tempfile.mkdtemp(prefix="effect-gateway-dovecot-"))
    try:
        with Dovecot(root, certificate) as dovecot:
            handler = MailHandler(
                archive_address=ARCHIVE, maildir=dovecot.maildir, maildir_owner=dovecot.owner
            )
            # The server delivers the archive copy before it answers: a "not found" can be
            # trusted at once (no delivery grace).
            archive = ImapArchive(
                host="127.0.0.1",
                port=dovecot.port,
                tls="none",
                username="archive",
                password=dovecot.password,
                delivery_grace=timedelta(0),
            )

            def adapter(url: str) -> SmtpAdapter:
                parts = urlsplit(url)
                return SmtpAdapter(
                    host=parts.hostname or "",
                    port=parts.port or 25,
                    from_address=SENDER,
                    starttls=False,
                    message_id_domain=DOMAIN,
                    archive_address=ARCHIVE,
                    imap=archive,
                    contract=EMAIL,
                    timeout=2.0,
                )

            with SmtpServer(handler) as smtp:
                yield Subject(
                    adapter=adapter,
                    base_url=f"smtp://127.0.0.1:{smtp.port}",
                    driver=MailDriver(handler),
                    sample=SAMPLE,
                    timeout=2.0,
                    proxied=False,
                    not_applicable=NOT_FOR_MAIL,
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_smtp_adapter_passes(conformance_report):
    assert_conformant(conformance_report)


def test_every_case_that_applies_to_mail_runs_and_the_others_say_why(conformance_subject):
    reports = {report.case.name: report for report in run_matrix(conformance_subject, CASES)}
    skipped = {name for name, report in reports.items() if report.status == SKIP}
    assert skipped == set(NOT_FOR_MAIL)
    for name in skipped:
        assert reports[name].evidence == [f"does not apply: {NOT_FOR_MAIL[name]}"]
    for report in reports.values():
        assert_conformant(report)
