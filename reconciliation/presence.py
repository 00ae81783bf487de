"""Who else has an effect's page open: each view (and each poll of it, every few seconds)
says "I am here" in the cache, and the page lists the others seen in the last
``PRESENCE_WINDOW``. A hint between humans, never a lock: the cache may forget it."""

from __future__ import annotations

import time

from django.core.cache import cache

from gateway.models import Principal

PRESENCE_WINDOW = 30  # seconds: a few of the page's polls


def effect_viewers(*, effect_id: str, principal: Principal) -> tuple[str, ...]:
    """Record that ``principal`` is looking at the effect; return the others, by name."""
    key = f"console:viewers:{effect_id}"
    now = time.time()
    seen: dict[str, float] = cache.get(key) or {}
    seen = {name: at for name, at in seen.items() if now - at < PRESENCE_WINDOW}
    seen[principal.name] = now
    cache.set(key, seen, PRESENCE_WINDOW * 2)
    return tuple(sorted(name for name in seen if name != principal.name))
