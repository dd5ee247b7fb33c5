"""The actors of the fault-detection figure, written once and wrapped into each system's types.

A *victim* sits in a long call (``sleep``) when the benchmark SIGKILLs its process. An *owner*
spawns a victim of its own and, when it learns that the victim died (``__supervise__`` in the
Monarch API; in Ray, its ``ray.get`` of the victim's pending call raising), appends a JSON line
with the wall-clock time to a *stamp* file that the benchmark polls. ``time.time()`` is
comparable across the processes of one machine, so the benchmark subtracts the time it sent
SIGKILL at. Worker processes import this module, so it imports only the standard library.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import ModuleType
from typing import Any

VICTIM_NAME = "victim"
VICTIM_ENDPOINTS = ("pid", "sleep")


class VictimBehavior:
    """The actor that gets killed: it reports its pid, then blocks in ``sleep``."""

    def pid(self) -> int:
        """Return the process id that the benchmark will SIGKILL."""
        return os.getpid()

    def sleep(self, marker: str, seconds: float) -> str:
        """Create ``marker`` (the call has started), then block for ``seconds``."""
        Path(marker).touch()
        time.sleep(seconds)
        return "woke up: the process was not killed"


def record_failure(stamp: str, mesh_name: str, text: str) -> None:
    """Append ``{"t": time.time(), "mesh": ..., "text": ...}`` to ``stamp``, first thing."""
    now = time.time()
    line = json.dumps({"t": now, "mesh": mesh_name, "text": text[:300]}) + "\n"
    fd = os.open(stamp, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read_failures(stamp: Path) -> list[dict[str, Any]]:
    """Return the complete records in ``stamp`` so far (none if it does not exist yet)."""
    try:
        text = stamp.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def make_fault_classes(api: ModuleType) -> tuple[type, type]:
    """Return ``(Victim, Owner)`` actor classes for the Monarch API module ``api``.

    ``Owner(stamp)`` spawns one proc with a ``Victim`` in ``__init__``; ``arm(marker, seconds)``
    starts the victim's ``sleep`` and returns the victim's pid; ``__supervise__`` records every
    failure it is given with :func:`record_failure` and returns True (handled).
    """
    victim_class = type(
        "FaultVictim",
        (api.Actor, VictimBehavior),
        {name: api.endpoint(getattr(VictimBehavior, name)) for name in VICTIM_ENDPOINTS},
    )

    class FaultOwner(api.Actor):  # type: ignore[name-defined,misc]
        def __init__(self, stamp: str) -> None:
            self._stamp = stamp
            self._procs = api.this_host().spawn_procs(per_host={"gpus": 1})
            self._victim = self._procs.spawn(VICTIM_NAME, victim_class)
            self._pending: Any = None

        @api.endpoint  # type: ignore[misc]
        def arm(self, marker: str, seconds: float) -> int:
            pid = int(self._victim.pid.call_one().get())
            self._pending = self._victim.sleep.call_one(marker, seconds)
            return pid

        def __supervise__(self, failure: Any) -> bool:
            record_failure(self._stamp, str(getattr(failure, "mesh_name", "?")), str(failure))
            return True

    return victim_class, FaultOwner
