"""Small Markdown builders shared by the reference pages."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

GENERATED_NOTE = (
    '!!! note "Generated"\n'
    "    This page is generated from {source} when the site is built; edit the code, not "
    "the page.\n"
)


def header(title: str, intro: str, source: str) -> str:
    """A page's title, its introduction and the note naming the code it comes from."""
    return f"# {title}\n\n{intro.strip()}\n\n{GENERATED_NOTE.format(source=source)}\n"


def cell(text: object) -> str:
    """Text that is safe inside a table cell: one line, pipes escaped."""
    flat = re.sub(r"\s*\n\s*", " ", str(text)).strip()
    return flat.replace("|", "\\|")


def code(text: object) -> str:
    """An inline code span (also around text holding backticks)."""
    value = str(text)
    fence = "``" if "`" in value else "`"
    pad = " " if value.startswith("`") or value.endswith("`") else ""
    return f"{fence}{pad}{value}{pad}{fence}"


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table; an empty one is a sentence instead."""
    lines = [cell_row(headers), "|" + "---|" * len(headers)]
    body = [cell_row(row) for row in rows]
    if not body:
        return "(none)\n"
    return "\n".join(lines + body) + "\n"


def cell_row(values: Sequence[object]) -> str:
    return "| " + " | ".join(cell(value) for value in values) + " |"


def slug(text: str) -> str:
    """An anchor id made of lower-case letters, digits and dashes."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
