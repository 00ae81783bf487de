"""`manage.py demo`: the whole product on one machine, behind one command (`make demo`).

Migrates the database, seeds a demo tenant, then runs and supervises four processes: the
sandbox provider, the web server, a Celery worker and Celery beat. Each child gets its own
process group, so Ctrl-C reaches only this supervisor, which then stops them: SIGTERM to each
child, SIGKILL to whatever is left of its group after a grace period. With no DATABASE_URL /
CELERY_BROKER_URL, ``manage.py`` has started the embedded PostgreSQL and Valkey before this
command runs and stops them after it (``gateway.embedded``).

With ``--providers real``, billing goes to Stripe instead: a stripe-stateful-mock server (an
npm package pinned in ``scripts/stripe_server/``, installed with ``npm ci`` on first use) runs
as a fifth child, and email goes to a real SMTP server: aiosmtpd as a sixth child, keeping what
it accepts in a Maildir under ``var/`` (``var/demo-mail``). The children get
``GATEWAY_PROVIDERS`` entries that route the billing provider to Stripe through the Stripe
adapter and the mail provider to the SMTP server through the SMTP adapter
(``real_providers``). When Debian's Dovecot is installed, it serves that Maildir over IMAP as
a seventh child (``gateway.management.demo_mail``) and the SMTP adapter's lookups search it;
without it an email whose send is UNKNOWN cannot be looked up and goes to a human with its
Message-ID and SMTP transcript.

Quiet by default: one line per effect or saga state change (``--verbose`` for everything).
The sandbox keeps its operations in ``var/sandbox.json``, so a restart does not make the
reconciler think a committed operation was never received. Each principal keeps its token
across restarts (``var/demo-tokens.json``); the banner is also written to ``var/demo.txt``.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.management.color import supports_color
from django.db import connection, connections

from gateway import embedded
from gateway.api.auth import hash_token
from gateway.management import demo_incidents, demo_mail
from gateway.models import ApiToken

ROOT = Path(__file__).resolve().parents[3]
MANAGE_PY = str(ROOT / "manage.py")
HEALTH_TIMEOUT = 60.0
STOP_GRACE = 10.0
POLL = 0.25
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

DEMO_TENANT = "demo"
AGENT = "demo-agent"
# (principal, role, password): the people who log in to the console.
LOGINS = [
    ("alice", "approver", "alice-demo-pw"),
    ("oscar", "operator", "oscar-demo-pw"),
    ("admin", "admin", "admin-demo-pw"),
]
COLOURS = ["\033[36m", "\033[32m", "\033[33m", "\033[35m", "\033[34m"]
RESET = "\033[0m"
NAME_WIDTH = 7

# The first command the banner suggests: open a ticket in the sandbox's support queue.
DEMO_COMMAND = {
    "type": "ticket.create",
    "resource": {"type": "queue", "id": "support"},
    "payload": {"title": "Printer on fire", "priority": "P2"},
    "intent": {"summary": "open a ticket for the printer"},
    "expires_in": 300,
}

# --providers real: stripe-stateful-mock, a Stripe-compatible server (a development tool the
# product does not ship), and the test-mode key the demo gives the Stripe adapter.
STRIPE_SERVER_DIR = ROOT / "scripts" / "stripe_server"
STRIPE_ENTRY = STRIPE_SERVER_DIR / "node_modules" / "stripe-stateful-mock" / "dist" / "autostart.js"
STRIPE_KEY_ENV = "DEMO_STRIPE_SECRET_KEY"
STRIPE_TEST_KEY = "sk_test_effect_gateway_demo"  # the mock takes any sk_test_ key
# --providers real: aiosmtpd (a development dependency) as the mail server, its Maildir kept
# under var/, and the sender of the demo's emails.
SMTP_FROM = "gateway@demo.example.com"


# What the demo waits for before it prints the banner: a URL (or request) that answers 200, or
# a probe that says whether its server is ready.
Health = str | urllib.request.Request | Callable[[], bool]


@dataclass
class Child:
    """One supervised process: its name, command line, and the thread relaying its output."""

    name: str
    argv: list[str]
    colour: str = ""
    env: dict[str, str] = field(default_factory=dict)  # this child's own, over the shared
    process: subprocess.Popen[bytes] | None = None
    relay: threading.Thread | None = None

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        """The running process; only valid once `start_child` has run."""
        assert self.process is not None, f"{self.name} was never started"
        return self.process

    def exit_code(self) -> int | None:
        """The exit code once the process has exited, else None."""
        return None if self.process is None else self.process.poll()

    def is_running(self) -> bool:
        """True between a successful start and the process's exit."""
        return self.process is not None and self.process.poll() is None

    def describe_exit(self) -> str:
        """'exited with code N' or 'was killed by SIGXXX', for the operator."""
        code = self.exit_code()
        if code is not None and code < 0:
            return f"was killed by {signal.Signals(-code).name}"
        return f"exited with code {code}"


