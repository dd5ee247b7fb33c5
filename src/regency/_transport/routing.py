"""One TCP port per machine: route preambles, and handing connections over to local processes.

Every dialer of a TCP listener first sends a route preamble, ``RGRT | u8 length | key``, naming
the process it wants (see :func:`~regency._transport.address.route_key`): ``""`` or the
listener's own key for the listening process itself, else one of the processes its host started.
The listener then either runs the authentication handshake itself or passes the socket, over a
``SOCK_SEQPACKET`` channel, to the process named, which runs the handshake as if it had accepted
the connection. The preamble is routing data only: nothing in it is trusted or unpickled, and the
handshake that follows authenticates the peer as usual.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable

from regency._errors import RegencyError
from regency._transport.bounded import BoundedDict
from regency._transport.ratelog import RateLimitedLog

log = logging.getLogger("regency.transport")

MAGIC = b"RGRT"
MAX_KEY = 255
HOLD_SECONDS = 30.0  # how long a connection for a process not started yet waits for it
# Connections held for processes not started yet: at most this many (per route key, and in all),
# the oldest going first, so connections naming made-up processes cannot pile up.
MAX_HELD_PER_KEY = 16
MAX_HELD = 64


class RouteError(RegencyError, ConnectionError):
    """A connection that did not start with a valid route preamble."""


def preamble(key: str) -> bytes:
    """The bytes a dialer sends first to reach process ``key`` of a host."""
    raw = key.encode()
    if len(raw) > MAX_KEY:
        raise RouteError(f"route key of {len(raw)} bytes is over {MAX_KEY}: {key!r}")
    return MAGIC + bytes([len(raw)]) + raw


class PreambleReader:
    """Parses a route preamble fed in pieces."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def missing(self) -> int:
        """How many more bytes the preamble has (read no more: what follows is not ours)."""
        head = len(MAGIC) + 1
        if len(self._buf) < head:
            return head - len(self._buf)
        return head + self._buf[len(MAGIC)] - len(self._buf)

    def feed(self, data: bytes) -> str | None:
        """Take bytes; return the key once the preamble is complete (``None`` until then)."""
        self._buf += data
        head = len(MAGIC) + 1
        if not self._buf[: len(MAGIC)] == MAGIC[: len(self._buf)]:
            raise RouteError("peer did not send a regency route preamble")
        if len(self._buf) < head:
            return None
        total = head + self._buf[len(MAGIC)]
        if len(self._buf) < total:
            return None
        if len(self._buf) > total:
            raise RouteError("peer sent data before its route was settled")
        return self._buf[head:total].decode(errors="replace")


def handoff_pair() -> tuple[socket.socket, socket.socket]:
    """A channel to hand connections over: (the host's end, the process's end)."""
    host, proc = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    host.setblocking(False)
    return host, proc


def receive(channel: socket.socket) -> list[socket.socket] | None:
    """The connections waiting on a handoff channel (non-blocking); ``None`` once it is closed."""
    received: list[socket.socket] = []
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(channel, 1, 8)
        except (BlockingIOError, InterruptedError):
            return received
        except OSError:
            data, fds = b"", []
        received.extend(socket.socket(fileno=fd) for fd in fds)
        if not data and not fds:
            return received or None


class Switchboard:
    """The host's side: which local process serves which route key, and connections that wait
    for a process that is about to start."""

    def __init__(self, call_later: Callable[[float, Callable[[], None]], None]) -> None:
        self._call_later = call_later
        self._lock = threading.Lock()
        self._channels: dict[str, socket.socket] = {}
        self._waiting: dict[str, list[tuple[float, socket.socket]]] = {}
        self._gone: BoundedDict[str, None] = BoundedDict()  # keys of ended processes
        self._log = RateLimitedLog(log)

    def register(self, key: str, channel: socket.socket) -> None:
        """Process ``key`` takes its connections through ``channel`` from now on."""
        with self._lock:
            self._channels[key] = channel
            waiting = self._waiting.pop(key, [])
        for _, sock in waiting:
            self._pass(key, channel, sock)

    def unregister(self, key: str) -> None:
        """Process ``key`` is gone: refuse its connections from now on."""
        with self._lock:
            channel = self._channels.pop(key, None)
            self._gone[key] = None
            waiting = self._waiting.pop(key, [])
        for _, sock in waiting:
            sock.close()
        if channel is not None:
            channel.close()

    def route(self, key: str, sock: socket.socket) -> None:
        """Hand ``sock`` to process ``key`` (now, or once it registers; else close it)."""
        evicted = None
        with self._lock:
            channel = self._channels.get(key)
            if channel is None:
                if key in self._gone:
                    self._log.warning("refused a connection for %r: that process is gone", key)
                    sock.close()
                    return
                first = not self._waiting
                evicted = self._make_room(key)
                self._waiting.setdefault(key, []).append((time.monotonic(), sock))
        if channel is None and evicted is not None:
            self._log.warning("refused a held connection: too many wait for processes not started")
            with contextlib.suppress(OSError):
                evicted.close()
        if channel is not None:
            self._pass(key, channel, sock)
        elif first:
            self._call_later(HOLD_SECONDS, self._expire)

    def _make_room(self, key: str) -> socket.socket | None:
        """Under the lock: take out the oldest held connection (of ``key``, else of any) when
        holding one more would pass ``MAX_HELD_PER_KEY`` or ``MAX_HELD``."""
        waiting = self._waiting.get(key, [])
        victims = None
        if len(waiting) >= MAX_HELD_PER_KEY:
            victims = key
        elif sum(len(w) for w in self._waiting.values()) >= MAX_HELD:
            victims = min(self._waiting, key=lambda k: self._waiting[k][0][0])
        if victims is None:
            return None
        group = self._waiting[victims]
        _, oldest = group.pop(0)
        if not group:
            del self._waiting[victims]
        return oldest

    def _pass(self, key: str, channel: socket.socket, sock: socket.socket) -> None:
        try:
            socket.send_fds(channel, [b"c"], [sock.fileno()])
        except OSError as exc:
            self._log.warning("could not hand a connection to %r: %s", key, exc)
        finally:
            sock.close()

    def _expire(self) -> None:
        now = time.monotonic()
        expired: list[tuple[str, socket.socket]] = []
        with self._lock:
            for key, waiting in list(self._waiting.items()):
                keep = [(t, s) for t, s in waiting if now - t < HOLD_SECONDS]
                expired.extend((key, s) for t, s in waiting if now - t >= HOLD_SECONDS)
                if keep:
                    self._waiting[key] = keep
                else:
                    del self._waiting[key]
            again = bool(self._waiting)
        for key, sock in expired:
            self._log.warning("refused a connection for %r: no such process started in time", key)
            with contextlib.suppress(OSError):
                sock.close()
        if again:
            self._call_later(HOLD_SECONDS, self._expire)

    def close(self) -> None:
        """Close every channel and waiting connection."""
        with self._lock:
            channels = list(self._channels.values())
            waiting = [s for group in self._waiting.values() for _, s in group]
            self._channels.clear()
            self._waiting.clear()
        for sock in (*channels, *waiting):
            with contextlib.suppress(OSError):
                sock.close()
