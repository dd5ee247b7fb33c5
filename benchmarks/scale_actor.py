"""The scale benchmark's actor behaviour (``scale_hosts_bench.py``), wrapped into an ``Actor``:
the benchmark actor's (``bench_actor.py``) and two endpoints of its own.

Worker processes import this module to rebuild the actor, so it imports nothing but the
standard library and ``bench_actor``.
"""

from __future__ import annotations

import threading
import time

from bench_actor import BenchBehavior

ENDPOINTS = ("ping", "pid", "tid", "incr", "total", "sleep")


class ScaleBehavior(BenchBehavior):
    """State and methods of the scale actor; every method in ``ENDPOINTS`` is an endpoint."""

    def tid(self) -> int:
        """Return the native id of the thread that runs this actor's handlers."""
        return threading.get_native_id()

    def sleep(self, seconds: float) -> None:
        """Block this actor for ``seconds`` (busy without burning a core)."""
        time.sleep(seconds)