class ChildExited(Exception):
    """A child stopped while it should have been running."""

    def __init__(self, child: Child) -> None:
        """Remember which child stopped."""
        super().__init__(f"{child.name} {child.describe_exit()}")
        self.child = child


@dataclass
class StopSignal:
    """Set by SIGINT/SIGTERM/SIGHUP; a second signal asks to skip the grace period."""

    requested: threading.Event = field(default_factory=threading.Event)
    forced: threading.Event = field(default_factory=threading.Event)

    def handle(self, signum: int, frame: object) -> None:
        """Signal handler: first signal requests a stop, the next one forces it."""
        if self.requested.is_set():
            self.forced.set()
        self.requested.set()


class Command(BaseCommand):
    """Run the sandbox provider, web, worker and beat together, and stop them together."""

    help = (
        "Migrate, seed the demo tenant and run web + worker + beat + sandbox provider until Ctrl-C."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        """Declare the command's options."""
        parser.add_argument("--host", default="127.0.0.1", help="web server address")
        parser.add_argument("--port", type=int, default=8000, help="web server port")
        parser.add_argument("--sandbox-port", type=int, default=8765, help="sandbox provider port")
        parser.add_argument("--no-seed", action="store_true", help="skip the demo tenant")
        parser.add_argument(
            "--providers",
            choices=["sandbox", "real"],
            default="sandbox",
            help="'sandbox' (default): every provider on the sandbox; 'real': billing on "
            "Stripe (stripe-stateful-mock, needs node), email on SMTP (aiosmtpd), the others "
            "on the sandbox",
        )
        parser.add_argument(
            "--stripe-port", type=int, default=12111, help="the Stripe server's port (real)"
        )
        parser.add_argument(
            "--smtp-port", type=int, default=8025, help="the SMTP server's port (real)"
        )
        parser.add_argument(
            "--imap-port",
            type=int,
            default=8143,
            help="the IMAP archive's port (real, when Dovecot is installed)",
        )
        parser.add_argument(
            "--scenario",
            choices=["incidents", "none"],
            default="incidents",
            help="what to seed on first start: 'incidents' (default) gives the console what "
            "an on-call engineer meets; 'none' leaves it empty",
        )
        parser.add_argument(
            "--verbose", action="store_true", help="all logs, not one line per state change"
        )
        parser.add_argument(
            "--check",
            action="store_true",
            help="start everything, wait until healthy, print the banner, then stop",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        """Run the steps: check ports, migrate, seed, start, wait, banner, supervise, stop."""
        started = time.monotonic()
        host, port, sandbox_port = options["host"], options["port"], options["sandbox_port"]
        self.colour = options["force_color"] or (supports_color() and not options["no_color"])
        self.output_lock = threading.Lock()
        real = options["providers"] == "real"
        stripe_url = f"http://127.0.0.1:{options['stripe_port']}"
        smtp_port = options["smtp_port"]

        ensure_ports_free(
            [(host, port), ("127.0.0.1", sandbox_port)]
            + ([("127.0.0.1", options["stripe_port"]), ("127.0.0.1", smtp_port)] if real else [])
        )
        if real:
            self.stdout.write(f"==> billing on Stripe: stripe-stateful-mock at {stripe_url}")
            self.stdout.write(f"==> email on SMTP: aiosmtpd at 127.0.0.1:{smtp_port}")
            if demo_mail.dovecot_missing(mail_dir()):
                self.stdout.write(f"==> {demo_mail.dovecot_missing(mail_dir())}")
            ensure_stripe_server()
        self.stdout.write(f"==> {describe_servers()}")
        self.prepare_database()
        tokens = {} if options["no_seed"] else self.seed_demo_tenant()

        children = build_children(host, port, sandbox_port, verbose=options["verbose"])
        if real:
            children.insert(0, stripe_child(options["stripe_port"], verbose=options["verbose"]))
            mail = mail_servers(smtp_port, options["imap_port"])
            children[1:1] = mail.children
        for index, child in enumerate(children):
            child.colour = COLOURS[index % len(COLOURS)] if self.colour else ""
        base = console_url(host, port)
        sandbox_url = f"http://127.0.0.1:{sandbox_port}"
        health_urls: list[Health] = [
            f"{base}healthz",
            f"{sandbox_url}/_health",
        ]
        if real:
            health_urls += [stripe_health(stripe_url), *mail.health]

        stop = StopSignal()
        restore = install_signal_handlers(stop)
        try:
            env = child_environment(sandbox_port, verbose=options["verbose"])
            if real:
                env.update(mail.environment(stripe_url, smtp_port))
            for child in children:
                start_child(child, env, self.emit)
            wait_until_healthy(children, health_urls, stop)
            scenario = None
            if real:  # its faults are the sandbox's billing faults: billing is on Stripe
                scenario = "incidents not seeded: billing is on Stripe (--providers real)"
            elif tokens and options["scenario"] == "incidents" and not stop.requested.is_set():
                scenario = self.seed_incidents(base, sandbox_url, tokens, children, stop)
            if not stop.requested.is_set():
                self.print_banner(
                    base,
                    tokens,
                    scenario=scenario,
                    seconds=time.monotonic() - started,
                    stripe_url=stripe_url if real else None,
                    smtp_port=smtp_port if real else None,
                )
                if not options["check"]:
                    supervise(children, stop)
        except ChildExited as exc:
            self.emit("demo", "", str(exc))
            raise CommandError(str(exc)) from None
        finally:
            running = [child.name for child in children if child.is_running()]
            self.emit("demo", "", "stopping " + (", ".join(running) or "nothing"))
            stop_children(children, stop)
            restore()
        self.emit("demo", "", "all stopped")

    def seed_incidents(
        self,
        base: str,
        sandbox_url: str,
        tokens: dict[str, str],
        children: list[Child],
        stop: StopSignal,
    ) -> str:
        """Seed the incidents scenario once per database (a marker under var/ says it was)."""
        marker = var_dir() / "scenario-incidents.done"
        if marker.exists():
            return f"incidents seeded on an earlier start ({marker.name}; `make clean` resets)"
        self.stdout.write("==> seeding the incidents scenario (about 20 s)")
        try:
            summary = demo_incidents.seed(
                base=base,
                sandbox_url=sandbox_url,
                agent_token=tokens[AGENT],
                say=lambda line: self.emit("demo", "", line),
                alive=partial(_alive, children, stop),
            )
        except demo_incidents.ScenarioError as exc:
            self.emit("demo", "", f"incidents scenario incomplete: {exc}")
            return f"incidents scenario incomplete: {exc}"
        marker.write_text(summary + "\n")
        return summary

    def prepare_database(self) -> None:
        """Apply migrations and collect static files, quietly."""
        self.stdout.write(f"==> migrating the database ({connection.settings_dict['NAME']})")
        call_command("migrate", interactive=False, verbosity=0)
        # The console's CSS/JS is served by WhiteNoise from STATIC_ROOT when DEBUG is off.
        call_command("collectstatic", interactive=False, verbosity=0)
        connections.close_all()  # the children open their own connections

    def seed_demo_tenant(self) -> dict[str, str]:
        """Create the demo tenant's agent and console logins; return one token per principal,
        the same across restarts while the database keeps it (var/demo-tokens.json)."""
        self.stdout.write(f"==> seeding tenant {DEMO_TENANT!r}")
        path = var_dir() / "demo-tokens.json"
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError):
            saved = {}
        tokens = {}
        for name, role, password in [(AGENT, "agent", None), *LOGINS]:
            token = saved.get(name)
            if not (isinstance(token, str) and token_is_valid(name, token)):
                token = issue_token(name, role, password)
            tokens[name] = token
        write_private(path, json.dumps(tokens, indent=2) + "\n")
        connections.close_all()
        return tokens

    def emit(self, name: str, colour: str, line: str) -> None:
        """Write one line prefixed with a process name; safe to call from relay threads."""
        prefix = f"{name:<{NAME_WIDTH}} |"
        if colour:
            prefix = f"{colour}{prefix}{RESET}"
        with self.output_lock:
            self.stdout.write(f"{prefix} {line}")
            self.stdout.flush()

    def print_banner(
        self,
        base: str,
        tokens: dict[str, str],
        *,
        scenario: str | None,
        seconds: float,
        stripe_url: str | None = None,
        smtp_port: int | None = None,
    ) -> None:
        """Tell the operator where everything is and how to submit a first command; the same
        text goes to var/demo.txt, to find it again once the logs have scrolled it away."""
        lines = banner_lines(base, tokens, scenario=scenario, seconds=seconds)
        if stripe_url:
            lines[3:3] = [
                f"  Stripe     {stripe_url}  (stripe-stateful-mock; billing's charges and",
                f"             refunds: curl -u {STRIPE_TEST_KEY}: {stripe_url}/v1/refunds)",
            ]
        if smtp_port:
            lines[3:3] = [
                f"  SMTP       127.0.0.1:{smtp_port}  (aiosmtpd; the emails it accepted are in",
                f"             {mail_dir()}/new)",
            ]
        path = var_dir() / "demo.txt"
        write_private(path, "\n".join(lines) + "\n")
        bold = (lambda text: f"\033[1m{text}{RESET}") if self.colour else (lambda text: text)
        lines[0] = bold(lines[0])
        lines.insert(-1, f"This text is also in {path}.")
        text = "\n".join(["", "=" * 78, *lines, "=" * 78, ""])
        with self.output_lock:
            self.stdout.write(text)
            self.stdout.flush()


def banner_lines(
    base: str, tokens: dict[str, str], *, scenario: str | None, seconds: float
) -> list[str]:
    lines = [
        f"Effect Gateway demo is up (in {seconds:.0f} s)",
        f"  Console    {base}",
        f"  API        {base}api/v1/  (docs {base}api/docs/)",
    ]
    if tokens:
        lines.append("  Logins     (username / password)")
        lines += [
            f"    {f'{name}@{DEMO_TENANT}':<12} / {pw:<15} {role}" for name, role, pw in LOGINS
        ]
        lines += [
            f"  Agent token ({AGENT}), the same on every start:",
            f"    {tokens[AGENT]}",
            "  Tokens of the logins, for the API:",
            *[f"    {name:<6} {tokens[name]}" for name, _, _ in LOGINS if name in tokens],
            "",
            "  Submit a command:",
            f"    export GATEWAY_URL={base.rstrip('/')} GATEWAY_TOKEN={tokens[AGENT]}",
            f"    {curl_example()}",
        ]
        if scenario:
            lines += ["", f"  Scenario   {scenario}"]
    else:
        lines.append("  (--no-seed: no demo logins or token were created)")
    lines += ["", "Press Ctrl-C to stop."]
    return lines


def var_dir() -> Path:
    path = Path(getattr(settings, "VAR_DIR", ROOT / "var"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read: it holds tokens."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def token_is_valid(principal: str, token: str) -> bool:
    return ApiToken.objects.filter(
        token_hash=hash_token(token),
        revoked_at__isnull=True,
        principal__name=principal,
        principal__tenant__slug=DEMO_TENANT,
    ).exists()


def describe_servers() -> str:
    """Which database and broker the demo runs on, in a few words."""
    db = connection.settings_dict
    on_socket = str(db["HOST"]).startswith("/")
    database = (
        f"embedded PostgreSQL (data in {embedded.server_dir(var_dir()) / 'postgres'})"
        if on_socket
        else f"PostgreSQL at {db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"
    )
    broker = (
        "embedded Valkey"
        if settings.CELERY_BROKER_URL.startswith("redis+socket://")
        else settings.CELERY_BROKER_URL.split("@")[-1]
    )
    return f"database: {database}; broker: {broker}"


def issue_token(principal: str, role: str, password: str | None = None) -> str:
    """Run `issue_token` for the demo tenant and return the token it prints last."""
    argv = ["--tenant", DEMO_TENANT, "--principal", principal, "--role", role]
    if password is not None:
        argv += ["--password", password]
    out = io.StringIO()
    call_command("issue_token", *argv, stdout=out)
    lines = [line.strip() for line in out.getvalue().splitlines() if line.strip()]
    if not lines:
        raise CommandError(f"issue_token printed no token for {principal!r}")
    return lines[-1]


def curl_example() -> str:
    """A copy-paste curl that submits DEMO_COMMAND to $GATEWAY_URL with $GATEWAY_TOKEN."""
    body = json.dumps(DEMO_COMMAND, separators=(",", ":"))
    return (
        'curl -s -X POST "$GATEWAY_URL/api/v1/commands"'
        ' -H "Authorization: Bearer $GATEWAY_TOKEN"'
        ' -H "Idempotency-Key: demo-ticket-1"'
        ' -H "Content-Type: application/json"'
        f" -d '{body}'"
    )


def ensure_ports_free(addresses: list[tuple[str, int]]) -> None:
    """Fail early and clearly when a port is taken (often: another demo still running)."""
    for host, port in addresses:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            # The servers set SO_REUSEADDR too, so a socket in TIME_WAIT is no conflict.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as exc:
                raise CommandError(
                    f"cannot use {host}:{port} ({exc.strerror}): another demo may be running; "
                    'stop it or choose other ports: make demo DEMO_ARGS="--port 8001 '
                    '--sandbox-port 8766"'
                ) from None


LOOPBACK_HOSTS = frozenset({"0.0.0.0", "", "127.0.0.1", "::", "::1", "[::1]", "localhost"})


def browser_host(host: str) -> str:
    """The host name to put in URLs: a loopback or wildcard bind address is reached as
    `localhost`, because browsers give passkeys (WebAuthn) to a secure origin and to a host
    name, never to 127.0.0.1, and the seeded refunds wait for a passkey approval."""
    return "localhost" if host in LOOPBACK_HOSTS else host


def console_url(host: str, port: int) -> str:
    """The console's URL as the banner prints it."""
    return f"http://{browser_host(host)}:{port}/"


def build_children(host: str, port: int, sandbox_port: int, *, verbose: bool) -> list[Child]:
    """The four processes of the demo, in start order."""
    python = sys.executable
    schedule = var_dir() / "celerybeat-schedule"
    level = "INFO" if verbose else "WARNING"
    celery = [python, "-m", "celery", "-A", "gateway", *([] if verbose else ["--quiet"])]
    sandbox = [python, MANAGE_PY, "run_sandbox_provider", "--port", str(sandbox_port)]
    return [
        Child("sandbox", [*sandbox, "--data-file", str(var_dir() / "sandbox.json")]),
        Child(
            "web",
            [
                *[python, "-m", "gunicorn", "gateway.wsgi", "--bind", f"{host}:{port}"],
                *["--workers", "2", "--threads", "4", "--worker-class", "gthread"],
                *["--log-level", level.lower()],
            ],
        ),
        Child(
            "worker",
            [
                *celery,
                *["worker", "--loglevel", level, "--pool", "threads", "--concurrency", "4"],
                *["--prefetch-multiplier", "1", "-Q", "celery"],
            ],
        ),
        Child("beat", [*celery, "beat", "--loglevel", level, "--schedule", str(schedule)]),
    ]


def real_providers(
    stripe_url: str, *, smtp_port: int | None = None, imap_port: int | None = None
) -> dict[str, Any]:
    """``GATEWAY_PROVIDERS`` of ``--providers real``: billing on Stripe at ``stripe_url``, with
    the test-mode key from ``DEMO_STRIPE_SECRET_KEY`` and ``tok_visa`` as the card of charges
    that name none; mail on the SMTP server at loopback ``smtp_port`` (no STARTTLS, no AUTH:
    loopback only), its lookups in the IMAP archive at ``imap_port`` when there is one."""
    providers: dict[str, Any] = {
        "billing": {
            "adapter": "stripe",
            "base_url": stripe_url,
            "credential": {"env": STRIPE_KEY_ENV},
            "options": {"default_source": "tok_visa"},
        },
    }
    if smtp_port:
        providers["mail"] = {
            "adapter": "smtp",
            "base_url": f"smtp://127.0.0.1:{smtp_port}",
            "options": {"from_address": SMTP_FROM, "starttls": False},
        }
        if imap_port:
            providers["mail"]["options"]["imap"] = demo_mail.imap_option(imap_port)
    return providers


def real_providers_environment(
    stripe_url: str,
    *,
    smtp_port: int | None = None,
    imap_port: int | None = None,
    imap_password: str = "",
) -> dict[str, str]:
    """The children's variables for ``--providers real``: ``GATEWAY_PROVIDERS`` (entries the
    environment already has win over the demo's), the Stripe key (ours unless set) and the
    IMAP archive's password (when there is one)."""
    configured = json.loads(os.environ.get("GATEWAY_PROVIDERS") or "{}")
    demo = real_providers(stripe_url, smtp_port=smtp_port, imap_port=imap_port)
    environment = {
        "GATEWAY_PROVIDERS": json.dumps({**demo, **configured}),
        STRIPE_KEY_ENV: os.environ.get(STRIPE_KEY_ENV) or STRIPE_TEST_KEY,
    }
    if imap_password:
        environment[demo_mail.IMAP_PASSWORD_ENV] = imap_password
    return environment


@dataclass
class MailServers:
    """The demo's mail servers: aiosmtpd, and Dovecot as its IMAP archive when installed."""

    children: list[Child]
    health: list[Health]
    imap_port: int | None = None
    imap_password: str = ""

    def environment(self, stripe_url: str, smtp_port: int) -> dict[str, str]:
        return real_providers_environment(
            stripe_url,
            smtp_port=smtp_port,
            imap_port=self.imap_port,
            imap_password=self.imap_password,
        )


def mail_servers(smtp_port: int, imap_port: int) -> MailServers:
    """The SMTP child delivering into ``mail_dir()``, and the IMAP child serving it when
    Dovecot is installed (``gateway.management.demo_mail``)."""
    maildir = mail_dir()
    servers = MailServers([smtp_child(smtp_port, maildir)], [smtp_health(smtp_port)])
    if demo_mail.dovecot_missing(maildir):
        return servers
    ensure_ports_free([("127.0.0.1", imap_port)])
    archive = demo_mail.configure_dovecot(var_dir() / "demo-imap", maildir, imap_port)
    servers.children.append(Child("imap", archive.argv))
    servers.health.append(demo_mail.imap_ready(imap_port))
    servers.imap_port, servers.imap_password = imap_port, archive.password
    return servers


def mail_dir() -> Path:
    """The Maildir the demo's SMTP server delivers every message it accepts into."""
    return var_dir() / "demo-mail"


def smtp_child(port: int, maildir: Path) -> Child:
    """aiosmtpd on loopback ``port``, delivering what it accepts into ``maildir``."""
    for sub in ("new", "cur", "tmp"):
        (maildir / sub).mkdir(parents=True, exist_ok=True)
    return Child(
        "smtp",
        [
            sys.executable,
            *["-m", "aiosmtpd", "-n", "-l", f"127.0.0.1:{port}"],
            *["-c", "aiosmtpd.handlers.Mailbox", str(maildir)],
        ],
    )


def smtp_health(port: int) -> Callable[[], bool]:
    """The SMTP server's readiness probe: it greets with 220."""

    def ready() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
                return sock.recv(64).startswith(b"220")
        except OSError:
            return False

    ready.__name__ = f"smtp://127.0.0.1:{port}"
    return ready


def ensure_stripe_server() -> None:
    """Install stripe-stateful-mock (``npm ci`` in scripts/stripe_server/, the pinned version
    and its lock file) unless it is there; under a lock, so two installs never overlap."""
    if shutil.which("node") is None:
        raise CommandError("--providers real needs node (stripe-stateful-mock is a node server)")
    if STRIPE_ENTRY.exists():
        return
    if shutil.which("npm") is None:
        raise CommandError("--providers real needs npm once, to install stripe-stateful-mock")
    # The lock the tests' own install of the server takes too (tests/providers/stripe_mock.py).
    with open(Path(tempfile.gettempdir()) / "effect-gateway-stripe-mock-npm.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not STRIPE_ENTRY.exists():
            subprocess.run(
                ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=STRIPE_SERVER_DIR,
                check=True,
                timeout=300,
            )


def stripe_child(port: int, *, verbose: bool) -> Child:
    """stripe-stateful-mock on loopback ``port``, beside the sandbox."""
    level = "info" if verbose else "warn"
    return Child("stripe", ["node", str(STRIPE_ENTRY)], env={"PORT": str(port), "LOG_LEVEL": level})


def stripe_health(stripe_url: str) -> urllib.request.Request:
    """The Stripe server's readiness probe: its root answers 200 to an authenticated GET."""
    return urllib.request.Request(
        f"{stripe_url}/", headers={"Authorization": f"Bearer {STRIPE_TEST_KEY}"}
    )


def child_environment(sandbox_port: int, *, verbose: bool) -> dict[str, str]:
    """The children's environment: ours, unbuffered, pointed at the sandbox we start, and
    quiet unless --verbose (one text line per effect or saga state change)."""
    quiet = {
        "LOG_LEVEL": "WARNING",
        "LOG_TRANSITIONS_LEVEL": "INFO",
        # Celery's advice against root, eight lines at every start: the demo is local.
        "PYTHONWARNINGS": "ignore:You're running the worker with superuser privileges",
    }
    if verbose:
        quiet = {}
    return {
        "LOG_FORMAT": "text",
        # The demo's webhook receivers (the examples' LangGraph endpoint) run on loopback.
        "GATEWAY_WEBHOOK_ALLOW_PRIVATE": "true",
        **quiet,
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "GATEWAY_SANDBOX_URL": f"http://127.0.0.1:{sandbox_port}",
    }


def start_child(child: Child, env: dict[str, str], emit: Callable[[str, str, str], None]) -> None:
    """Start a child in its own process group with a thread relaying its output."""
    child.process = subprocess.Popen(
        child.argv,
        cwd=ROOT,
        env={**env, **child.env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        process_group=0,  # Ctrl-C goes to our group only; we stop the children ourselves
        # Should this supervisor be killed outright, the kernel stops the children too.
        preexec_fn=embedded.die_with_parent(signal.SIGTERM),
    )
    child.relay = threading.Thread(
        target=relay_output, args=(child, emit), name=f"relay-{child.name}", daemon=True
    )
    child.relay.start()


def relay_output(child: Child, emit: Callable[[str, str, str], None]) -> None:
    """Copy a child's output line by line, prefixed with its name, until the pipe closes."""
    pipe = child.proc.stdout
    assert pipe is not None  # started with stdout=PIPE
    with pipe:
        for raw in iter(pipe.readline, b""):
            emit(child.name, child.colour, raw.decode("utf-8", "replace").rstrip())


def install_signal_handlers(stop: StopSignal) -> Callable[[], None]:
    """Route SIGINT/SIGTERM/SIGHUP to `stop`; return a function restoring the old handlers."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None  # signal handlers can only be set from the main thread
    previous = {sig: signal.signal(sig, stop.handle) for sig in STOP_SIGNALS}

    def restore() -> None:
        """Put back the handlers that were there before."""
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


def _alive(children: list[Child], stop: StopSignal) -> bool:
    """The scenario's heartbeat: raise if a child died, False once a stop was asked for."""
    check_children(children)
    return not stop.requested.is_set()


def check_children(children: list[Child]) -> None:
    """Raise ChildExited for the first child that is no longer running."""
    for child in children:
        if child.exit_code() is not None:
            raise ChildExited(child)


def wait_until_healthy(children: list[Child], urls: list[Health], stop: StopSignal) -> None:
    """Poll each health URL until it answers 200; fail if a child dies or time runs out."""
    deadline = time.monotonic() + HEALTH_TIMEOUT
    for url in urls:
        while not stop.requested.is_set():
            check_children(children)
            if answers_ok(url):
                break
            if time.monotonic() > deadline:
                where = (
                    url.full_url
                    if isinstance(url, urllib.request.Request)
                    else getattr(url, "__name__", str(url))
                )
                raise CommandError(f"{where} did not answer 200 within {HEALTH_TIMEOUT:.0f}s")
            stop.requested.wait(POLL)


# No proxies: an HTTP proxy from the environment must not intercept loopback health checks.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def answers_ok(url: Health) -> bool:
    """True when a GET of `url` answers 200 within two seconds (a probe: when it says so)."""
    if callable(url):
        return url()
    try:
        with _DIRECT.open(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def supervise(children: list[Child], stop: StopSignal) -> None:
    """Block until a stop signal (return) or until any child exits (raise ChildExited)."""
    while not stop.requested.is_set():
        check_children(children)
        stop.requested.wait(POLL)


def stop_children(children: list[Child], stop: StopSignal) -> None:
    """SIGTERM every child, then SIGKILL whatever is left of its process group."""
    started = [child for child in children if child.process is not None]
    for child in started:
        if child.is_running():
            # The group leader only: Celery's worker then stops its pool itself (warm
            # shutdown); a SIGTERM to the whole group would kill pool processes mid-task.
            child.proc.terminate()
    deadline = time.monotonic() + STOP_GRACE
    while any(child.is_running() for child in started):
        if time.monotonic() > deadline or stop.forced.is_set():
            break
        time.sleep(0.1)
    for child in started:
        # A leader that ignored SIGTERM, or pool processes that outlived a crashed worker.
        signal_group(child, signal.SIGKILL)
        child.proc.wait()
    for child in started:
        if child.relay is not None:
            child.relay.join(timeout=2)


def signal_group(child: Child, sig: signal.Signals) -> None:
    """Send `sig` to the child's process group, ignoring a group that is already gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.proc.pid, sig)
