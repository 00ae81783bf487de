"""``python -m tests.benchmarks.bench [options]``: the bench (this package's doc), on the
servers of ``DATABASE_URL`` and ``CELERY_BROKER_URL``, or without them on the embedded
PostgreSQL and Valkey under ``var/`` (started for the run when they are not running, as
``manage.py`` starts them for a command; a running ``make demo``'s are reused)."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from tests.benchmarks.bench.options import BenchError, parse

ROOT = Path(__file__).resolve().parents[3]


def main(argv: list[str]) -> int:
    options = parse(argv)  # before any server starts: --help and bad options cost nothing
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")
    # The in-process count of round trips logs every transition at INFO; the figures are
    # what this prints (the product's processes log at WARNING to var/bench/ too).
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    from gateway import embedded

    with contextlib.ExitStack() as stack:
        if not (os.environ.get("DATABASE_URL") and os.environ.get("CELERY_BROKER_URL")):
            var_dir = Path(os.environ.get("GATEWAY_VAR_DIR", ROOT / "var"))
            try:
                env = stack.enter_context(embedded.for_command(var_dir))
            except embedded.EmbeddedError as exc:
                embedded.fail(exc)
            # The web nodes and workers the bench starts find them here too.
            os.environ.update(env)
        import django

        django.setup()
        from tests.benchmarks.bench.run import Bench

        try:
            Bench(options).run()
        except BenchError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
