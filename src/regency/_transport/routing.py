"""One TCP port per machine: route preambles, and handing connections over to local processes.

Every dialer of a TCP listener first sends a route preamble, ``MAGIC | u8 length | key``, naming
the process it wants (see :func:`~regency._transport.address.route_key`): ``""`` or the
listener's own key for the listening process itself, else one of the processes its host started.
The magic says what follows: ``RGRS`` TLS, ``RGRT`` the secret handshake in the clear (allowed
only where TLS does not apply, see :mod:`regency._transport.inbound`), and ``RGRV`` nothing: a
*reverse* connection (:mod:`regency._transport.reverse`), whose key is the token of the dial it
answers. The listener then either runs the authentication handshake itself or passes the socket,
over a ``SOCK_SEQPACKET`` channel, to the process named, which runs the handshake as if it had
accepted the connection. The preamble is routing data only: nothing in it is trusted or
unpickled, and the handshake that follows authenticates the peer as usual.

The handoff channel carries one message per record: ``A1``/``A0`` with a connection to
authenticate (with or without TLS), ``R`` + token with a reverse connection for the process's
dial waiting on that token, and, the other way, ``Q`` + token: the process asks its host for a
reverse connection.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from regency._errors import RegencyError
from regency._transport.bounded import BoundedDict
from regency._transport.io_loop import IOLoop
from regency._transport.ratelog import RateLimitedLog

log = logging.getLogger("regency.transport")

MAGIC = b"RGRT"  # the secret handshake follows in the clear
MAGIC_TLS = b"RGRS"  # TLS follows
MAGIC_REVERSE = b"RGRV"  # a reverse connection: the key is a token; the dialer waits
_MAGICS = (MAGIC, MAGIC_TLS, MAGIC_REVERSE)
MAX_KEY = 255
HOLD_SECONDS = 30.0  # how long a connection for a process not started yet waits for it
# Connections held for processes not started yet: at most this many (per route key, and in all),
# the oldest going first, so connections naming made-up processes cannot pile up.
MAX_HELD_PER_KEY = 16
MAX_HELD = 64
# Reverse dials a host's processes asked for and that are not answered yet: at most this many,
# the oldest forgotten first; each is forgotten after HOLD_SECONDS anyway.
MAX_REVERSE = 256
_RECORD = 64  # bytes of the largest handoff message


class RouteError(RegencyError, ConnectionError):
    """A connection that did not start with a valid route preamble."""


@dataclass(frozen=True, slots=True)
class Route:
    """A parsed preamble: the key, and what the dialer does next."""

    key: str
    tls: bool = False  # TLS follows
    reverse: bool = False  # a reverse connection: ``key`` is the hex token of the dial


def preamble(key: str, tls: bool = False) -> bytes:
    """The bytes a dialer sends first to reach process ``key`` of a host (``tls``: it starts
    TLS next)."""
    raw = key.encode()
    if len(raw) > MAX_KEY:
        raise RouteError(f"route key of {len(raw)} bytes is over {MAX_KEY}: {key!r}")
    return (MAGIC_TLS if tls else MAGIC) + bytes([len(raw)]) + raw


def reverse_preamble(token: bytes) -> bytes:
    """The bytes that open a reverse connection answering the dial waiting on ``token``."""
    raw = token.hex().encode()
    return MAGIC_REVERSE + bytes([len(raw)]) + raw


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

    def feed(self, data: bytes) -> Route | None:
        """Take bytes; return the route once the preamble is complete (``None`` until then)."""
        self._buf += data
        head = len(MAGIC) + 1
        start = bytes(self._buf[: len(MAGIC)])
        if not any(magic.startswith(start) for magic in _MAGICS):
            raise RouteError("peer did not send a regency route preamble")
        if len(self._buf) < head:
            return None
        total = head + self._buf[len(MAGIC)]
        if len(self._buf) < total:
            return None
        if len(self._buf) > total:
            raise RouteError("peer sent data before its route was settled")
        key = self._buf[head:total].decode(errors="replace")
        return Route(key, tls=start == MAGIC_TLS, reverse=start == MAGIC_REVERSE)


def handoff_pair() -> tuple[socket.socket, socket.socket]:
    """A channel to hand connections over: (the host's end, the process's end)."""
    host, proc = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    host.setblocking(False)
    return host, proc


@dataclass(frozen=True, slots=True)
class Handed:
    """One message from a handoff channel: ``kind`` (``A``, ``R`` or ``Q``), what follows it,
    and the connection it carries (``None`` for a request)."""

    kind: str
    data: bytes
    sock: socket.socket | None


def receive(channel: socket.socket) -> list[Handed] | None:
    """The messages waiting on a handoff channel (non-blocking); ``None`` once it is closed."""
    received: list[Handed] = []
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(channel, _RECORD, 8)
        except (BlockingIOError, InterruptedError):
            return received
        except OSError:
            data, fds = b"", []
        if not data and not fds:
            return received or None
        socks = [socket.socket(fileno=fd) for fd in fds]
        for extra in socks[1:]:  # one connection per message; anything more is not ours
            extra.close()
        kind = data[:1].decode(errors="replace")
        received.append(Handed(kind, bytes(data[1:]), socks[0] if socks else None))


def ask_reverse(channel: socket.socket, token: bytes) -> None:
    """From a process to its host: dial me back a reverse connection for ``token``."""
    channel.send(b"Q" + token)


class Switchboard:
    """The host's side: which local process serves which route key, connections that wait
    for a process that is about to start, and the reverse dials its processes asked for."""

    def __init__(
        self,
        call_later: Callable[[float, Callable[[], None]], None],
        loop: IOLoop | None = None,
        ask_reverse: Callable[[bytes], bool] | None = None,
    ) -> None:
        self._call_later = call_later
        # With both, the processes' requests for reverse connections are read and passed on.
        self._loop = loop
        self._ask_reverse = ask_reverse
        self._lock = threading.Lock()
        self._channels: dict[str, socket.socket] = {}
        self._waiting: dict[str, list[tuple[float, socket.socket, bool]]] = {}
        self._gone: BoundedDict[str, None] = BoundedDict()  # keys of ended processes
        self._reverse: BoundedDict[bytes, tuple[float, str]] = BoundedDict(MAX_REVERSE)
        self._log = RateLimitedLog(log)

    def register(self, key: str, channel: socket.socket) -> None:
        """Process ``key`` takes its connections through ``channel`` from now on."""
        with self._lock:
            self._channels[key] = channel
            waiting = self._waiting.pop(key, [])
        if self._loop is not None and self._ask_reverse is not None:
            self._loop.register(channel.fileno(), lambda _: self._requests(key, channel))
        for _, sock, tls in waiting:
            self._pass(key, channel, sock, b"A1" if tls else b"A0")

    def unregister(self, key: str) -> None:
        """Process ``key`` is gone: refuse its connections from now on."""
        with self._lock:
            channel = self._channels.pop(key, None)
            self._gone[key] = None
            waiting = self._waiting.pop(key, [])
        for _, sock, _ in waiting:
            sock.close()
        if channel is not None:
            self._close_channel(channel)

    def _close_channel(self, channel: socket.socket) -> None:
        if self._loop is not None:
            self._loop.unregister(channel.fileno())
        channel.close()

    def route(self, key: str, sock: socket.socket, tls: bool = False) -> None:
        """Hand ``sock`` to process ``key`` (now, or once it registers; else close it), which
        authenticates it, over TLS if ``tls``."""
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
                self._waiting.setdefault(key, []).append((time.monotonic(), sock, tls))
        if channel is None and evicted is not None:
            self._log.warning("refused a held connection: too many wait for processes not started")
            with contextlib.suppress(OSError):
                evicted.close()
        if channel is not None:
            self._pass(key, channel, sock, b"A1" if tls else b"A0")
        elif first:
            self._call_later(HOLD_SECONDS, self._expire)

    def reverse(self, token: bytes, sock: socket.socket) -> None:
        """A reverse connection arrived for ``token``: hand it to the process that asked."""
        with self._lock:
            asked = self._reverse.pop(token, None)
            channel = None if asked is None else self._channels.get(asked[1])
        if asked is None or channel is None or time.monotonic() - asked[0] > HOLD_SECONDS:
            self._log.warning("refused a reverse connection: no process here asked for it")
            sock.close()
            return
        self._pass(asked[1], channel, sock, b"R" + token)

    def _requests(self, key: str, channel: socket.socket) -> None:
        """Read what process ``key`` asks of its host (on the I/O thread)."""
        messages = receive(channel)
        if messages is None:  # the process is gone; its exit unregisters it
            if self._loop is not None:
                self._loop.unregister(channel.fileno())
            return
        for message in messages:
            if message.sock is not None:
                message.sock.close()
            if message.kind != "Q" or not message.data or self._ask_reverse is None:
                continue
            with self._lock:
                self._reverse[message.data] = (time.monotonic(), key)
            if not self._ask_reverse(message.data):
                with self._lock:
                    self._reverse.pop(message.data, None)

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
        _, oldest, _ = group.pop(0)
        if not group:
            del self._waiting[victims]
        return oldest

    def _pass(self, key: str, channel: socket.socket, sock: socket.socket, message: bytes) -> None:
        try:
            socket.send_fds(channel, [message], [sock.fileno()])
        except OSError as exc:
            self._log.warning("could not hand a connection to %r: %s", key, exc)
        finally:
            sock.close()

    def _expire(self) -> None:
        now = time.monotonic()
        expired: list[tuple[str, socket.socket]] = []
        with self._lock:
            for key, waiting in list(self._waiting.items()):
                keep = [w for w in waiting if now - w[0] < HOLD_SECONDS]
                expired.extend((key, w[1]) for w in waiting if now - w[0] >= HOLD_SECONDS)
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
            waiting = [w[1] for group in self._waiting.values() for w in group]
            self._channels.clear()
            self._waiting.clear()
            self._reverse.clear()
        for channel in channels:
            with contextlib.suppress(OSError):
                self._close_channel(channel)
        for sock in waiting:
            with contextlib.suppress(OSError):
                sock.close()
