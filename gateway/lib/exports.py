"""Streamed exports of a list as CSV or JSON Lines: rows are written as they are read, so
a list of a million rows never sits in memory (the caller reads them from a server-side
cursor, ``QuerySet.iterator(chunk_size=…)``).

CSV cells that a spreadsheet would run as a formula (text starting with ``=``, ``+``, ``-``,
``@``, a tab or a carriage return) get a leading apostrophe (OWASP, "CSV Injection"); the
JSON Lines file carries the values as they are.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from django.http import StreamingHttpResponse

FORMATS = {
    "csv": "text/csv; charset=utf-8",
    "jsonl": "application/jsonl; charset=utf-8",
}

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")

# Rows written per chunk of the response: few enough to keep memory flat, enough that the
# server does not send a packet per row.
ROWS_PER_CHUNK = 200


def safe_cell(value: Any) -> Any:
    """A CSV cell that no spreadsheet evaluates: text that would start a formula is quoted."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, int | float):
        return value
    if not isinstance(value, str):
        value = json.dumps(value, sort_keys=True, default=str)
    if value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def csv_chunks(columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> Iterator[bytes]:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(columns)
    for count, row in enumerate(rows, start=1):
        writer.writerow([safe_cell(row.get(column)) for column in columns])
        if count % ROWS_PER_CHUNK == 0:
            yield buffer.getvalue().encode()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue().encode()


def jsonl_chunks(columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> Iterator[bytes]:
    lines: list[str] = []
    for row in rows:
        line = {column: row.get(column) for column in columns}
        lines.append(json.dumps(line, ensure_ascii=False, default=_json_default))
        if len(lines) == ROWS_PER_CHUNK:
            yield ("\n".join(lines) + "\n").encode()
            lines = []
    if lines:
        yield ("\n".join(lines) + "\n").encode()


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def export_response(
    *, fmt: str, filename: str, columns: Sequence[str], rows: Iterable[Mapping[str, Any]]
) -> StreamingHttpResponse:
    """The list as a streamed download named ``filename.<fmt>``; ``fmt`` is a key of FORMATS."""
    chunks = csv_chunks(columns, rows) if fmt == "csv" else jsonl_chunks(columns, rows)
    response = StreamingHttpResponse(chunks, content_type=FORMATS[fmt])
    response["Content-Disposition"] = f'attachment; filename="{filename}.{fmt}"'
    # The rows are the tenant's own data as of now: never kept by a cache.
    response["Cache-Control"] = "no-store"
    return response
