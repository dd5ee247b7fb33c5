"""Fault detection with the Monarch actor API: ``--system regency`` or ``--system monarch``.

Runs the ``fault_detect`` figure (``figures.fig_fault_detect``): SIGKILL the process of an actor
that is blocked in a long call, then time (a) until the caller's pending ``call_one`` future
raises, and (b) until the ``__supervise__`` of the actor that spawned the victim's procs runs.
Every trial uses fresh procs. ``unhandled_fault_hook`` is replaced by one that ignores the
failure, so that those of meshes the benchmark itself owns (trials of kind a) do not end it.
Monarch detects a dead process by polling (about 10 s), so it gets 3 trials of each kind.

Usage: python benchmarks/fault_bench.py --system regency [--quick] [--progress events.jsonl]
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from actor_bench import MODULES, versions
from benchlib import export_bench_path
from fault_actor import VICTIM_NAME, make_fault_classes
from figures import FAULT_FIGURES, FaultAdapter, main

MAX_TRIALS = {"regency": None, "monarch": 3}
STOP_TIMEOUT_S = 30.0


def ignore_failure(failure: Any) -> None:
    """``unhandled_fault_hook`` of the benchmark: a failure reaching the root is expected."""


class MeshFaultAdapter:
    """:class:`figures.FaultAdapter` over ``this_host()`` proc meshes of one proc each."""

    def __init__(self, api: ModuleType, max_trials: int | None) -> None:
        self._api = api
        self._host = api.this_host()
        self._victim_class, self._owner_class = make_fault_classes(api)
        self.max_trials = max_trials
        api.unhandled_fault_hook = ignore_failure

    @contextmanager
    def _procs(self) -> Iterator[Any]:
        procs = self._host.spawn_procs(per_host={"gpus": 1})
        try:
            yield procs
        finally:
            # The mesh has a dead proc: stopping it may raise, and must not hang the figure.
            with contextlib.suppress(Exception):
                procs.stop().get(timeout=STOP_TIMEOUT_S)

    @contextmanager
    def pending_call(self, marker: str, seconds: float) -> Iterator[tuple[int, Any]]:
        """A victim mesh owned by this (root) client, and its ``sleep`` call_one future."""
        with self._procs() as procs:
            victim = procs.spawn(VICTIM_NAME, self._victim_class)
            pid = int(victim.pid.call_one().get())
            yield pid, victim.sleep.call_one(marker, seconds)

    def wait_failure(self, future: Any, timeout_s: float) -> BaseException:
        """``future.get(timeout=...)``, which must raise."""
        try:
            value = future.get(timeout=timeout_s)
        except Exception as exc:
            return exc
        raise AssertionError(f"the killed actor's call returned {value!r}")

    @contextmanager
    def owned_victim(self, marker: str, stamp: str, seconds: float) -> Iterator[int]:
        """An owner actor on a proc of its own; it spawns the victim's procs in ``__init__``."""
        with self._procs() as procs:
            owner = procs.spawn("owner", self._owner_class, stamp)
            yield int(owner.arm.call_one(marker, seconds).get())

    def close(self) -> None:
        """``shutdown_context().get()`` where the API has it."""
        shutdown = getattr(self._api, "shutdown_context", None)
        if shutdown is not None:
            shutdown().get()


def connector(system: str) -> Any:
    """Return the function that imports ``system``'s actor API and makes the adapter."""

    def connect() -> tuple[FaultAdapter, dict[str, Any]]:
        export_bench_path()
        start = time.perf_counter()
        api = importlib.import_module(MODULES[system])
        adapter = MeshFaultAdapter(api, MAX_TRIALS[system])
        # No "metrics" here: import and init times come from actor_bench.py.
        meta = {"versions": versions(system), "fault_connect_s": time.perf_counter() - start}
        return adapter, meta

    return connect


if __name__ == "__main__":
    sys.exit(main({s: connector(s) for s in MODULES}, figures=FAULT_FIGURES))
