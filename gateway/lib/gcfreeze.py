"""Keep the interpreter's collector off what a process loaded at start.

A web or worker process holds about 140,000 objects once Django, the apps and the URLconf are
loaded, and keeps them until it exits. Python's collector walks every tracked object at each
full (generation 2) pass, holding the interpreter lock, so every thread of the process waits:
in the benchmark's web processes those passes took 107-340 ms each on the busy cores and set
the submissions' p99. ``gc.freeze()`` moves them to a
permanent generation that no pass walks; a full pass then walks what was made since (about a
thousand objects: 2-9 ms). Garbage made while starting is collected first, not frozen.
"""

from __future__ import annotations

import gc


def freeze_startup_objects() -> int:
    """Collect, then freeze everything that survives; how many objects are now frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
