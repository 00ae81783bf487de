"""The docs site builds with ``mkdocs build --strict`` and the strictness bites: a broken link,
a missing anchor, a nav entry to a missing page and a page left out of the nav each fail the
build. Built from a copy of the nav's pages of docs/ in a temporary directory (stand-ins for
those the copy lacks), with the repository's mkdocs.yml and its reference hook; `make docs`
builds the real tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from django.conf import settings

ROOT = Path(settings.BASE_DIR)


def _nav_pages(nav: list) -> list[str]:
    pages: list[str] = []
    for entry in nav:
        values = entry.values() if isinstance(entry, dict) else [entry]
        for value in values:
            pages.extend(_nav_pages(value) if isinstance(value, list) else [value])
    return pages


def _site(tmp_path: Path) -> Path:
    """A copy of the site's sources; returns its mkdocs.yml."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    generated = {"reference/settings.md", "reference/statuses.md", "reference/commands.md"}
    generated |= {"reference/metrics.md", "reference/api.md"}
    pages = _nav_pages(config["nav"])
    # Only the nav's pages: the real tree's own completeness is `make docs`'s to check.
    for path in docs.rglob("*.md"):
        if str(path.relative_to(docs)) not in pages:
            path.unlink()
    for page in pages:
        path = docs / page
        if page not in generated and not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"# {page}\n\nA stand-in for the page.\n", encoding="utf-8")
    config["docs_dir"] = str(docs)
    config["site_dir"] = str(tmp_path / "site")
    config["hooks"] = [str(ROOT / hook) for hook in config["hooks"]]
    python = config["plugins"][1]["mkdocstrings"]["handlers"]["python"]
    python["paths"] = [str(ROOT / path) for path in python["paths"]]
    target = tmp_path / "mkdocs.yml"
    target.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return target


def _build(config: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=170,
    )


@pytest.mark.timeout(360)
def test_the_site_builds_strictly_and_fails_on_each_broken_reference(tmp_path):
    good = _site(tmp_path / "good")
    done = _build(good)
    assert done.returncode == 0, done.stderr[-3000:]
    site = tmp_path / "good" / "site"
    settings_page = (site / "reference" / "settings.html").read_text(encoding="utf-8")
    assert "GATEWAY_DISPATCH_LEASE" in settings_page
    client_page = (site / "reference" / "python-client.html").read_text(encoding="utf-8")
    assert "GatewayClient" in client_page
    # Highlighted as a Python console: the prompt is a token of its own, not a quote.
    assert '<span class="gp">&gt;&gt;&gt; </span>' in client_page
    assert "https://fonts.googleapis.com" not in (site / "index.html").read_text()

    bad = _site(tmp_path / "bad")
    docs = bad.parent / "docs"
    page = docs / "reference" / "index.md"
    page.write_text(
        page.read_text() + "\n[gone](no-such-page.md) and [lost](settings.md#no-such-anchor)\n",
        encoding="utf-8",
    )
    (docs / "internals" / "orphan.md").write_text("# Not in the nav\n", encoding="utf-8")
    config = yaml.safe_load(bad.read_text())
    config["nav"].append({"Missing": "missing.md"})
    bad.write_text(yaml.safe_dump(config, sort_keys=False))
    done = _build(bad)
    assert done.returncode != 0
    for complaint in ("no-such-page.md", "no-such-anchor", "missing.md", "orphan.md"):
        assert complaint in done.stderr, complaint
