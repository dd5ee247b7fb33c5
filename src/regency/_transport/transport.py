"""A process's network presence: one listening address, authenticated connections by peer.

``Transport.send(peer, buffers)`` works whether or not a connection to ``peer`` exists yet: the
first send dials in the background (retrying while the peer process starts) and queued frames
follow in order once the handshake succeeds. Every received frame is handed to ``on_frame`` on
the I/O thread. A peer whose connection drops, or that cannot be reached before the deadline, is
reported once through ``on_peer_lost`` and stays lost: a process never comes back at the same
address.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence

from regency._transport import address as addr
from regency._transport.auth import AuthenticationError, ListenerHandshake, dialer_handshake
from regency._transport.connection import Buffer, Connection, ConnectionClosedError
from regency._transport.frames import Frame, FrameError
from regency._transport.io_loop import IOLoop
from regency._transport.reader import FrameReader

log = logging.getLogger("regency.transport")

FrameHandler = Callable[[Connection, Frame], None]
LostHandler = Callable[[str, str], None]

_HANDSHAKE_TIMEOUT = 10.0
# How long the I/O thread lets a burst of posted frames gather before it flushes them (a
# thread that blocks, or a full outbox, flushes sooner).
FLUSH_DELAY = 300e-6
_RETRYABLE = {errno.ECONNREFUSED, errno.ENOENT, errno.EAGAIN, errno.ECONNRESET}


class PeerUnreachableError(ConnectionError):
    """A peer process could not be reached, or its connection was lost."""


class _Queued:
    """Frame buffers waiting for a connection, and whether they made it."""

    __slots__ = ("buffers", "done", "sent")

    def __init__(self, buffers: list[Buffer], done: threading.Event | None) -> None:
        self.buffers = buffers
        self.done = done
        self.sent = False

    def finish(self, sent: bool) -> None:
        self.sent = sent
        if self.done is not None:
            self.done.set()


class _Peer:
    """Where frames to one peer go: a queue while dialing, then a connection."""

    __slots__ = ("conn", "queue")

    def __init__(self) -> None:
        self.conn: Connection | None = None
        self.queue: list[_Queued] = []


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
    ) -> None:
        self.secret = secret
        self.frame_limit = frame_limit
        self.connect_timeout = connect_timeout
        self._on_frame = on_frame
        self._on_peer_lost = on_peer_lost
        self.loop = loop or IOLoop()
        self._lock = threading.Lock()
        self._peers: dict[str, _Peer] = {}
        self._lost: dict[str, str] = {}
        self._conns: set[Connection] = set()
        self._dirty: set[Connection] = set()
        self._dirty_lock = threading.Lock()
        self._flush_pending = False
        self._closing = False
        self._listener, self.address = addr.listen(listen_address)
        self._listener.setblocking(False)
        self.loop.register(self._listener.fileno(), self._on_accept_ready)

    # -- sending -------------------------------------------------------------------------------

    def send(self, peer: str, buffers: Sequence[Buffer], wait: bool = True) -> None:
        """Send one frame's buffers to ``peer``; :class:`PeerUnreachableError` if it is lost.

        With ``wait`` the call returns once the bytes are in the kernel (the caller may then
        reuse its buffers); without it, buffers that cannot go out at once are copied.
        """
        entry = self._peers.get(peer)
        conn = entry.conn if entry is not None else None
        if conn is None:
            conn, item = self._connection_or_queue(peer, buffers, wait)
            if item is not None:
                if item.done is not None:
                    item.done.wait()
                    if not item.sent:
                        reason = self._lost.get(peer, "connection failed")
                        raise PeerUnreachableError(f"cannot reach {peer}: {reason}")
                return
        assert conn is not None
        try:
            conn.send(buffers, wait)
        except ConnectionClosedError as exc:
            raise PeerUnreachableError(str(exc)) from exc

    def post(self, frames: Sequence[tuple[str, Sequence[Buffer]]], size: int) -> None:
        """Send small ``size``-byte frames, one per ``(peer, buffers)``, coalescing bursts.

        The caller must not touch the buffers again. Frames posted in a burst go out together on
        the next flush: when the outbox fills, when a thread is about to wait (:meth:`flush`),
        or shortly after on the I/O thread.
        """
        peers = self._peers
        for peer, buffers in frames:
            entry = peers.get(peer)
            conn = entry.conn if entry is not None else None
            if conn is None:
                self.send(peer, buffers, wait=False)
                continue
            try:
                schedule = conn.post(buffers, size)
            except ConnectionClosedError as exc:
                raise PeerUnreachableError(str(exc)) from exc
            if schedule:
                self._mark_dirty(conn)

    def _mark_dirty(self, conn: Connection) -> None:
        with self._dirty_lock:
            self._dirty.add(conn)
            first = not self._flush_pending
            self._flush_pending = True
        if first:
            self.loop.call_later(FLUSH_DELAY, self.flush)

    def flush(self) -> None:
        """Send every frame waiting in an outbox."""
        if not self._flush_pending:
            return
        with self._dirty_lock:
            dirty, self._dirty = self._dirty, set()
            self._flush_pending = False
        for conn in dirty:
            with contextlib.suppress(ConnectionClosedError):
                conn.flush()

    def _connection_or_queue(
        self, peer: str, buffers: Sequence[Buffer], wait: bool
    ) -> tuple[Connection | None, _Queued | None]:
        """The peer's connection, or (while dialing) the queue entry the frame was put in."""
        with self._lock:
            reason = self._lost.get(peer)
            if reason is not None:
                raise PeerUnreachableError(f"cannot reach {peer}: {reason}")
            entry = self._peers.get(peer)
            if entry is None:
                entry = self._peers[peer] = _Peer()
                threading.Thread(
                    target=self._dial, args=(peer, entry), name="regency-dial", daemon=True
                ).start()
            if entry.conn is not None:
                return entry.conn, None
            # Without wait the caller may reuse its memory once we return: keep a copy.
            kept: list[Buffer] = list(buffers) if wait else [bytes(b) for b in buffers]
            item = _Queued(kept, threading.Event() if wait else None)
            entry.queue.append(item)
            return None, item

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

    def _dial(self, peer: str, entry: _Peer) -> None:
        deadline = time.monotonic() + self.connect_timeout
        delay = 0.002
        sock: socket.socket | None = None
        reason = "unknown error"
        while not self._closing and peer not in self._lost:
            try:
                sock = addr.dial(peer, timeout=_HANDSHAKE_TIMEOUT)
                dialer_handshake(sock, self.secret, self.address)
                break
            except AuthenticationError as exc:
                reason = f"authentication failed: {exc}"
                log.error("connection to %s refused: %s", peer, reason)
                if sock is not None:
                    sock.close()
                sock = None
                break
            except (OSError, addr.AddressError) as exc:
                if sock is not None:
                    sock.close()
                    sock = None
                reason = str(exc)
                retry = isinstance(exc, OSError) and exc.errno in _RETRYABLE
                if not retry or time.monotonic() + delay > deadline:
                    if retry:
                        reason = f"no answer within {self.connect_timeout:.0f} s ({exc})"
                    break
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
        if sock is None:
            self._fail_peer(peer, entry, self._lost.get(peer, reason))
            return
        conn = self._adopt(sock, peer)
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
                    conn.send(item.buffers, wait=item.done is not None)
                except ConnectionClosedError:
                    item.finish(sent=False)
                else:
                    item.finish(sent=True)

    def _fail_peer(self, peer: str, entry: _Peer, reason: str) -> None:
        with self._lock:
            self._lost[peer] = reason
            if self._peers.get(peer) is entry:
                del self._peers[peer]
            queue, entry.queue = entry.queue, []
        for item in queue:
            item.finish(sent=False)
        self._on_peer_lost(peer, reason)

    # -- receiving -----------------------------------------------------------------------------

    def _adopt(self, sock: socket.socket, peer: str) -> Connection:
        conn = Connection(sock, peer, self._connection_closed)
        reader = FrameReader(self.frame_limit)
        with self._lock:
            self._conns.add(conn)

        read_lock = threading.Lock()

        def readable(_: int) -> None:
            # Any thread may run this (see IOLoop.wait_reading); the lock keeps both the byte
            # stream and the dispatch of its frames in order.
            with read_lock:
                if conn.closed is not None:
                    conn.close(conn.closed)  # a failed send closed it: release the socket
                    return
                try:
                    frames = reader.read(conn.sock)
                except FrameError as exc:
                    log.warning("closing connection from %s: %s", peer, exc)
                    conn.close(f"protocol error: {exc}")
                    return
                except OSError as exc:
                    conn.close(f"read failed: {exc}")
                    return
                if frames is None:
                    conn.close("peer closed the connection")
                    return
                for frame in frames:
                    try:
                        self._on_frame(conn, frame)
                    except FrameError as exc:
                        log.warning("closing connection from %s: %s", peer, exc)
                        conn.close(f"protocol error: {exc}")
                        return
                    except Exception:
                        log.exception("dropping a frame from %s that could not be routed", peer)

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
            self._on_peer_lost(conn.peer, reason)

    def _on_accept_ready(self, _: int) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("accept failed: %s", exc)
                return
            self._start_listener_handshake(sock)

    def _start_listener_handshake(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        if sock.family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        shake = ListenerHandshake(self.secret)
        fd = sock.fileno()
        state = {"done": False}

        def finish(reason: str | None) -> None:
            state["done"] = True
            self.loop.unregister(fd)
            if reason is not None:
                log.warning("rejected a connection: %s", reason)
                sock.close()

        def readable(_: int) -> None:
            try:
                data = sock.recv(4096)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                finish(f"read failed during handshake: {exc}")
                return
            if not data:
                finish("peer hung up during the handshake")
                return
            try:
                proof = shake.feed(data)
            except AuthenticationError as exc:
                finish(str(exc))
                return
            if proof is None:
                return
            try:
                sock.send(proof)
            except OSError as exc:
                finish(f"write failed during handshake: {exc}")
                return
            finish(None)
            peer = shake.peer_address or "unknown"
            conn = self._adopt(sock, peer)
            with self._lock:
                entry = self._peers.get(peer)
                if entry is None:
                    entry = _Peer()
                    entry.conn = conn
                    self._peers[peer] = entry
                    self._lost.pop(peer, None)

        def expire() -> None:
            if not state["done"]:
                finish("handshake timed out")

        try:
            sock.send(shake.hello())
        except OSError as exc:
            log.warning("rejected a connection: %s", exc)
            sock.close()
            return
        self.loop.register(fd, readable)
        self.loop.call_later(_HANDSHAKE_TIMEOUT, expire)

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        """Close the listener and every connection."""
        self._closing = True
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            conn.close("transport closed")
        self.loop.unregister(self._listener.fileno())
        with contextlib.suppress(OSError):
            self._listener.close()
