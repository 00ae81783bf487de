"""A log line for people: ``12:03:04 effect transition effect_id=eff_… from=PREPARED to=…``.

The demo's default (``LOG_FORMAT=text``); production keeps one JSON object a line.
"""

from __future__ import annotations

import logging

# The attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = [f"{k}={v}" for k, v in vars(record).items() if k not in _STANDARD]
        return " ".join([line, *fields]) if fields else line
