"""Liveness of TCP peers: a peer that falls silent is declared lost, at little cost when idle.

A process that is stopped, or a host cut off from the network, closes nothing: its peers see
neither an end of stream nor a reset. Two mechanisms find it:

- **The kernel**, on every TCP socket (:func:`regency._transport.address.tune_tcp`): keepalive
  probes on an idle connection and ``TCP_USER_TIMEOUT`` on unacknowledged data fail a
  connection whose link is cut (the socket reports ``ETIMEDOUT``), with no Python wake-up.
- **Heartbeat frames** (header only, consumed by the transport) between the processes that
  take part, which also find a peer the kernel still answers for but that is hung (stopped, its
  I/O thread blocked). On each connection the side that dialed asks: once every ``interval``,
  unless it both sent and received something since its last sweep, it sends a *ping*, which
  the other side answers at once. Both sides close a connection on which nothing at all arrived
  for ``timeout``. One sweep per process visits every connection (one timer, not one per
  connection); its pings go out together and their answers come back together, so the I/O loop
  wakes for many of them at once.

A *quiet* transport (a proc's: its host agent answers for it) takes no part on the connections
others dial to it or it dials to other procs: it says so once on each (a heartbeat flagged
:data:`QUIET`), answers no pings there and watches no silence, and its peers neither ping it
nor watch its silence. A proc that exits is reported by its host agent at once; a host that is
cut off or hung is found by the heartbeats on its agent's connection and takes its procs with
it; a proc's own links are watched by the kernel. Only where a proc dials a host agent itself
(an actor that spawns procs on another host) does it ping, as their owner must find that host
stopped too. What is given up: a proc that hangs while its host agent and links are fine is not
detected (as on one machine, where unix sockets carry no heartbeats either).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable

from regency._transport import address, frames
from regency._transport.connection import Connection, ConnectionClosedError

Settings = Callable[[], tuple[float, float]]  # (interval, timeout) in seconds, read every sweep

PING = 1  # flag: the sender asks for an answer
QUIET = 2  # flag: the sender takes no part in heartbeats (its host agent answers for it)


def beat(flags: int) -> bytes:
    """A heartbeat frame with ``flags`` (0: an answer)."""
    size = frames.HEADER.size - frames.LENGTH_PREFIX
    return frames.HEADER.pack(size, frames.KIND_HEARTBEAT, 0, flags, 0, 0, 0, 0)


_PING, _ANSWER, _QUIET = beat(PING), beat(0), beat(QUIET)


class Heartbeat:
    """Pings, answers and watches the silence of the TCP connections it is given."""

    def __init__(
        self,
        settings: Settings,
        connections: Callable[[], Iterable[Connection]],
        call_later: Callable[[float, Callable[[], None]], None],
        *,
        quiet: bool = False,
    ) -> None:
        self.settings = settings
        self.quiet = quiet
        self._connections = connections
        self._call_later = call_later
        # Per watched connection: its read and write counts at the last sweep, and since when
        # nothing arrived on it.
        self._last: dict[Connection, tuple[int, int, float]] = {}
        self._started = False
        self._start_lock = threading.Lock()
        self._stopped = False
        self.sweeps = 0  # statistics: sweeps run, pings sent, pings answered
        self.pings = 0
        self.answers = 0

    def adopted(self, conn: Connection, dialed: bool) -> None:
        """A new connection (this process ``dialed`` it, or accepted it): a quiet transport
        says so on it unless it dialed a host agent; otherwise the sweeps watch it, and ping on
        it if it was ``dialed``."""
        if not conn.tcp:
            return
        if self.quiet and not (dialed and _host_agent(conn.peer)):
            conn.beats = False
            with contextlib.suppress(ConnectionClosedError):
                conn.send([_QUIET], wait=False)
            return
        conn.asks = dialed
        with self._start_lock:  # connections are adopted on dialing threads and the I/O thread
            start, self._started = not self._started, True
        if start:
            self._call_later(self.settings()[0], self._sweep)

    def received(self, conn: Connection, flags: int) -> None:
        """A heartbeat with ``flags`` arrived on ``conn`` (on the thread that read it)."""
        if flags & QUIET:
            conn.peer_quiet = True
        elif flags & PING and conn.beats:
            try:
                conn.send([_ANSWER], wait=False)
            except ConnectionClosedError:
                return
            self.answers += 1

    def statistics(self) -> dict[str, int]:
        """Sweeps run, pings sent and answered so far, and how many connections the last sweep
        watched."""
        return {
            "sweeps": self.sweeps,
            "pings": self.pings,
            "answers": self.answers,
            "watched": len(self._last),
        }

    def stop(self) -> None:
        """Sweep no more."""
        self._stopped = True

    def _sweep(self) -> None:
        if self._stopped:
            return
        interval, timeout = self.settings()
        now = time.monotonic()
        last: dict[Connection, tuple[int, int, float]] = {}
        for conn in self._connections():
            if not conn.beats or conn.closed is not None or conn.peer_quiet:
                continue
            received, sent = conn.received, conn.sent
            seen = self._last.get(conn)
            heard = spoke = False
            since = now
            if seen is not None:
                heard, spoke = received != seen[0], sent != seen[1]
                if not heard:
                    since = seen[2]
                    if now - since >= timeout:
                        conn.close(f"no heartbeat from {conn.peer} for {now - since:.1f} s")
                        continue
            if conn.asks and not (heard and spoke):
                try:
                    conn.send([_PING], wait=False)
                except ConnectionClosedError:
                    continue
                self.pings += 1
                sent = conn.sent  # the ping itself is not news for the next sweep
            last[conn] = (received, sent, since)
        self._last = last
        self.sweeps += 1
        self._call_later(interval, self._sweep)


def _host_agent(peer: str) -> bool:
    """Whether ``peer`` is a host agent (a worker: ``tcp://host:port``, where a proc is
    ``tcp://host:port/NAME``)."""
    return address.is_tcp(peer) and not address.route_key(peer)
