"""``manage.py run_sandbox_provider``: the bundled sandbox provider (SPEC §6) in the foreground."""

import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from gateway.providers.sandbox import SandboxProvider, SandboxServer


class Command(BaseCommand):
    help = (
        "Run the sandbox provider (payments, inventory, shipping, deployments, tickets, mail) "
        "with its fault switches, until SIGINT or SIGTERM."
    )
    # A stand-in for an external system: it must start without a database or migrations.
    requires_system_checks: list[str] = []
    requires_migrations_checks = False

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, required=True, help="0 picks a free port")
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument(
            "--data-file",
            type=Path,
            default=None,
            help="keep operations and the log in this JSON Lines file (replayed on start)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            provider = SandboxProvider(data_file=options["data_file"])
        except (OSError, ValueError) as exc:
            raise CommandError(f"cannot load {options['data_file']}: {exc}") from exc
        try:
            server = SandboxServer(
                provider,
                host=options["host"],
                port=options["port"],
                verbose=options["verbosity"] >= 2,
            )
        except OSError as exc:
            where = f"{options['host']}:{options['port']}"
            raise CommandError(f"cannot listen on {where}: {exc}") from exc

        def stop(signum: int, frame: FrameType | None) -> None:
            # shutdown() waits for the serving loop, which runs in this (main) thread:
            # calling it from the signal handler directly would deadlock.
            threading.Thread(target=server.stop, daemon=True).start()

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, stop)
            signal.signal(signal.SIGTERM, stop)

        self.stdout.write(f"Sandbox provider listening on {server.url}")
        self.stdout.flush()
        server.serve_forever()
        self.stdout.write("Sandbox provider stopped")
