"""The reference pages of the docs site, rendered from the code at build time so that they
cannot drift from it: settings, statuses and transitions, management commands, metrics and the
HTTP API. ``hook.py`` hands them to MkDocs; ``docs/internals/docs-site.md`` explains the whole.

Rendering imports the project with Django set up (``gateway.settings``) but opens no database
connection: every page reads Python definitions, argument parsers, the metric registry and
the OpenAPI generator.
"""

from __future__ import annotations

import os
from collections.abc import Callable

# The generated pages, by their path under docs/.
GENERATED = (
    "reference/settings.md",
    "reference/statuses.md",
    "reference/commands.md",
    "reference/metrics.md",
    "reference/api.md",
)


def setup_django() -> None:
    """Configure Django once (no database connection is opened)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")
    import django
    from django.apps import apps

    if not apps.ready:
        django.setup()


def renderers() -> dict[str, Callable[[], str]]:
    """Each generated page's path under docs/ and the function that renders it."""
    setup_django()
    from scripts.docs_reference import api, commands, metrics, settings, statuses

    pages: dict[str, Callable[[], str]] = {
        "reference/settings.md": settings.render,
        "reference/statuses.md": statuses.render,
        "reference/commands.md": commands.render,
        "reference/metrics.md": metrics.render,
        "reference/api.md": api.render,
    }
    assert tuple(pages) == GENERATED
    return pages


def render_all() -> dict[str, str]:
    """Every generated page's Markdown, by its path under docs/."""
    return {path: render() for path, render in renderers().items()}
