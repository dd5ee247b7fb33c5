"""Capturing what a rank writes, line by line, at the file-descriptor level.

``captured_output(sink)`` routes file descriptors 1 and 2 through pipes for the duration of a
script; threads cut what arrives into lines and hand them to ``sink("stdout" | "stderr",
lines)``. Output of C extensions and of child processes is captured too. ``regency run`` sends
the lines to the controller, which prints them with the rank's prefix.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator

from regency.spmd._script import restore_std_streams

Sink = Callable[[str, list[str]], None]

_STREAMS = {1: "stdout", 2: "stderr"}


def _pump(read_fd: int, stream: str, sink: Sink) -> None:
    """Hand the lines arriving on ``read_fd`` to ``sink`` until end of file."""
    pending = b""
    with os.fdopen(read_fd, "rb", buffering=0) as source:
        while True:
            chunk = source.read(65536)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            if lines:
                _deliver(sink, stream, lines)
    if pending:
        _deliver(sink, stream, [pending])


def _deliver(sink: Sink, stream: str, lines: list[bytes]) -> None:
    # If the controller went away, drop the output and keep the script going.
    with contextlib.suppress(Exception):
        sink(stream, [line.decode(errors="replace") for line in lines])


@contextlib.contextmanager
def captured_output(sink: Sink) -> Iterator[None]:
    """Send every line written to file descriptors 1 and 2 to ``sink`` while in the block.

    On exit the descriptors are restored and the pumps drained (up to 5 s: a child process of
    the script may still hold a pipe open).
    """
    restore_std_streams()
    saved: list[tuple[int, int]] = []
    pumps: list[threading.Thread] = []
    try:
        for fd, stream in _STREAMS.items():
            original = os.dup(fd)
            read_fd, write_fd = os.pipe()
            os.dup2(write_fd, fd)
            os.close(write_fd)
            saved.append((fd, original))
            pump = threading.Thread(
                target=_pump, args=(read_fd, stream, sink), name="regency-output", daemon=True
            )
            pump.start()
            pumps.append(pump)
        yield
    finally:
        restore_std_streams()
        for fd, original in saved:
            os.dup2(original, fd)  # closes the pipe's last write end: its pump sees EOF
            os.close(original)
        restore_std_streams()  # a stream closed with its descriptor is reopened now
        for pump in pumps:
            pump.join(5)
