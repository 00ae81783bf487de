"""Real mail servers for the SMTP adapter's tests, started by the tests themselves.

- ``SmtpServer``: ``aiosmtpd`` in a thread on a free loopback port, optionally with STARTTLS
  and AUTH. Its handler keeps every message it accepted (the oracle), delivers the archive
  copy into a Maildir the way an MTA's local delivery would, and has fault modes.
- ``Dovecot``: Debian's ``dovecot-imapd`` as a child process with its own configuration in a
  temp dir (a passwd-file user, a Maildir, a free loopback port, IMAPS with the test's
  certificate, no system configuration), written as the demo's archive writes it
  (``gateway.management.demo_mail``).
- The servers' certificate comes from ``tests.support.tls.self_signed_certificate``: a
  throwaway one for 127.0.0.1, its own CA file.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import socket
import ssl
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from email import message_from_bytes
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

from gateway.management.demo_mail import DOVECOT, dovecot_owner, write_dovecot_config
from tests.support.processes import free_port


@dataclass
class Stored:
    mail_from: str
    rcpt_tos: list[str]
    content: bytes

    @property
    def message_id(self) -> str:
        return str(message_from_bytes(self.content).get("Message-ID", ""))


@dataclass
class MailHandler:
    """An aiosmtpd handler that records what it accepts. ``fault`` is one of:

    - ``"rcpt_451"`` / ``"rcpt_550"``: refuse every RCPT with 451 / 550;
    - ``"reset_at_data"``: read the body, then close the connection without storing it;
    - ``"drop_after_data"``: store the message, then close the connection without answering;
    - ``"451_after_data"`` / ``"554_after_data"``: store the message, then answer 451 / 554;
    - ``"slow_after_data"``: store the message, then answer after ``delay`` seconds.

    ``archive_off``: accepted messages no longer reach the archive Maildir (as if the archive
    had dropped them: what a lookup past the archive's retention finds)."""

    archive_address: str = ""
    maildir: Path | None = None
    maildir_owner: tuple[int, int] | None = None
    fault: str | None = None
    delay: float = 0.0
    archive_off: bool = False
    messages: list[Stored] = field(default_factory=list)

    def count(self, message_id: str) -> int:
        return sum(1 for stored in self.messages if stored.message_id == message_id)

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: Any
    ) -> str:
        if self.fault == "rcpt_451":
            return "451 4.3.0 Mailbox temporarily unavailable, try again later"
        if self.fault == "rcpt_550":
            return f"550 5.1.1 <{address}>: Recipient address rejected: no such user"
        envelope.rcpt_tos.append(address)
        return "250 2.1.5 Ok"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        if self.fault == "reset_at_data":
            assert server.transport is not None
            server.transport.abort()
            return "451 4.3.0 never read by the client"
        raw = envelope.original_content or envelope.content or b""
        content = raw.encode() if isinstance(raw, str) else bytes(raw)
        self.messages.append(Stored(str(envelope.mail_from), list(envelope.rcpt_tos), content))
        archived = self.archive_address in envelope.rcpt_tos and self.maildir is not None
        if archived and not self.archive_off:
            self.deliver(content)
        queue_id = f"Q{len(self.messages):04d}"
        if self.fault == "drop_after_data":
            assert server.transport is not None
            server.transport.close()
            return f"250 2.0.0 Ok: queued as {queue_id}"
        if self.fault == "451_after_data":
            return "451 4.3.0 Error: queue file write error"
        if self.fault == "554_after_data":
            return "554 5.3.0 Error: transaction failed"
        if self.fault == "slow_after_data":
            await asyncio.sleep(self.delay)
        return f"250 2.0.0 Ok: queued as {queue_id}"

    def deliver(self, content: bytes) -> None:
        """Local delivery into the Maildir, as an MTA does it: write in tmp/, move to new/."""
        assert self.maildir is not None
        name = f"{int(time.time())}.{uuid.uuid4().hex}.effect-gateway-test"
        tmp = self.maildir / "tmp" / name
        tmp.write_bytes(content.replace(b"\r\n", b"\n"))
        if self.maildir_owner is not None:
            os.chown(tmp, *self.maildir_owner)
        tmp.rename(self.maildir / "new" / name)


USERNAME = "gateway"


