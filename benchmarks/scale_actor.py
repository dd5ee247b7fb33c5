"""The scale benchmark's actor behaviour (``scale_hosts_bench.py``), wrapped into an ``Actor``.

Worker processes import this module to rebuild the actor, so it imports nothing but the
standard library.
"""

from __future__ import annotations

import os
import threading
import time

ENDPOINTS = ("ping", "pid", "tid", "incr", "total", "sleep")


class ScaleBehavior:
    """State and methods of the scale actor; every method is an endpoint."""

    def __init__(self) -> None:
        self.count = 0

    def ping(self) -> int:
        """Return at once: the cheapest possible request."""
        return 0

    def pid(self) -> int:
        """Return the worker's process id."""
        return os.getpid()

    def tid(self) -> int:
        """Return the native id of the thread that runs this actor's handlers."""
        return threading.get_native_id()

    def incr(self) -> None:
        """Count one broadcast."""
        self.count += 1

    def total(self) -> int:
        """Return how many broadcasts arrived."""
        return self.count

    def sleep(self, seconds: float) -> None:
        """Block this actor for ``seconds`` (busy without burning a core)."""
        time.sleep(seconds)
