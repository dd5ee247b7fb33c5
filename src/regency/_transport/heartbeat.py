"""Heartbeats on TCP connections: a peer that falls silent is declared lost.

A process that is stopped, or a host cut off from the network, closes nothing: its peers see
neither an end of stream nor a reset. So every ``interval`` seconds each TCP connection carries a
heartbeat frame (header only, consumed by the transport), and a connection on which nothing at
all arrived for ``timeout`` seconds is closed as lost. Unix connections need none of this: a
local process that dies closes its sockets, and its host agent sees its exit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from regency._transport import frames
from regency._transport.connection import Connection, ConnectionClosedError

Settings = Callable[[], tuple[float, float]]  # (interval, timeout) in seconds, read every beat

BEAT = frames.HEADER.pack(
    frames.HEADER.size - frames.LENGTH_PREFIX, frames.KIND_HEARTBEAT, 0, 0, 0, 0, 0, 0
)


class Heartbeat:
    """Sends heartbeats on, and watches the silence of, the TCP connections it is given."""

    def __init__(
        self,
        settings: Settings,
        connections: Callable[[], Iterable[Connection]],
        call_later: Callable[[float, Callable[[], None]], None],
    ) -> None:
        self.settings = settings
        self._connections = connections
        self._call_later = call_later
        self._seen: dict[Connection, tuple[int, float]] = {}
        self._stopped = False

    def start(self) -> None:
        """Beat every ``interval`` from now on (on the I/O thread)."""
        self._call_later(self.settings()[0], self._beat)

    def stop(self) -> None:
        """Beat no more."""
        self._stopped = True

    def _beat(self) -> None:
        if self._stopped:
            return
        interval, timeout = self.settings()
        now = time.monotonic()
        seen: dict[Connection, tuple[int, float]] = {}
        for conn in self._connections():
            if not conn.tcp or conn.closed is not None:
                continue
            count = conn.received
            last_count, since = self._seen.get(conn, (-1, now))
            if count != last_count:
                since = now
            elif now - since >= timeout:
                conn.close(f"no heartbeat from {conn.peer} for {now - since:.1f} s")
                continue
            seen[conn] = (count, since)
            try:
                conn.send([BEAT], wait=False)
            except ConnectionClosedError:
                continue
        self._seen = seen
        self._call_later(interval, self._beat)
