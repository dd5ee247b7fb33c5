"""Rank-prefixed output.

Every line this process writes to stdout and stderr gets a prefix (``[rank3]: ...``, as
torchrun's ``--tee`` does) for the duration of a script.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator


def _pump(read_fd: int, out_fd: int, prefix: bytes) -> None:
    """Copy lines from ``read_fd`` to ``out_fd``, each with ``prefix``, until end of file."""
    pending = b""
    with os.fdopen(read_fd, "rb", buffering=0) as source:
        while True:
            chunk = source.read(65536)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            if lines:
                _write_all(out_fd, b"".join(prefix + line + b"\n" for line in lines))
    if pending:
        _write_all(out_fd, prefix + pending + b"\n")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except OSError:
            return  # the terminal or pipe went away: drop the output, keep the script going


@contextlib.contextmanager
def prefixed_output(prefix: str) -> Iterator[None]:
    """Route file descriptors 1 and 2 through threads that prefix each line with ``prefix``.

    Works at the file-descriptor level, so output of C extensions and child processes is
    prefixed too. Lines of one stream keep their order.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    tag = prefix.encode()
    saved: list[tuple[int, int]] = []
    pumps: list[threading.Thread] = []
    try:
        for fd in (1, 2):
            original = os.dup(fd)
            read_fd, write_fd = os.pipe()
            os.dup2(write_fd, fd)
            os.close(write_fd)
            saved.append((fd, original))
            pump = threading.Thread(
                target=_pump, args=(read_fd, original, tag), name="regency-output", daemon=True
            )
            pump.start()
            pumps.append(pump)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, original in saved:
            os.dup2(original, fd)  # closes the pipe's last write end: the pump sees EOF
        for pump, (_, original) in zip(pumps, saved, strict=False):
            pump.join(5)
            if not pump.is_alive():  # else a child process still holds the pipe: leave it
                os.close(original)
