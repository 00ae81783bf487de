"""The theme a reader chooses: its palettes are console.css's own (a choice shows exactly what
the system's scheme would), and its script runs before the body is parsed (no flash of the
other theme). The browser half is in test_browser_views.py."""

from __future__ import annotations

import re
from pathlib import Path

from django.contrib.staticfiles import finders

STATIC = Path(__file__).resolve().parents[2] / "static"
# Fonts are not part of a theme.
NOT_COLOURS = {"--mono", "--sans"}


def declarations(block: str) -> dict[str, str]:
    found = dict(re.findall(r"(--[a-z0-9-]+|color-scheme):\s*([^;]+);", block))
    return {name: value.strip() for name, value in found.items() if name not in NOT_COLOURS}


def system_palettes() -> tuple[dict[str, str], dict[str, str]]:
    css = (STATIC / "console.css").read_text()
    dark = re.search(r"^:root \{(.*?)^\}", css, re.S | re.M)
    light = re.search(r"@media \(prefers-color-scheme: light\) \{\s*:root \{(.*?)\}", css, re.S)
    assert dark and light
    return declarations(dark.group(1)), declarations(light.group(1))


def chosen_palette(theme: str) -> dict[str, str]:
    css = (STATIC / "console_views.css").read_text()
    block = re.search(rf':root\[data-theme="{theme}"\] \{{(.*?)\}}', css, re.S)
    assert block, theme
    return declarations(block.group(1))


def test_a_chosen_theme_is_the_systems_palette_exactly():
    dark, light = system_palettes()
    assert dark["color-scheme"] == "dark" and light["color-scheme"] == "light"
    assert len(dark) > 20
    assert chosen_palette("dark") == dark
    assert chosen_palette("light") == light


def test_the_theme_script_runs_before_the_body(oscar):
    assert finders.find("console_views.js") and finders.find("console_views.css")
    html = oscar.client.get("/").content.decode()
    head = html.split("<body")[0]
    tag = re.search(r'<script src="[^"]*console_views\.js"[^>]*>', head)
    assert tag, "console_views.js is loaded in <head>"
    assert "defer" not in tag.group(0) and "async" not in tag.group(0)
    # Its stylesheet comes after console.css, so that a chosen theme wins.
    assert head.index("console.css") < head.index("console_views.css")
    # The toggle is on every page of a signed-in user.
    assert 'id="theme-choice"' in html
