"""Helpers shared by the compatibility scenarios (implementation-neutral)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from compat_impl import actor

SPAWN_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0
CALL_TIMEOUT = 30.0

# Failures that reach the root client: Monarch's default hook exits the process, so the suite
# records them instead (conftest installs the recorder), and scenarios about the hook look here.
root_failures: list[Any] = []


class Failures:
    """The root failures recorded since this object was made."""

    def __init__(self) -> None:
        self.start = len(root_failures)

    def new(self) -> list[Any]:
        return root_failures[self.start :]

    def wait(self, n: int = 1, timeout: float = 30.0) -> list[Any]:
        wait_for(lambda: len(self.new()) >= n, timeout, f"{n} root failure(s)")
        return self.new()


def stop_quietly(mesh: Any) -> None:
    with contextlib.suppress(Exception):
        mesh.stop().get(timeout=STOP_TIMEOUT)


def spawn_procs(gpus: int, **kwargs: Any) -> Any:
    return actor.this_host().spawn_procs(per_host={"gpus": gpus}, **kwargs)


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``predicate`` until truthy: only for outcomes that offer no future to wait on."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)
