"""What a host's procs write to stdout and stderr: kept in a file per proc, forwarded as lines.

When a proc's output is forwarded, its file descriptors 1 and 2 are pipes whose read ends this
host agent holds, so nothing the proc wrote before it crashed is lost with it. A thread of its
own (:class:`OutputPump`, not the I/O loop) reads every pipe, appends the bytes to the proc's log
file (``<log dir>/<proc mesh>-<rank>-<pid-less id>.log``, in a directory private to the user)
and hands each complete line to the proc's :data:`LineSink`. When the proc exits, :meth:`finish`
reads what is left in its pipes, hands over the last partial lines, closes the file and only
then runs the caller's continuation (the exit report), so the lines reach the controller before
the news of the exit does.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import selectors
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from regency._private_paths import private_dir, user_root

log = logging.getLogger("regency.host")

# (stream name, complete lines without their newline); runs on the pump's thread.
LineSink = Callable[[str, list[str]], None]

_STREAMS = ("stdout", "stderr")
KEEP_RUNS = 50  # run directories a host keeps; a new run removes the oldest beyond these
_READ = 65536


@dataclass
class _Stream:
    name: str
    fd: int
    pending: bytes = b""


@dataclass
class _Proc:
    addr: str
    sink: LineSink
    file: io.FileIO
    streams: list[_Stream] = field(default_factory=list)


def proc_log_root() -> Path:
    """Where this host keeps proc logs, one directory per controller run (its job id)."""
    return user_root() / "logs"


def proc_log_dir(job_id: str) -> Path:
    """This host's directory for the proc logs of job ``job_id``: under the temporary directory,
    private to the user at every level (another user could otherwise plant or read it). A new
    one prunes the oldest runs beyond :data:`KEEP_RUNS`."""
    root = proc_log_root()
    private_dir(root.parent)
    private_dir(root)
    path = root / job_id
    if not path.exists():
        _prune(root, KEEP_RUNS - 1)
    return private_dir(path)


def _prune(root: Path, keep: int) -> None:
    runs = sorted((p for p in root.iterdir() if p.is_dir() and not p.is_symlink()), key=_mtime)
    for old in runs[: max(0, len(runs) - keep)]:
        shutil.rmtree(old, ignore_errors=True)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


class OutputPump:
    """Reads the output pipes of this host's procs on a thread of its own."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._procs: dict[str, _Proc] = {}
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._requests: list[Callable[[], None]] = []
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="regency-output", daemon=True)
        self._thread.start()

    def attach(self, addr: str, path: Path, sink: LineSink) -> tuple[int, int]:
        """Pipes for a proc about to start, its output kept in the file ``path``: returns the
        write ends (its stdout and stderr, for the launcher, which closes them once the proc
        has them)."""
        fds = [os.pipe() for _ in _STREAMS]
        file = io.FileIO(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab")
        proc = _Proc(addr, sink, file)
        for name, (read_fd, _) in zip(_STREAMS, fds, strict=True):
            os.set_blocking(read_fd, False)
            proc.streams.append(_Stream(name, read_fd))

        def register() -> None:
            self._procs[addr] = proc
            for stream in proc.streams:
                self._selector.register(stream.fd, selectors.EVENT_READ, (proc, stream))

        self._call(register)
        return fds[0][1], fds[1][1]

    def finish(self, addr: str, then: Callable[[], None]) -> None:
        """The proc at ``addr`` has exited: read what is left, hand over its last lines, close
        its pipes and file, then run ``then`` (on the pump's thread)."""

        def drain() -> None:
            proc = self._procs.pop(addr, None)
            if proc is not None:
                for stream in proc.streams:
                    self._read(proc, stream, until_empty=True)
                self._close(proc)
            then()

        self._call(drain)

    def close(self) -> None:
        """Stop the thread after handing over what every proc's pipes still hold."""

        def stop() -> None:
            for proc in list(self._procs.values()):
                for stream in proc.streams:
                    self._read(proc, stream, until_empty=True)
                self._close(proc)
            self._procs.clear()
            self._closed = True

        self._call(stop)
        self._thread.join(timeout=5)

    # -- the thread ----------------------------------------------------------------------------

    def _call(self, fn: Callable[[], None]) -> None:
        with self._lock:
            self._requests.append(fn)
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def _run(self) -> None:
        proc: _Proc
        stream: _Stream
        while not self._closed:
            for key, _ in self._selector.select():
                if key.data is None:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                    with self._lock:
                        requests, self._requests = self._requests, []
                    for request in requests:
                        try:
                            request()
                        except Exception:
                            log.exception("output pump request failed")
                    continue
                proc, stream = key.data
                if self._procs.get(proc.addr) is proc:  # not finished meanwhile
                    self._read(proc, stream, until_empty=False)
        self._selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _read(self, proc: _Proc, stream: _Stream, until_empty: bool) -> None:
        while stream.fd >= 0:
            try:
                chunk = os.read(stream.fd, _READ)
            except BlockingIOError:
                return
            except OSError as exc:
                log.warning("reading the %s of %s failed: %s", stream.name, proc.addr, exc)
                chunk = b""
            if not chunk:  # every writer closed it: the proc (and its children) are done
                self._selector.unregister(stream.fd)
                os.close(stream.fd)
                stream.fd = -1
                self._flush_partial(proc, stream)
                return
            proc.file.write(chunk)
            data = stream.pending + chunk
            *lines, stream.pending = data.split(b"\n")
            if lines:
                self._hand_over(proc, stream.name, lines)
            if not until_empty:
                return

    def _flush_partial(self, proc: _Proc, stream: _Stream) -> None:
        if stream.pending:
            self._hand_over(proc, stream.name, [stream.pending])
            stream.pending = b""

    def _hand_over(self, proc: _Proc, name: str, lines: list[bytes]) -> None:
        try:
            proc.sink(name, [line.decode(errors="replace") for line in lines])
        except Exception:
            log.exception("forwarding output of %s failed", proc.addr)

    def _close(self, proc: _Proc) -> None:
        for stream in proc.streams:
            self._flush_partial(proc, stream)
            if stream.fd >= 0:
                self._selector.unregister(stream.fd)
                os.close(stream.fd)
                stream.fd = -1
        with contextlib.suppress(OSError):
            proc.file.close()
