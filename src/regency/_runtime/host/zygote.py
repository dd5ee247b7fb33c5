"""A warm template process that forks procs: ``python -m regency._runtime.host.zygote``.

Starting a proc from a fresh interpreter costs about 100 ms of imports; forking this process,
which has already imported the runtime (``PRELOAD``: the actor API and everything under it),
costs a few milliseconds. The zygote is single-threaded
(so forking it is safe). It reads spawn requests from its control socket, forks a child per
request, answers with the child's pid, and reports each child's wait status when it exits.

``REGENCY_ZYGOTE_PRELOAD`` (comma-separated module names, e.g. ``torch``) makes the zygote import
those modules before it serves, so procs start with them loaded: forking after ``import torch``
saves every proc the seconds that import costs (``regency run`` sets ``torch``). A module that
fails to import is reported on stderr and skipped.

Control socket messages (pickled, length-prefixed both ways):
    host agent -> zygote : settings dict (one proc), with the spawner's current stdin, stdout
                           and stderr attached (so procs inherit them as a cold start would),
                           and the proc's end of its connection handoff channel
    zygote -> host agent : ("spawned", token, pid) | ("exited", pid, wait_status)
"""

from __future__ import annotations

import gc
import importlib
import os
import pickle
import selectors
import signal
import socket
import struct
import sys
from typing import Any

# Imported so that forked procs start with it loaded (and see PRELOAD below).
from regency._runtime.host import bootstrap

_LEN = struct.Struct("<I")
_FDS = 4  # stdin, stdout, stderr, handoff channel


def send_message(sock: socket.socket, message: Any, fds: list[int] | None = None) -> None:
    """Write one length-prefixed pickled message, optionally passing file descriptors."""
    body = pickle.dumps(message, protocol=5)
    data = _LEN.pack(len(body)) + body
    if fds:
        sent = socket.send_fds(sock, [data], fds)
        data = data[sent:]
    sock.sendall(data)


class MessageReader:
    """Cuts length-prefixed pickled messages out of a byte stream."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        """Add bytes; return the complete messages."""
        self._buf += data
        out = []
        while len(self._buf) >= _LEN.size:
            (size,) = _LEN.unpack_from(self._buf)
            if len(self._buf) < _LEN.size + size:
                break
            out.append(pickle.loads(bytes(self._buf[_LEN.size : _LEN.size + size])))
            del self._buf[: _LEN.size + size]
        return out


def _reap(control: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        send_message(control, ("exited", pid, status))


def main() -> None:
    """Serve spawn requests until the control socket closes."""
    zygote = os.getpid()
    try:
        _serve()
    except (BrokenPipeError, ConnectionResetError):
        if os.getpid() != zygote:  # a proc forked from here: its own failure, not ours
            raise
        # The host agent closed the control socket first: it is shutting down.


PRELOAD_ENV = "REGENCY_ZYGOTE_PRELOAD"
# Always preloaded: the actor API, and with it the whole runtime that bootstrap.serve runs and
# the actors of a proc use (named, not imported here: it is the layer above this one). Before,
# every proc imported it after the fork: ~160 ms of CPU each on a loaded 2-core machine.
PRELOAD = "regency.actor"


def preload(spec: str) -> None:
    """Import the comma-separated modules of ``spec`` (reporting, not raising, failures).

    The collector is off while they import (torch's import allocates enough to trigger dozens
    of passes, a tenth of its time) and what they made is then frozen: procs forked from here
    never scan those objects, so their collections stay short and leave the shared pages
    unwritten.
    """
    names = [part.strip() for part in spec.split(",") if part.strip()]
    if not names:
        return
    gc.disable()
    try:
        for name in names:
            try:
                importlib.import_module(name)
            except Exception as exc:
                print(
                    f"regency zygote: cannot preload {name!r}: {exc}", file=sys.stderr, flush=True
                )
    finally:
        gc.freeze()
        gc.enable()


def _serve() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    bootstrap.die_with_parent(int(sys.argv[2]))
    bootstrap.ignore_interrupts()
    # Spawn requests wait in the socket meanwhile; forked procs then start with these loaded.
    preload(f"{PRELOAD},{os.environ.get(PRELOAD_ENV, '')}")
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    reader = MessageReader()
    passed: list[int] = []  # the descriptors passed with each request (see _FDS)
    while True:
        for key, _ in selector.select():
            if key.fileobj is control:
                data, fds, _, _ = socket.recv_fds(control, 1 << 16, _FDS)
                if not data:
                    return
                passed.extend(fds)
                for settings in reader.feed(data):
                    settings["parent_pid"] = os.getpid()
                    mine, passed[:] = passed[:_FDS], passed[_FDS:]
                    settings["handoff_fd"] = mine[3]
                    pid = os.fork()
                    if pid == 0:
                        _become_proc(control, selector, wake_r, wake_w, settings, mine)
                    for fd in mine:
                        os.close(fd)
                    send_message(control, ("spawned", settings["token"], pid))
            else:
                os.read(wake_r, 4096)
                _reap(control)


def _become_proc(
    control: socket.socket,
    selector: selectors.BaseSelector,
    wake_r: int,
    wake_w: int,
    settings: dict[str, Any],
    fds: list[int],
) -> None:
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
        os.close(fd)
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    selector.close()
    control.close()
    os.close(wake_r)
    os.close(wake_w)
    bootstrap.die_with_parent(settings["parent_pid"])
    bootstrap.serve(settings)
    sys.exit(0)


if __name__ == "__main__":
    main()