class SmtpServer:
    """aiosmtpd on a free loopback port, in a thread. With a certificate it offers STARTTLS
    (and requires it); with a password it requires AUTH as ``USERNAME`` (PLAIN and LOGIN, less
    those in ``auth_exclude``)."""

    def __init__(
        self,
        handler: MailHandler,
        *,
        certificate: tuple[Path, Path] | None = None,
        password: str = "",
        auth_exclude: tuple[str, ...] = (),
    ) -> None:
        self.handler = handler
        self.password = password
        self.port = free_port()
        kwargs: dict[str, Any] = {}
        if certificate is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(str(certificate[0]), str(certificate[1]))
            kwargs.update(tls_context=context, require_starttls=True)
        if password:
            kwargs.update(
                authenticator=self._authenticate,
                auth_required=True,
                auth_exclude_mechanism=auth_exclude,
            )
        self.controller = Controller(
            handler, hostname="127.0.0.1", port=self.port, ready_timeout=10, **kwargs
        )

    def _authenticate(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        ok = (
            isinstance(data, LoginPassword)
            and data.login == USERNAME.encode()
            and data.password == self.password.encode()
        )
        return AuthResult(success=ok, handled=False)

    def __enter__(self) -> SmtpServer:
        self.controller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.controller.stop()


def dovecot_missing() -> str:
    """Why Dovecot cannot run here, or "" when it can."""
    if not os.path.exists(DOVECOT):
        return (
            f"{DOVECOT} is absent: install Debian's dovecot-imapd (apt-get install -y "
            "dovecot-imapd) to run the IMAP archive tests"
        )
    return ""


class Dovecot:
    """``dovecot -F`` with only its own configuration, in ``root``; one user, ``archive``,
    whose Maildir is ``maildir``. IMAP (plain) on ``port`` and IMAPS on ``tls_port``."""

    def __init__(self, root: Path, certificate: tuple[Path, Path]) -> None:
        self.root = root
        self.password = secrets.token_urlsafe(12)
        self.port, self.tls_port = free_port(), free_port()
        uid, gid, _, _ = dovecot_owner()
        self.owner = (uid, gid)
        self.home = root / "home" / "archive"
        self.maildir = self.home / "Maildir"
        self._certificate = certificate
        self.process: subprocess.Popen[bytes] | None = None

    def _configure(self) -> Path:
        for sub in ("new", "cur", "tmp"):
            (self.maildir / sub).mkdir(parents=True, exist_ok=True)
        for path in (self.root, self.root / "home"):
            path.chmod(0o755)
        for path in [self.home, *self.home.rglob("*")]:
            os.chown(path, *self.owner)
        (self.root / "run").mkdir(exist_ok=True)
        (self.root / "state").mkdir(exist_ok=True)
        uid, gid = self.owner
        (self.root / "passwd").write_text(
            f"archive:{{PLAIN}}{self.password}:{uid}:{gid}::{self.home}\n"
        )
        return write_dovecot_config(
            self.root,
            self.maildir,
            self.port,
            instance="test",
            tls=(self.tls_port, *self._certificate),
        )

    def __enter__(self) -> Dovecot:
        config = self._configure()
        log = open(self.root / "dovecot.stderr", "wb")  # closed in __exit__
        self._stderr = log
        # Its own process group: the master and every process it forks stop together.
        self.process = subprocess.Popen(
            [DOVECOT, "-F", "-c", str(config)], stderr=log, start_new_session=True
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"dovecot exited at start: {self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    if sock.recv(64).startswith(b"* OK"):
                        return self
            except OSError:
                time.sleep(0.1)
        self.__exit__()
        raise RuntimeError(f"dovecot did not answer on port {self.port}: {self.log()}")

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            group = self.process.pid
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
            _stop_group(group)
        self._stderr.close()

    def log(self) -> str:
        parts = []
        for name in ("dovecot.log", "dovecot.stderr"):
            path = self.root / name
            if path.exists():
                parts.append(path.read_text(errors="replace")[-2000:])
        return "\n".join(parts)

    def copies(self) -> int:
        return sum(1 for sub in ("new", "cur") for _ in (self.maildir / sub).iterdir())


def _stop_group(group: int) -> None:
    """Wait for the master's children (login, auth, imap) to leave its process group; those
    still there after 5 s are killed."""
    deadline = time.monotonic() + 5
    try:
        while time.monotonic() < deadline:
            os.killpg(group, 0)
            time.sleep(0.05)
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass
