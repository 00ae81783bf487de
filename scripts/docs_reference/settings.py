"""docs/reference/settings.md: every environment variable gateway/settings.py reads, from the
registry its helpers fill (gateway.lib.env)."""

from __future__ import annotations

import json
from typing import Any

from scripts.docs_reference.markdown import code, header, slug, table

INTRO = """
Every setting is an environment variable, read once at start by `gateway/settings.py`. The
defaults run the whole product on one machine with nothing else installed (the embedded
PostgreSQL and Valkey, data under `var/`); production sets at least `DATABASE_URL`,
`CELERY_BROKER_URL`, `SECRET_KEY`, `GATEWAY_VAULT_KEY`, `GATEWAY_AUDIT_SIGNING_KEY` and
`GATEWAY_PRODUCTION=true`. A malformed value (a number that is not one, a boolean other than
`true`/`false`/`1`/`0`/`yes`/`no`/`on`/`off`) stops the process with the variable's name.
"""


def shown_default(value: Any) -> str:
    """A default as the table shows it."""
    if isinstance(value, bool):
        return code("true" if value else "false")
    if isinstance(value, int | float):
        return code(f"{value:g}")
    if isinstance(value, list):
        return code(",".join(value)) if value else "none"
    if isinstance(value, dict):
        return code(json.dumps(value)) if value else "none"
    return code(value) if value else "none"


def render() -> str:
    from gateway.lib.env import REGISTRY

    sections: dict[str, list[list[str]]] = {}
    for setting in REGISTRY.values():
        default = setting.shown if setting.shown is not None else shown_default(setting.default)
        meaning = setting.doc
        if setting.zero_turns_off and "0:" not in meaning:
            meaning += " 0 turns it off."
        sections.setdefault(setting.section, []).append(
            [code(setting.name), setting.kind, default, meaning]
        )
    index = ", ".join(f"[{title}](#{slug(title)})" for title in sections)
    parts = [header("Settings", INTRO, "`gateway/settings.py`"), f"Sections: {index}.\n"]
    for title, rows in sections.items():
        parts.append(f"## {title} {{#{slug(title)}}}\n")
        parts.append(table(["variable", "type", "default", "meaning"], rows))
    return "\n".join(parts)
