"""A process's network presence: one listening address, authenticated connections by peer.

``Transport.send(peer, buffers)`` works whether or not a connection to ``peer`` exists yet: the
first send dials in the background (retrying while the peer process starts) and queued frames
follow in order once the handshake succeeds. Every received frame is handed to ``on_frame`` on
the I/O thread. A peer whose connection drops, or that cannot be reached before the deadline, is
reported once through ``on_peer_lost`` (with a reason that starts "cannot connect" or
"connection lost") and stays lost: a process never comes back at the same address. Only
:meth:`Transport.forget_lost` (a new process was attached there on purpose) undoes that.

Over TCP, each connection starts with a route preamble (:mod:`regency._transport.routing`), so a
host's single port reaches every process it started; a process whose peers are on another
machine reaches ``unix:`` addresses through the ``gateway`` of the controller's machine, or over
reverse connections the controller opens when it cannot be dialed (:mod:`regency._transport.
reverse`). Dialing is :mod:`regency._transport.outbound`; reading a connection's frames,
:mod:`regency._transport.receiving`. TCP connections are watched by the kernel and, unless
one end is ``quiet`` (a proc, whose host agent answers for it), by heartbeats
(:mod:`regency._transport.heartbeat`); they run mutual TLS 1.3 below the secret handshake
(:mod:`regency._transport.tls`); accepted connections are taken through authentication, within
bounds and one deadline, by :mod:`regency._transport.inbound`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence

from regency._errors import RegencyError
from regency._transport import address as addr
from regency._transport import outbound, reverse, routing
from regency._transport.bounded import BoundedDict
from regency._transport.connection import Buffer, Connection, ConnectionClosedError
from regency._transport.frames import Frame
from regency._transport.heartbeat import Heartbeat, Settings
from regency._transport.inbound import Inbound
from regency._transport.io_loop import IOLoop
from regency._transport.names import Named
from regency._transport.ratelimit import FailureLimiter
from regency._transport.receiving import FrameHandler, reading
from regency._transport.tls import Stream

log = logging.getLogger("regency.transport")

LostHandler = Callable[[str, str], None]

_HANDSHAKE_TIMEOUT = 10.0
# How long the I/O thread lets a burst of posted frames gather before it flushes them (a
# thread that blocks, or a full outbox, flushes sooner).
FLUSH_DELAY = 300e-6
# A post this soon after the last one ended is part of a burst: its frames are coalesced.
BURST_WINDOW = 100e-6
DEFAULT_HEARTBEAT = (1.0, 5.0)


class PeerUnreachableError(RegencyError, ConnectionError):
    """A peer process could not be reached, or its connection was lost; ``peers`` names the
    lost ones where a send to several peers raised it."""

    def __init__(self, message: str, peers: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.peers = tuple(peers)


class Transport:
    """Listens on one address and keeps authenticated connections to peers."""

    def __init__(
        self,
        listen_address: str,
        secret: bytes,
        on_frame: FrameHandler,
        on_peer_lost: LostHandler,
        *,
        frame_limit: int,
        connect_timeout: float,
        loop: IOLoop | None = None,
        heartbeat: Settings = lambda: DEFAULT_HEARTBEAT,
        quiet: bool = False,
        handoff: socket.socket | None = None,
    ) -> None:
        self.secret = secret
        # Other secrets a dialer may prove (a worker serving a controller takes both).
        self.accepted: tuple[bytes, ...] = ()
        self.frame_limit = frame_limit
        self.connect_timeout = connect_timeout
        # How peers are reached that are not a plain connect away (gateway, forwards, reverse).
        self.paths = outbound.Paths()
        # Takes TCP connections routed to another process of this host.
        self.router: routing.Switchboard | None = None
        self._waits = reverse.Waits()  # this process's dials waiting for a reverse connection
        self._reverse_peer: str | None = None  # who opens them (None: ask through the host)
        self._dial_secrets: dict[str, tuple[bytes, float]] = {}
        self.auth_failures = FailureLimiter()
        self._listeners: list[socket.socket] = []
        self._on_frame = on_frame
        self._on_peer_lost = on_peer_lost
        self.loop = loop or IOLoop()
        self._lock = threading.Lock()
        self._peers: dict[str, outbound.Peer] = {}
        self._lost: dict[str, str] = BoundedDict()
        self._conns: set[Connection] = set()
        self._dirty: set[Connection] = set()
        self._dirty_lock = threading.Lock()
        self._flush_pending = False
        self._last_post = 0.0  # when the last post() ended (0: a thread has waited since)
        self._closing = False
        self.heartbeat = Heartbeat(
            heartbeat, self._tcp_connections, self.loop.call_later, quiet=quiet
        )
        self._handoff = handoff
        self._inbound = Inbound(
            self.loop,
            lambda: (self.secret, *self.accepted),
            self._authenticated,
            self._route_elsewhere,
            self._tune,
            limiter=lambda: self.auth_failures,
        )
        if addr.is_tcp(listen_address) and addr.route_key(listen_address):
            self.address = listen_address  # reached through this machine's host
        else:
            listener, self.address = addr.listen(listen_address)
            self._add_listener(listener)
        if handoff is not None:
            handoff.setblocking(False)
            self.loop.register(handoff.fileno(), self._on_handoff)

    @property
    def gateway(self) -> str | None:
        """Where ``unix:`` peers are reached from another machine (``None``: they are local,
        or reached over reverse connections)."""
        return self.paths.gateway

    @gateway.setter
    def gateway(self, value: str | None) -> None:
        self.paths.gateway = value

    def use_reverse(self, on: bool, through: str | None = None) -> None:
        """Reach ``unix:`` peers (the controller's machine) over reverse connections (``on``),
        asking peer ``through`` (the controller) for them, or this process's host when
        ``None``; or stop doing so."""
        self.paths.reverse = self._reverse_dial if on else None
        self._reverse_peer = through if on else None

    def _add_listener(self, listener: socket.socket) -> None:
        self._listeners.append(listener)
        self._inbound.listen(listener, routed=listener.family != socket.AF_UNIX)

    def listen_tcp(self, ip: str) -> str:
        """Also accept TCP connections on ``ip`` (any free port); return that address."""
        listener, address = addr.listen(addr.tcp_address(ip, 0))
        self._add_listener(listener)
        return address

    def prepare_peer(self, peer: str, secret: bytes, connect_timeout: float) -> None:
        """Dial ``peer`` (when first needed) proving ``secret``, giving up after
        ``connect_timeout`` seconds."""
        with self._lock:
            self._dial_secrets[peer] = (secret, connect_timeout)

    def job_secrets(self) -> list[bytes]:
        """The secrets this process proves to peers other than its own job's (job secrets of
        workers it attached), each once."""
        with self._lock:
            found = {secret for secret, _ in self._dial_secrets.values()}
        found.discard(self.secret)
        return sorted(found)

    def is_local(self, peer: str) -> bool:
        """Whether ``peer`` runs on this machine (reached over a unix socket)."""
        return peer.startswith("unix:") and not self.paths.remote_unix()

    def _tcp_connections(self) -> list[Connection]:
        with self._lock:
            return [c for c in self._conns if c.tcp]

    # -- sending -------------------------------------------------------------------------------

    def send(
        self,
        peer: str,
        buffers: Sequence[Buffer],
        wait: bool = True,
        named: Named | None = None,
    ) -> None:
        """Send one frame's buffers to ``peer``; :class:`PeerUnreachableError` if it is lost.

        With ``wait`` the call returns once the bytes are in the kernel (the caller may then
        reuse its buffers); without it, buffers that cannot go out at once are copied.
        ``named``: the part the frame names (flagged :data:`~.names.FLAG_NAMED`), which goes
        out in full first on a connection that has not carried it.
        """
        entry = self._peers.get(peer)
        conn = entry.conn if entry is not None else None
        if conn is None:
            conn, item = self._connection_or_queue(peer, buffers, wait, named)
            if item is not None:
                if item.done is not None:
                    item.done.wait()
                    if not item.sent:
                        reason = self._lost.get(peer, "connection failed")
                        raise PeerUnreachableError(f"cannot reach {peer}: {reason}")
                return
        assert conn is not None
        try:
            conn.send(buffers, wait, named)
        except ConnectionClosedError as exc:
            raise PeerUnreachableError(str(exc)) from exc

    def post(
        self,
        frames: Sequence[tuple[str, Sequence[Buffer], int]],
        named: Sequence[Named | None] = (),
    ) -> None:
        """Send small frames, one per ``(peer, buffers, size in bytes)``, coalescing bursts;
        ``named`` lists, frame by frame, the part each names (as for :meth:`send`), if any.

        The frames of one call are one message's (to several peers): they are judged together,
        all part of a burst or all sent at once. The caller must not touch the buffers again.
        Frames posted in a burst go out together on the next flush: when the outbox fills, when
        a thread is about to wait (:meth:`flush`), or shortly after on the I/O thread. A lost
        peer does not keep the frames to the others from going out:
        :class:`PeerUnreachableError` names every lost one afterwards (``peers`` lists them).

        A burst is told by the sender, not by each connection: a post that begins within
        ``BURST_WINDOW`` of the end of the last one, with no wait in between. (Judged per
        connection, a stream of casts to N peers stopped being one beyond about 16 peers, the
        time between two frames to the same peer growing with N: every frame went out alone
        and woke its receiver.)
        """
        burst = time.monotonic() - self._last_post < BURST_WINDOW
        peers = self._peers
        lost: list[str] = []
        lost_peers: list[str] = []
        for index, (peer, buffers, size) in enumerate(frames):
            entry = peers.get(peer)
            conn = entry.conn if entry is not None else None
            part = named[index] if named else None
            try:
                if conn is None:
                    self.send(peer, buffers, False, part)
                    continue
                schedule = conn.post(buffers, size, burst, part)
            except (ConnectionClosedError, PeerUnreachableError) as exc:
                lost.append(str(exc))
                lost_peers.append(peer)
                continue
            if schedule:
                self._mark_dirty(conn)
        self._last_post = time.monotonic()
        if lost:
            raise PeerUnreachableError("; ".join(lost), lost_peers)

    def post_one(self, peer: str, buffers: Sequence[Buffer], size: int) -> None:
        """:meth:`post` of one frame (the commonest message: a call, a reply)."""
        entry = self._peers.get(peer)
        conn = entry.conn if entry is not None else None
        if conn is None:
            self.post(((peer, buffers, size),))
            return
        try:
            if conn.post(buffers, size, time.monotonic() - self._last_post < BURST_WINDOW):
                self._mark_dirty(conn)
        except ConnectionClosedError as exc:
            raise PeerUnreachableError(str(exc), (peer,)) from exc
        finally:
            self._last_post = time.monotonic()

    def _mark_dirty(self, conn: Connection) -> None:
        with self._dirty_lock:
            self._dirty.add(conn)
            first = not self._flush_pending
            self._flush_pending = True
        if first:
            self.loop.call_later(FLUSH_DELAY, self.flush)

    def flush(self) -> None:
        """Send every frame waiting in an outbox; the next post starts afresh (a thread that
        flushes is about to wait: what it sends next is not part of a burst)."""
        self._last_post = 0.0
        if not self._flush_pending:
            return
        with self._dirty_lock:
            dirty, self._dirty = self._dirty, set()
            self._flush_pending = False
        for conn in dirty:
            with contextlib.suppress(ConnectionClosedError):
                conn.flush()

    def _connection_or_queue(
        self, peer: str, buffers: Sequence[Buffer], wait: bool, named: Named | None
    ) -> tuple[Connection | None, outbound.Queued | None]:
        """The peer's connection, or (while dialing) the queue entry the frame was put in."""
        with self._lock:
            reason = self._lost.get(peer)
            if reason is not None:
                raise PeerUnreachableError(f"cannot reach {peer}: {reason}")
            entry = self._peers.get(peer)
            if entry is None:
                entry = self._peers[peer] = outbound.Peer()
                threading.Thread(
                    target=self._dial, args=(peer, entry), name="regency-dial", daemon=True
                ).start()
            if entry.conn is not None:
                return entry.conn, None
            # Without wait the caller may reuse its memory once we return: keep a copy.
            kept: list[Buffer] = list(buffers) if wait else [bytes(b) for b in buffers]
            item = outbound.Queued(kept, threading.Event() if wait else None, named)
            entry.queue.append(item)
            return None, item

    def forget_lost(self, peer: str) -> None:
        """A new process listens at ``peer`` (the kernel may give a fresh listener the TCP port
        of a process lost earlier): the next send dials it instead of failing."""
        with self._lock:
            self._lost.pop(peer, None)

    def mark_lost(self, peer: str, reason: str) -> None:
        """Declare ``peer`` gone (e.g. its process exited): stop dialing it, fail queued sends."""
        with self._lock:
            if peer in self._lost:
                return
            self._lost[peer] = reason
            entry = self._peers.pop(peer, None)
            queue = entry.queue if entry is not None else []
            if entry is not None:
                entry.queue = []
        if entry is not None and entry.conn is not None:
            entry.conn.close(reason)
        for item in queue:
            item.finish(sent=False)

    def _connect(self, peer: str, secret: bytes, timeout: float) -> Stream:
        """A connected, authenticated socket to ``peer`` (see :mod:`.outbound`)."""
        return outbound.connect(peer, secret, timeout, self.address, self.paths, self._tune)

    # -- reverse connections (see regency._transport.reverse) ----------------------------------

    def ask_reverse(self, token: bytes) -> bool:
        """Ask for a reverse connection for ``token``: of the controller (a worker serving one
        that cannot be dialed), or of this process's host (a proc there). ``False`` when there
        is no one to ask."""
        entry = self._peers.get(self._reverse_peer) if self._reverse_peer is not None else None
        if entry is not None:
            return reverse.ask(token, entry.conn, None)
        return reverse.ask(token, None, self._handoff)

    def _reverse_dial(self, timeout: float) -> socket.socket:
        token = self._waits.new()
        if not self.ask_reverse(token):
            self._waits.cancel(token)
            raise ConnectionRefusedError(
                errno.ECONNREFUSED, "no connection to ask the controller for a reverse connection"
            )
        return self._waits.take(token, timeout)

    def _answer_reverse(self, conn: Connection, frame: Frame) -> None:
        def accept(sock: socket.socket, arrival: str) -> None:
            self.loop.call_soon(lambda: self._inbound.take(sock, routed=True, arrival=arrival))

        reverse.answer(conn, frame, self.paths.target, _HANDSHAKE_TIMEOUT, self._tune, accept)

    def _dial(self, peer: str, entry: outbound.Peer) -> None:
        secret, timeout = self._dial_secrets.get(peer, (self.secret, self.connect_timeout))
        sock, reason = outbound.dial(
            peer,
            lambda limit: self._connect(peer, secret, limit),
            timeout,
            _HANDSHAKE_TIMEOUT,
            lambda: self._closing or peer in self._lost,
        )
        if sock is None:
            self._fail_peer(peer, entry, self._lost.get(peer, reason))
            return
        conn = self._adopt(sock, peer, dialed=True)
        # Flush what queued up while dialing, outside the lock (a big frame may take a while);
        # frames queued meanwhile go out in a later round, so order is kept.
        while True:
            with self._lock:
                batch, entry.queue = entry.queue, []
                if not batch:
                    entry.conn = conn
                    return
            for item in batch:
                try:
                    conn.send(item.buffers, item.done is not None, item.named)
                except ConnectionClosedError:
                    item.finish(sent=False)
                else:
                    item.finish(sent=True)

    def _fail_peer(self, peer: str, entry: outbound.Peer, reason: str) -> None:
        with self._lock:
            self._lost[peer] = reason
            if self._peers.get(peer) is entry:
                del self._peers[peer]
            queue, entry.queue = entry.queue, []
        for item in queue:
            item.finish(sent=False)
        self._on_peer_lost(peer, f"cannot connect: {reason}")

    # -- receiving -----------------------------------------------------------------------------

    def _adopt(self, sock: Stream, peer: str, dialed: bool) -> Connection:
        conn = Connection(sock, peer, self._connection_closed)
        with self._lock:
            self._conns.add(conn)
        self.heartbeat.adopted(conn, dialed)
        readable = reading(
            conn, self.frame_limit, self._on_frame, self._answer_reverse, self.heartbeat.received
        )
        self.loop.register(conn.fileno(), readable, stealable=True)
        return conn

    def _connection_closed(self, conn: Connection, reason: str) -> None:
        def cleanup() -> None:
            self.loop.unregister(conn.fileno())
            conn.sock.close()

        self.loop.call_soon(cleanup)
        with self._lock:
            self._conns.discard(conn)
            entry = self._peers.get(conn.peer)
            if entry is None or entry.conn is not conn:
                return
            del self._peers[conn.peer]
            self._lost[conn.peer] = reason
        if not self._closing:
            self._on_peer_lost(conn.peer, f"connection lost ({reason})")

    def _on_handoff(self, _: int) -> None:
        channel = self._handoff
        if channel is None:
            return
        handed = routing.receive(channel)
        if handed is None:  # the host is gone (and this process is about to follow it)
            self.loop.unregister(channel.fileno())
            channel.close()
            self._handoff = None
            return
        for message in handed:
            if message.sock is None:
                continue
            if message.kind == "R":
                if not self._waits.deliver(message.data, message.sock):
                    message.sock.close()  # its dial gave up
            else:
                self._inbound.take(message.sock, routed=False, use_tls=message.data == b"1")

    def _route_elsewhere(self, route: routing.Route, sock: socket.socket, use_tls: bool) -> bool:
        """Hand a routed connection to the process its route names, or a reverse connection to
        the dial that waits for it; False if it is for this process to authenticate."""
        if route.reverse:
            try:
                token = bytes.fromhex(route.key)
            except ValueError:
                token = b""
            if self._waits.deliver(token, sock):
                return True
            if self.router is not None:
                self.router.reverse(token, sock)
                return True
        elif route.key in ("", self.address):
            return False
        elif self.router is not None:
            self.router.route(route.key, sock, use_tls)
            return True
        log.warning("rejected a connection for %r: no such process here", route.key)
        sock.close()
        return True

    def _tune(self, sock: socket.socket) -> None:
        interval, silence = self.heartbeat.settings()
        addr.tune_tcp(sock, interval, silence)

    def _authenticated(self, sock: Stream, peer: str) -> None:
        conn = self._adopt(sock, peer, dialed=False)
        with self._lock:
            entry = self._peers.get(peer)
            if entry is None:
                entry = outbound.Peer()
                entry.conn = conn
                self._peers[peer] = entry
                self._lost.pop(peer, None)

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        """Close the listener and every connection."""
        self._closing = True
        self.heartbeat.stop()
        self._waits.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            conn.close("transport closed")
        self.loop.call_soon(self._inbound.close)
        for listener in self._listeners:
            self.loop.unregister(listener.fileno())
            with contextlib.suppress(OSError):
                listener.close()
        if self._handoff is not None:
            self.loop.unregister(self._handoff.fileno())
            with contextlib.suppress(OSError):
                self._handoff.close()
