"""Tenant-written hook patterns, compiled with RE2.

Python's ``re`` backtracks: a pattern such as ``(a+)+$`` takes exponential time on a crafted
command, and tenants' admins write these patterns while agents write the commands. RE2
guarantees time linear in the input (it refuses the features that cannot be matched so:
back-references, look-around), so a bad pattern can be slow to write but never slow to run.
"""

from __future__ import annotations

from functools import lru_cache

import re2  # type: ignore[import-untyped]


class PatternError(ValueError):
    """Not a pattern RE2 accepts."""


@lru_cache(maxsize=512)
def compiled(pattern: str, *, ignore_case: bool = False):
    options = re2.Options()
    options.log_errors = False
    options.case_sensitive = not ignore_case
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        message = exc.args[0] if exc.args else exc
        if isinstance(message, bytes):
            message = message.decode("utf-8", "replace")
        raise PatternError(str(message)) from None


def search(pattern: str, text: str, *, ignore_case: bool = True) -> bool:
    return compiled(pattern, ignore_case=ignore_case).search(text) is not None


def fullmatch(pattern: str, text: str) -> bool:
    return compiled(pattern).fullmatch(text) is not None
