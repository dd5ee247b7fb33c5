"""Waiting on, and counting, this process's shared-memory arena (the bulk tests share them)."""

from __future__ import annotations

import time
from collections.abc import Callable

from regency._runtime.kernel import state


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll ``condition`` until it holds or ``timeout`` seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return condition()


def arena_in_use() -> int:
    """Regions of this process's arena that receivers hold."""
    arena = state.runtime().bulk._arena
    return 0 if arena is None else len(arena._used)
