"""A web process keeps what it loaded at start out of the collector's full passes
(gateway.lib.gcfreeze): each such pass walked about 140,000 objects with the interpreter lock
held, and every request of the process waited for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from django.conf import settings

_PROBE = """
import gc, json, os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")
import gateway.wsgi  # what gunicorn imports in each of its processes
print(json.dumps({"frozen": gc.get_freeze_count(), "walked": len(gc.get_objects(generation=2))}))
"""


def test_the_web_entry_point_freezes_what_it_loaded():
    done = subprocess.run(
        [sys.executable, "-c", _PROBE],
        cwd=settings.BASE_DIR,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts["frozen"] > 50_000, counts  # Django, the apps, the URLconf
    # What a full pass still walks: what was made after the freeze (a few objects), not the
    # whole process.
    assert counts["walked"] < counts["frozen"] / 20, counts


def test_freezing_collects_the_garbage_first():
    import gc
    import weakref

    from gateway.lib.gcfreeze import freeze_startup_objects

    class Cycle:
        pass

    a, b = Cycle(), Cycle()
    a.other, b.other = b, a
    garbage = weakref.ref(a)
    del a, b
    alive = Cycle()
    assert any(obj is alive for obj in gc.get_objects())
    try:
        freeze_startup_objects()
        assert garbage() is None  # the unreachable cycle was collected, not frozen
        # ``alive`` left the generations a pass walks for the permanent one.
        assert not any(obj is alive for obj in gc.get_objects())
    finally:
        gc.unfreeze()
