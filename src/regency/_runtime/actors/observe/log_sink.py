"""Where a proc mesh's forwarded output arrives: printed with where it came from, or aggregated.

Host agents send each proc's stdout and stderr lines (see :mod:`regency._runtime.host.output`)
to the :class:`LogSink` of its proc mesh, a port in the spawner's process. Every line is printed
to this process's ``sys.stdout`` or ``sys.stderr`` (the stream it was written to) behind a
prefix naming the proc mesh, the proc's point and its host: ``[trainers gpus=1 node2] ...``.

``ProcMesh.logging_option`` sets how: ``stream_to_client=False`` drops the lines here (the
procs' log files still have them); ``aggregate_window_sec=W`` gathers lines for ``W`` seconds
and prints each group of lines that are the same once their numbers are ignored as one line,
``[N similar log lines] <the first of them>``. Lines go out in the order they came, per proc and
stream; a stop of the mesh and the controller's exit print what a window still holds.
"""

from __future__ import annotations

import atexit
import contextlib
import pickle
import re
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from typing import TextIO

from regency._runtime.actors.base.future import Future
from regency._runtime.actors.control.control import SetLogLevel
from regency._runtime.kernel import state, wire
from regency._runtime.kernel.errors import PeerLostError
from regency._runtime.kernel.pending import Pending
from regency._runtime.kernel.refs import Part, PortRef
from regency.shape import Extent, Point

_DIGITS = re.compile(r"\d+")

_sinks: weakref.WeakSet[LogSink] = weakref.WeakSet()


def _point_text(point: Point) -> str:
    return ",".join(f"{label}={value}" for label, value in point.items()) or "rank=0"


class LogSink:
    """Port handler printing the forwarded lines of one proc mesh's procs."""

    def __init__(self, mesh_name: str, extent: Extent) -> None:
        self._mesh = mesh_name
        self._extent = extent
        self._lock = threading.Lock()
        self.stream_to_client = True
        self.window: float | None = None
        self._held: list[tuple[str, str, str]] = []  # (stream, prefix, line) in a window
        self._timer_set = False
        self.port: PortRef = state.runtime().open_port(self)
        _sinks.add(self)

    # -- lines in (I/O thread) ----------------------------------------------------------------

    def deliver(self, rank: int, flags: int, parts: Sequence[Part]) -> None:
        """One batch of lines of the proc at ``rank``: ``(stream, host, lines)``."""
        stream, host, lines = pickle.loads(parts[0])
        if not self.stream_to_client:
            return
        point = Point(rank, self._extent) if 0 <= rank < self._extent.nelements else None
        where = _point_text(point) if point is not None else f"rank={rank}"
        prefix = f"[{self._mesh} {where} {host}]"
        with self._lock:
            if self.window is None:
                _write(stream, "".join(f"{prefix} {line}\n" for line in lines))
                return
            self._held.extend((stream, prefix, line) for line in lines)
            start_timer = not self._timer_set
            self._timer_set = True
        if start_timer:
            state.runtime().loop.call_later(self.window, self.flush)

    def peer_lost(self, addr: str, reason: str) -> None:
        """Nothing to do: the sink watches no process."""

    # -- options and flushing -----------------------------------------------------------------

    def set_options(self, stream_to_client: bool, window: float | None) -> None:
        """Apply ``logging_option``; lines held by an earlier window are printed first."""
        self.flush()
        with self._lock:
            self.stream_to_client = stream_to_client
            self.window = window

    def flush(self) -> None:
        """Print what the current window holds (aggregated), now."""
        with self._lock:
            held, self._held = self._held, []
            self._timer_set = False
        if not held:
            return
        groups: dict[tuple[str, str], list[tuple[str, str]]] = {}
        for stream, prefix, line in held:
            groups.setdefault((stream, _DIGITS.sub("#", line)), []).append((prefix, line))
        by_stream: dict[str, list[str]] = {}
        for (stream, _), members in groups.items():
            prefix, line = members[0]
            count = f"[{len(members)} similar log lines] " if len(members) > 1 else ""
            by_stream.setdefault(stream, []).append(f"{count}{prefix} {line}\n")
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        for stream, text in by_stream.items():
            _write(stream, f">>> aggregated logs of {self._mesh} ({stamp}) >>>\n{''.join(text)}")

    def close(self) -> None:
        """Print what is held and stop taking lines."""
        self.flush()
        state.runtime().close_port(self.port.port)
        _sinks.discard(self)


def _write(stream: str, text: str) -> None:
    target: TextIO = sys.stderr if stream == "stderr" else sys.stdout
    try:
        target.write(text)
        target.flush()
    except (OSError, ValueError):  # a closed or broken stream: the lines are in the log files
        pass


def set_logging_option(
    sink: LogSink | None,
    addrs: Sequence[str],
    stream_to_client: bool,
    window: float | None,
    level: int,
) -> None:
    """``ProcMesh.logging_option``: check the values, set the sink, tell the procs the level."""
    if not 0 <= level <= 255:
        raise ValueError(f"Invalid logging level: {level}")
    if window is not None:
        if not stream_to_client:
            raise ValueError("aggregate_window_sec needs stream_to_client=True")
        if window <= 0:
            raise ValueError(f"aggregate_window_sec must be > 0 seconds, got {window!r}")
    if sink is not None:
        sink.set_options(stream_to_client, window)
    rt = state.runtime()
    for addr in addrs:
        with contextlib.suppress(PeerLostError):
            rt.send_control(addr, wire.SERVICE_PROC, SetLogLevel(level))


def flush_all() -> None:
    """Print what every sink of this process still holds (the controller's exit runs this)."""
    for sink in list(_sinks):
        sink.flush()


def flushed_after(stopped: Future[None], sink: LogSink) -> Future[None]:
    """``stopped``'s outcome, once ``sink`` has printed what it held and closed its port (a
    mesh's stop: its procs' last lines came before their exit reports, so they are all in)."""
    pending = Pending()

    def finish(done: Pending) -> None:
        sink.close()  # a stopped mesh sends no more lines: its port goes too
        error = done.error()
        if error is not None:
            pending.set_exception(error)
        else:
            pending.set_result(None)

    stopped._pending.add_done_callback(finish)
    return Future._from_pending(pending)


atexit.register(flush_all)
