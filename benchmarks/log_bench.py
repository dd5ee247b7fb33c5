"""Log forwarding under load: how many lines per second the controller takes in, at what CPU.

``N`` procs on this machine (with ``enable_log_forwarding``) each print ``K`` lines as fast as
they can; the controller's output pump (the host agent is in its process here) reads every
proc's pipe, and its log sink prefixes and writes each line (to a counting sink instead of a
terminal, so the figure is regency's, not the terminal's). Measured from the broadcast until
the last line is in: lines/s, and the controller's CPU time over that wall time. Run once
streaming every line (``aggregate_window_sec=None``) and once aggregating (a 30 s window, so
every line is still held when the last one is in; then one flush prints the groups).

Usage: python benchmarks/log_bench.py [--procs 256] [--lines 200]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import sys
import threading
import time

from regency import config
from regency.actor import Actor, endpoint, this_host


class Printer(Actor):
    """Prints ``count`` numbered lines, flushed one by one (forwarded procs are line-buffered)."""

    @endpoint
    def burst(self, count: int) -> int:
        for i in range(count):
            print(f"proc {os.getpid()} line {i} of a burst of {count}")
        return count


class CountingStream(io.TextIOBase):
    """A text stream that counts the lines written to it and keeps nothing."""

    def __init__(self) -> None:
        self.lines = 0
        self._lock = threading.Lock()
        self._more = threading.Condition(self._lock)

    def write(self, text: str) -> int:
        """Count the newlines of ``text``."""
        with self._lock:
            self.lines += text.count("\n")
            self._more.notify_all()
        return len(text)

    def wait_for(self, lines: int, timeout: float) -> bool:
        """Block until ``lines`` lines were written (or ``timeout`` seconds pass)."""
        with self._lock:
            return self._more.wait_for(lambda: self.lines >= lines, timeout)


def _wait_held(procs: object, lines: int, timeout: float) -> bool:
    """Poll until the mesh's log sink holds ``lines`` lines in its window (benchmark only)."""
    sink = procs._log_sink  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout
    while len(sink._held) < lines:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(procs_count: int, lines: int, window: float | None) -> dict[str, float]:
    """One run: spawn, burst, wait for every line; the figures."""
    with config.configured(enable_log_forwarding=True):
        procs = this_host().spawn_procs(per_host={"procs": procs_count})
    try:
        printers = procs.spawn("printers", Printer)
        printers.initialized.get(timeout=600)
        procs.logging_option(stream_to_client=True, aggregate_window_sec=window).get()
        counter = CountingStream()
        real, sys.stdout = sys.stdout, counter  # type: ignore[assignment]
        try:
            cpu, start = _cpu(), time.monotonic()
            printers.burst.call(lines).get(timeout=600)
            if window is None:
                complete = counter.wait_for(procs_count * lines, 600)
            else:
                complete = _wait_held(procs, procs_count * lines, 600)
            wall, used = time.monotonic() - start, _cpu() - cpu
            if window is not None:
                procs._log_sink.flush()  # type: ignore[union-attr]  # what the window holds
        finally:
            sys.stdout = real
    finally:
        procs.stop().get(timeout=600)
    total = procs_count * lines
    return {
        "procs": procs_count,
        "lines": total,
        "complete": float(complete),
        "printed_lines": counter.lines,
        "wall_s": wall,
        "lines_per_s": total / wall,
        "controller_cpu_share": used / wall,
    }


def main() -> None:
    """Parse the command line, run both modes, print one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=256)
    parser.add_argument("--lines", type=int, default=200)
    args = parser.parse_args()
    result = {
        "streaming": measure(args.procs, args.lines, None),
        "aggregated": measure(args.procs, args.lines, 30.0),
        "load_average": os.getloadavg(),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
