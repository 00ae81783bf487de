"""A development secret kept in a file under ``var/``, made by whichever process needs it first.

Several processes start together (gunicorn's, a prefork pool's children, the test suite's
workers) and may all find the file missing. Each writes a secret of its own to a temporary
file beside it and links that into place: a link is atomic and fails when the name exists, so
exactly one secret wins, no process ever reads a half-written file, and the losers read the
winner's. The earlier ``O_CREAT | O_EXCL`` write raised ``FileExistsError`` in the loser (two
prefork children sealing their first receipts at once: the effect stayed DISPATCHING until its
lease ran out), and a reader could find the winner's file still empty.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def read_or_create(path: Path, make: Callable[[], str]) -> str:
    """The secret in ``path`` (stripped); ``make()`` written there first if there is none."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(make())
            handle.flush()
            os.fsync(handle.fileno())
        # FileExistsError: another process linked its secret first, and that one is the secret.
        with contextlib.suppress(FileExistsError):
            os.link(temporary, path)
    finally:
        os.unlink(temporary)
    return path.read_text().strip()
