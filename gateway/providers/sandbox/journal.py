"""The sandbox's data file: an append-only JSON Lines journal of changes.

The first line is a header (``{"kind": "header", "format": 2}``); every later line is one
change, a JSON object whose ``kind`` says what it records (the provider defines the kinds and
replays them). Appends are flushed to the operating system but not fsynced: the sandbox
stands in for a provider in demos and tests, so a crash of the process loses nothing that
was answered, and a power cut may lose the last changes, which no demo or test relies on.

A crash in the middle of an append leaves at most a torn last line; reading drops it with a
warning and truncates the file to the last complete line, so the next append starts clean.
The file is rewritten whole only to compact it (:meth:`Journal.rewrite`): into a temporary
file in the same directory, then ``os.replace``, so a reader or a crash sees the old file or
the new one, never a mix.

A data file of the earlier single-object format (``{"format": 1, "operations": [...],
"log": [...], "resources": [...]}``) is read as the same changes, and the caller rewrites it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

FORMAT = 2
HEADER = {"kind": "header", "format": FORMAT}
_LEGACY_FORMAT = 1

logger = logging.getLogger(__name__)


@dataclass
class Contents:
    """What a data file holds: its changes in order (with their line numbers)."""

    records: list[tuple[int, dict[str, Any]]]
    rewrite: bool  # the file must be rewritten in the current format (new, empty or legacy)


class Journal:
    """One data file: read once at start, then appended to, and rewritten only to compact."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines = 0  # lines in the file, the header included
        self._handle: IO[str] | None = None

    def read(self) -> Contents:
        """The changes in the file; raises ``ValueError`` for a file that is not a journal.

        The file is checked whole before its tail is repaired, so a file that is not a
        journal is refused untouched.
        """
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return Contents(records=[], rewrite=True)
        lines = data.split(b"\n")
        tail = lines.pop()  # b"" when the file ends with a newline, as it should
        torn = bool(tail) and not _is_record(tail)
        if tail and not torn:
            lines.append(tail)  # complete, only its newline was lost
        numbered = [(n, line) for n, line in enumerate(lines, start=1) if line.strip()]
        if not numbered:
            if torn:
                raise ValueError(f"{self.path}: not a sandbox provider data file")
            return Contents(records=[], rewrite=True)
        first = _parse(numbered[0][1], where=f"{self.path}:{numbered[0][0]}")
        if first.get("format") == _LEGACY_FORMAT and "operations" in first and not torn:
            return Contents(records=_legacy_records(first), rewrite=True)
        if first != HEADER:
            raise ValueError(f"{self.path}: not a sandbox provider data file")
        records = [(n, _parse(line, where=f"{self.path}:{n}")) for n, line in numbered[1:]]
        if torn:
            logger.warning(
                "%s: ignored a torn last line (%d bytes), kept the %d lines before it",
                self.path,
                len(tail),
                len(lines),
            )
            os.truncate(self.path, len(data) - len(tail))
        elif tail:
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write("\n")
        self.lines = len(numbered)
        self._open()
        return Contents(records=records, rewrite=False)

    def append(self, lines: list[str]) -> None:
        """Append serialized changes with one write, flushed (see the module docstring)."""
        handle = self._open()
        handle.write("".join(f"{line}\n" for line in lines))
        handle.flush()
        self.lines += len(lines)

    def rewrite(self, records: Iterable[dict[str, Any]]) -> None:
        """Replace the file with the header and ``records``, atomically."""
        directory = self.path.parent
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=directory)
        count = 1
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(json.dumps(HEADER) + "\n")
                for record in records:
                    handle.write(json.dumps(record) + "\n")
                    count += 1
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self.close()  # the old handle points at the replaced file
        self.lines = count
        self._open()

    def _open(self) -> IO[str]:
        """The append handle, kept open so that a request never opens (or reads) the file."""
        if self._handle is None:
            self._handle = self.path.open("a", encoding="utf-8")
        return self._handle

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def _parse(line: bytes, *, where: str = "") -> dict[str, Any]:
    try:
        record = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{where}: not a JSON line ({exc}); only the last may be torn") from exc
    if not isinstance(record, dict) or not isinstance(record.get("kind", ""), str):
        raise ValueError(f"{where}: not a change (a JSON object with a string kind)")
    return record


def _is_record(line: bytes) -> bool:
    try:
        _parse(line)
    except ValueError:
        return False
    return True


def _legacy_records(state: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    records = [{"kind": "operation", **op} for op in state["operations"]]
    records += [{"kind": "log", **entry} for entry in state.get("log", [])]
    records += [{"kind": "resource", **item} for item in state.get("resources", [])]
    return [(1, record) for record in records]
