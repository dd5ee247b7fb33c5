"""The benchmark actor's behaviour, written once and wrapped into each system's actor type.

Worker processes import this module to rebuild the actor, so it imports nothing but ``os``.
"""

from __future__ import annotations

import os
from typing import Any

ENDPOINTS = ("ping", "pid", "incr", "total", "payload_len")


class BenchBehavior:
    """State and methods of the benchmark actor; every method is an endpoint."""

    def __init__(self) -> None:
        self.count = 0

    def ping(self) -> int:
        """Return at once: the cheapest possible request."""
        return 0

    def pid(self) -> int:
        """Return the worker's process id, for the RSS figure."""
        return os.getpid()

    def incr(self) -> None:
        """Count one broadcast."""
        self.count += 1

    def total(self) -> int:
        """Return how many broadcasts arrived."""
        return self.count

    def payload_len(self, payload: Any) -> int:
        """Return the payload's size in bytes (``nbytes`` for arrays, ``len`` for bytes)."""
        nbytes = getattr(payload, "nbytes", None)
        return int(nbytes) if nbytes is not None else len(payload)
