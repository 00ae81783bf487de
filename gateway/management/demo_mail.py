"""The demo's IMAP archive (``make demo DEMO_ARGS="--providers real"``): Debian's Dovecot, when it
is installed, as a child process with only its own configuration under ``var/demo-imap/``,
serving the Maildir the demo's SMTP server delivers every accepted message into. The SMTP
adapter's lookups search it (``server_archives``: the server itself archives every message).
Without Dovecot the demo's mail has no lookups: an UNKNOWN send goes to a human."""

from __future__ import annotations

import grp
import os
import pwd
import secrets
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

DOVECOT = "/usr/sbin/dovecot"
IMAP_USER = "archive"
# The variable the demo's children read the archive's password from (the SMTP adapter's
# ``imap.password_env``): generated at each start, never in GATEWAY_PROVIDERS.
IMAP_PASSWORD_ENV = "DEMO_IMAP_PASSWORD"


def dovecot_missing(maildir: Path) -> str:
    """Why the demo runs no IMAP archive here ("" when it can)."""
    if not os.path.exists(DOVECOT):
        return f"{DOVECOT} is absent (apt-get install dovecot-imapd): mail lookups off"
    if os.geteuid() == 0:
        for path in [maildir, *maildir.parents]:
            if path.exists() and not path.stat().st_mode & stat.S_IXOTH:
                return f"Dovecot's unprivileged user cannot traverse {path}: mail lookups off"
    return ""


@dataclass(frozen=True)
class Archive:
    """A configured Dovecot: its command line, port and the password of its one user."""

    argv: list[str]
    port: int
    password: str


def dovecot_owner() -> tuple[int, int, str, str]:
    """Who Dovecot's processes and the mail run as: nobody as root, else ourselves (uid, gid,
    user, group)."""
    account = pwd.getpwnam("nobody") if os.geteuid() == 0 else pwd.getpwuid(os.getuid())
    group = grp.getgrgid(account.pw_gid).gr_name
    return account.pw_uid, account.pw_gid, account.pw_name, group


def configure_dovecot(root: Path, maildir: Path, port: int) -> Archive:
    """Write Dovecot's configuration under ``root`` for ``maildir`` on loopback ``port``."""
    uid, gid, _, _ = dovecot_owner()
    for sub in ("new", "cur", "tmp"):
        (maildir / sub).mkdir(parents=True, exist_ok=True)
    for path in (root / "run", root / "state", root / "home"):
        path.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    for path in [maildir, *maildir.iterdir(), root / "home"]:
        os.chown(path, uid, gid)
    password = secrets.token_urlsafe(16)
    passwd = root / "passwd"
    passwd.write_text(f"{IMAP_USER}:{{PLAIN}}{password}:{uid}:{gid}::{root / 'home'}\n")
    passwd.chmod(0o644)
    config = write_dovecot_config(root, maildir, port, instance="demo")
    return Archive([DOVECOT, "-F", "-c", str(config)], port, password)


def write_dovecot_config(
    root: Path,
    maildir: Path,
    port: int,
    *,
    instance: str,
    tls: tuple[int, Path, Path] | None = None,
) -> Path:
    """Write ``root/dovecot.conf``: Dovecot with only this configuration, its state under
    ``root``, the users of ``root/passwd`` (plain passwords), ``maildir`` as their mail, IMAP on
    loopback ``port``; with ``tls`` (IMAPS port, certificate, key) IMAPS too, else no TLS."""
    uid, _, user, group = dovecot_owner()
    if tls is None:
        ssl, imaps = "ssl = no", "port = 0"
    else:
        tls_port, cert, key = tls
        ssl = f"ssl = yes\nssl_cert = <{cert}\nssl_key = <{key}"
        imaps = f"address = 127.0.0.1\n    port = {tls_port}"
    config = root / "dovecot.conf"
    config.write_text(
        _CONFIG.format(
            root=root,
            maildir=maildir,
            port=port,
            instance=instance,
            user=user,
            group=group,
            first_uid=min(uid, 500) or 1,
            ssl=ssl,
            imaps=imaps,
        )
    )
    return config


def imap_ready(port: int):
    """The archive's readiness probe: it greets with ``* OK``."""

    def ready() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
                return sock.recv(64).startswith(b"* OK")
        except OSError:
            return False

    ready.__name__ = f"imap://127.0.0.1:{port}"
    return ready


def imap_option(port: int) -> dict[str, object]:
    """The SMTP adapter's ``imap`` option for the demo's archive. The SMTP server writes each
    message into the Maildir before it answers, so a "not found" needs no delivery grace."""
    return {
        "host": "127.0.0.1",
        "port": port,
        "tls": "none",
        "username": IMAP_USER,
        "password_env": IMAP_PASSWORD_ENV,
        "server_archives": True,
        "delivery_grace_seconds": 0,
    }


_CONFIG = """\
protocols = imap
listen = 127.0.0.1
base_dir = {root}/run
state_dir = {root}/state
log_path = {root}/dovecot.log
instance_name = effect-gateway-{instance}-{port}
default_internal_user = {user}
default_internal_group = {group}
default_login_user = {user}
first_valid_uid = {first_uid}
{ssl}
disable_plaintext_auth = no
auth_mechanisms = plain login
mail_location = maildir:{maildir}
passdb {{
  driver = passwd-file
  args = scheme=PLAIN {root}/passwd
}}
userdb {{
  driver = passwd-file
  args = {root}/passwd
}}
service imap-login {{
  chroot =
  inet_listener imap {{
    address = 127.0.0.1
    port = {port}
  }}
  inet_listener imaps {{
    {imaps}
  }}
}}
service anvil {{
  chroot =
}}
"""
