#!/usr/bin/env python
"""Django's command-line utility for the Effect Gateway.

With no DATABASE_URL / CELERY_BROKER_URL, a command runs on the embedded PostgreSQL and
Valkey under var/: started here when they are not running yet (and stopped when the command
ends), reused when they are (a `make demo` is running).
"""

import contextlib
import os
import sys
from pathlib import Path

# Commands that never touch the database or the broker: no servers for them.
NO_SERVERS = {"help", "--help", "-h", "version", "--version", "run_sandbox_provider"}


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")
    from django.core.management import execute_from_command_line

    from gateway import embedded

    command = sys.argv[1] if len(sys.argv) > 1 else "help"
    needs_servers = not (os.environ.get("DATABASE_URL") and os.environ.get("CELERY_BROKER_URL"))
    if command in NO_SERVERS or not needs_servers:
        execute_from_command_line(sys.argv)
        return
    var_dir = Path(os.environ.get("GATEWAY_VAR_DIR", Path(__file__).resolve().parent / "var"))
    with contextlib.ExitStack() as stack:
        try:
            env = stack.enter_context(embedded.for_command(var_dir))
        except embedded.EmbeddedError as exc:
            embedded.fail(exc)
        # The children a command starts (the demo's web, worker and beat) find them here too.
        os.environ.update(env)
        execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
