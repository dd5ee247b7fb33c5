"""Timing sections of work on a worker (Monarch's ``monarch.timer``).

These are worker-side functions: a controller runs them on every worker of the active mesh as
remote functions, by import path, in order with the ops around them::

    from regency.tensor import remote

    timer_start = remote("regency.timer.execution_timer_start", propagate="inspect")
    timer_stop = remote("regency.timer.execution_timer_stop", propagate="inspect")
    average_ms = remote(
        "regency.timer.get_execution_timer_average_ms",
        propagate=lambda: torch.tensor(0.0, dtype=torch.float64),
    )

    with procs.activate():
        for _ in range(5):
            timer_start()
            y = x @ x
            timer_stop()
        print(regency.inspect(average_ms()))  # rank 0's mean, in milliseconds

On a worker with CUDA a section is timed with CUDA events on the current stream (the GPU time
of the kernels issued in it, read when the summary is asked for); with ``use_cpu=True`` or
without CUDA, by the wall clock (``time.perf_counter``) between start and stop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import torch

__all__ = [
    "ExecutionTimer",
    "execution_timer_start",
    "execution_timer_stop",
    "get_execution_timer_average_ms",
    "get_execution_timer_summary",
    "get_latest_timer_measurement",
    "get_time_perfcounter",
]

_DEFAULT = "default"
log = logging.getLogger(__name__)


def _section(name: str | None) -> str:
    return name or _DEFAULT


class ExecutionTimer:
    """Process-wide timings by section name (``"default"`` when none is given), in ms."""

    _lock: ClassVar[threading.Lock] = threading.Lock()
    _times: ClassVar[dict[str, list[float]]] = {}
    _open_cpu: ClassVar[dict[str, list[float]]] = {}
    _open_cuda: ClassVar[dict[str, list[Any]]] = {}
    _pending_cuda: ClassVar[dict[str, list[tuple[Any, Any]]]] = {}

    @classmethod
    @contextmanager
    def time(cls, name: str | None = None, use_cpu: bool = False) -> Iterator[None]:
        """Time the block as section ``name`` (``with ExecutionTimer.time("step"): ...``)."""
        cls.start(name, use_cpu)
        try:
            yield
        finally:
            cls.stop(name, use_cpu)

    @staticmethod
    def _cuda(use_cpu: bool) -> bool:
        return not use_cpu and torch.cuda.is_available()

    @classmethod
    def start(cls, name: str | None = None, use_cpu: bool = False) -> None:
        """Open a measurement of ``name`` (sections nest: each stop closes the latest start)."""
        section = _section(name)
        with cls._lock:
            cls._times.setdefault(section, [])
            if cls._cuda(use_cpu):
                begin = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                begin.record()
                cls._open_cuda.setdefault(section, []).append(begin)
            else:
                cls._open_cpu.setdefault(section, []).append(time.perf_counter())

    @classmethod
    def stop(cls, name: str | None = None, use_cpu: bool = False) -> None:
        """Close the latest open measurement of ``name``; ``RuntimeError`` if none is open."""
        section = _section(name)
        now = time.perf_counter()
        with cls._lock:
            if cls._cuda(use_cpu):
                opened = cls._open_cuda.get(section)
                if not opened:
                    raise RuntimeError(f"no timer section {section!r} was started on CUDA")
                end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                end.record()
                cls._pending_cuda.setdefault(section, []).append((opened.pop(), end))
                return
            started = cls._open_cpu.get(section)
            if not started:
                raise RuntimeError(f"no timer section {section!r} was started (start() first)")
            cls._times[section].append((now - started.pop()) * 1000.0)

    @classmethod
    def _settle(cls) -> None:
        """Wait for the closed CUDA measurements and move them into the timings."""
        for section, pairs in cls._pending_cuda.items():
            for begin, end in pairs:
                end.synchronize()
                cls._times[section].append(float(begin.elapsed_time(end)))
            pairs.clear()

    @classmethod
    def reset(cls) -> None:
        """Forget every timing and open measurement."""
        with cls._lock:
            for table in (cls._times, cls._open_cpu, cls._open_cuda, cls._pending_cuda):
                table.clear()

    @classmethod
    def summary(cls) -> dict[str, dict[str, float]]:
        """``{section: {count, mean_ms, total_ms, min_ms, max_ms}}`` of the measured sections."""
        with cls._lock:
            cls._settle()
            return {
                section: {
                    "count": len(times),
                    "mean_ms": sum(times) / len(times),
                    "total_ms": sum(times),
                    "min_ms": min(times),
                    "max_ms": max(times),
                }
                for section, times in cls._times.items()
                if times
            }

    @classmethod
    def get_latest_measurement(cls, name: str | None = None) -> float:
        """The last measurement of ``name`` in ms (0.0, with a warning, if it has none)."""
        section = _section(name)
        with cls._lock:
            cls._settle()
            times = cls._times.get(section)
            if not times:
                log.warning("timer section %r has no measurement", section)
                return 0.0
            return times[-1]


def execution_timer_start(name: str | None = None, use_cpu: bool = False) -> None:
    """`ExecutionTimer.start` (for ``remote("regency.timer.execution_timer_start")``)."""
    ExecutionTimer.start(name, use_cpu)


def execution_timer_stop(name: str | None = None, use_cpu: bool = False) -> None:
    """`ExecutionTimer.stop`."""
    ExecutionTimer.stop(name, use_cpu)


def get_execution_timer_average_ms(name: str = _DEFAULT) -> torch.Tensor:
    """The mean of section ``name`` in ms, as a float64 scalar tensor (``KeyError`` if none)."""
    found = ExecutionTimer.summary().get(name)
    if found is None:
        raise KeyError(f"timer section {name!r} has no measurement")
    return torch.tensor(found["mean_ms"], dtype=torch.float64)


def get_latest_timer_measurement(name: str | None = None) -> torch.Tensor:
    """The last measurement of section ``name`` in ms, as a float64 scalar tensor."""
    return torch.tensor(ExecutionTimer.get_latest_measurement(name), dtype=torch.float64)


def get_execution_timer_summary() -> dict[str, dict[str, float]]:
    """`ExecutionTimer.summary` (for ``remote(...).call()``, which returns every rank's)."""
    return ExecutionTimer.summary()


def get_time_perfcounter() -> torch.Tensor:
    """The worker's ``time.perf_counter()`` in seconds, as a float64 scalar tensor."""
    return torch.tensor(time.perf_counter(), dtype=torch.float64)
