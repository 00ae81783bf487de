"""A web process lets a thread whose answer has come wait at most
``GATEWAY_WEB_SWITCH_INTERVAL_MS`` for its neighbours' Python (gateway.lib.switchinterval)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.conf import settings

_PROBE = """
import os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")
import gateway.ENTRY  # what the server imports in each of its processes
print(sys.getswitchinterval())
"""


def _interval_after_import(entry: str, **env: str) -> float:
    """The switch interval of a new process once it has imported ``gateway.<entry>``, with
    ``env`` (and nothing else) setting GATEWAY_WEB_SWITCH_INTERVAL_MS."""
    inherited = {k: v for k, v in os.environ.items() if k != "GATEWAY_WEB_SWITCH_INTERVAL_MS"}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.replace("ENTRY", entry)],
        cwd=settings.BASE_DIR,
        env={**inherited, "PYTHONWARNINGS": "ignore", **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return float(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("entry", ["wsgi", "asgi"])
def test_the_web_entry_points_shorten_the_switch_interval(entry):
    assert _interval_after_import(entry) == pytest.approx(0.001)  # Python's own is 0.005
    setting = {"GATEWAY_WEB_SWITCH_INTERVAL_MS": "2.5"}
    assert _interval_after_import(entry, **setting) == pytest.approx(0.0025)
