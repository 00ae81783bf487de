"""Threads of a worker process that serve until the process stops them (the dispatcher's
drainers, the reconciler's wakers): started together, stopped together within a deadline."""

from __future__ import annotations

import threading
import time
from typing import Self


class ServiceThreads:
    """``count`` daemon threads, each running ``_serve`` until ``stopping`` is set."""

    name = "service"

    def __init__(self, count: int) -> None:
        self.stopping = threading.Event()
        self.threads = [
            threading.Thread(target=self._serve, name=f"{self.name}_{index}", daemon=True)
            for index in range(count)
        ]

    def start(self) -> Self:
        for thread in self.threads:
            thread.start()
        return self

    def stop(self, timeout: float) -> None:
        """Ask every thread to stop and wait for them, ``timeout`` seconds in all."""
        self.stopping.set()
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _serve(self) -> None:
        raise NotImplementedError
