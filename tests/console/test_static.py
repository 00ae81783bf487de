"""The console's front end is served by the gateway itself: vendored htmx, no CDN, no build."""

import re
from pathlib import Path

from django.conf import settings
from django.contrib.staticfiles import finders

from tests.console.conftest import REFUND, submit


def test_vendored_htmx_is_a_static_file():
    path = finders.find("vendor/htmx.min.js")
    assert path, "static/vendor/htmx.min.js is vendored"
    assert Path(path).read_text()[:200].startswith("var htmx=")
    assert finders.find("console.css") and finders.find("console.js")


def test_pages_load_only_local_scripts_and_styles(oscar, bot):
    submit(bot.principal, REFUND)
    html = oscar.client.get("/").content.decode()
    sources = re.findall(r'(?:src|href)="([^"]+\.(?:js|css))"', html)
    assert sources and all(
        src.startswith(settings.STATIC_URL) or src.startswith("/static/") for src in sources
    )
    assert "//" not in "".join(sources)
