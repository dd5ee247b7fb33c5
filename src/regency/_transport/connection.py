"""One authenticated byte stream to a peer process, writable from any thread.

Writes go straight from the calling thread to the socket (no hop to an I/O thread). What the
kernel does not take at once is queued for a per-connection writer thread, keeping order. A
caller that passes ``wait=True`` returns only once its bytes are in the kernel, so it may reuse
its buffers afterwards; the I/O loop passes ``wait=False`` so forwarding never blocks reading.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections import deque
from collections.abc import Callable, Sequence

from regency._errors import RegencyError
from regency._transport.names import Named, NamesSent
from regency._transport.secure_socket import SecureSocket
from regency._transport.tls import Stream

Buffer = bytes | bytearray | memoryview

OUTBOX_BUFFERS = 512  # flush at once beyond this many buffers (IOV_MAX is 1024)...
OUTBOX_BYTES = 256 * 1024  # ...or this many bytes


class ConnectionClosedError(RegencyError, ConnectionError):
    """The connection is closed, perhaps in the middle of an exchange; nothing more can be sent."""


def _advance(buffers: Sequence[Buffer], sent: int) -> list[Buffer]:
    """What is left of ``buffers`` once ``sent`` bytes of them went out: the untouched ones as
    they are (a queue of many small frames is not turned into views one by one), the one cut
    in the middle as a view of its rest."""
    index = 0
    for buf in buffers:
        size = buf.nbytes if isinstance(buf, memoryview) else len(buf)
        if sent < size:
            break
        sent -= size
        index += 1
    rest = list(buffers[index:])
    if sent and rest:
        rest[0] = memoryview(rest[0]).cast("B")[sent:]
    return rest


class _Pending:
    __slots__ = ("buffers", "done", "ok")

    def __init__(self, buffers: list[Buffer], done: threading.Event | None) -> None:
        self.buffers = buffers
        self.done = done
        self.ok = False


class Connection:
    """A connected, authenticated, non-blocking socket to the process at ``peer``."""

    def __init__(
        self, sock: Stream, peer: str, on_close: Callable[[Connection, str], None]
    ) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.peer = peer
        self.tcp = sock.family != socket.AF_UNIX
        self.received = 0  # reads that brought bytes (the heartbeat watches it change)
        self.sent = 0  # writes that took bytes (a connection that carries traffic needs no ping)
        self.beats = self.tcp  # whether this side takes part in heartbeats (see heartbeat.py)
        self.asks = False  # whether this side pings (it dialed)
        self.peer_quiet = False  # the peer takes no part in heartbeats (a proc)
        self._on_close = on_close
        self._lock = threading.Lock()
        self._backlog: deque[_Pending] = deque()
        self._wakeup = threading.Condition(self._lock)
        self._writer: threading.Thread | None = None
        self.closed: str | None = None
        # Whether close() ran: a failed send marks the connection closed under the lock, but
        # the socket is shut down and the owner told (so it unregisters and closes the fd) only
        # by close(), which must still run once afterwards.
        self._released = False
        self._outbox: list[Buffer] = []
        self._outbox_bytes = 0
        self._flush_scheduled = False
        self._names = NamesSent()  # the parts the peer holds by name (see names.py)

    def fileno(self) -> int:
        """The socket's file descriptor."""
        return self.sock.fileno()

    def send(
        self, buffers: Sequence[Buffer], wait: bool = True, named: Named | None = None
    ) -> None:
        """Send the buffers of one or more frames, in order with every other send; ``named``:
        the part a frame names (:mod:`.names`), defined first unless the peer holds it.

        Raises :class:`ConnectionClosedError` if the connection is (or becomes) closed.
        """
        with self._lock:
            if named is not None and self.closed is None:
                buffers = self._names.ahead(named, buffers)[0]
            item = self._write_locked(buffers, wait)
        if item is not None and item.done is not None:
            item.done.wait()
            if not item.ok:
                raise ConnectionClosedError(f"connection to {self.peer} closed: {self.closed}")

    def _write_locked(
        self, buffers: Sequence[Buffer], wait: bool, total: int = -1
    ) -> _Pending | None:
        """Write what the socket takes now (outbox first); queue the rest for the writer.

        ``total`` is the buffers' size when the caller knows it (with nothing in the outbox).
        """
        if self.closed is not None:
            raise ConnectionClosedError(f"connection to {self.peer} is closed: {self.closed}")
        if self._outbox:
            buffers = [*self._take_outbox(), *buffers]
            total = -1
        if not self._backlog:
            if total < 0:
                total = 0
                for b in buffers:
                    total += b.nbytes if isinstance(b, memoryview) else len(b)
            sent = self._sendmsg_locked(buffers)
            if sent == total:
                return None
            rest = _advance(buffers, sent)
        else:
            rest = _advance(buffers, 0)
        return self._queue_rest_locked(rest, threading.Event() if wait else None)

    def _sendmsg_locked(self, buffers: Sequence[Buffer]) -> int:
        """Write what the socket takes now (0 bytes if none); a failure closes the connection
        and raises :class:`ConnectionClosedError`."""
        try:
            sent = self.sock.sendmsg(buffers)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as exc:
            self._close_locked(f"send failed: {exc}")
            raise ConnectionClosedError(f"connection to {self.peer} failed: {exc}") from exc
        self.sent += 1
        return sent

    def _queue_rest_locked(self, rest: list[Buffer], done: threading.Event | None) -> _Pending:
        """Queue what the socket did not take for the writer thread (started on first use)."""
        if isinstance(self.sock, SecureSocket) and len(rest) > 1:
            # Many small frames: joined once here, not at every partial write of the writer.
            rest = list(self.sock.coalesce(rest))
        item = _Pending(rest, done)
        self._backlog.append(item)
        if self._writer is None:
            self._writer = threading.Thread(
                target=self._write_loop, name=f"regency-writer-{self.peer}", daemon=True
            )
            self._writer.start()
        else:
            self._wakeup.notify()
        return item

    def post(
        self, buffers: Sequence[Buffer], size: int, burst: bool, named: Named | None = None
    ) -> bool:
        """Send small, self-owned frame buffers, coalescing them with others during bursts.

        Outside a ``burst`` (the sender's judgement) a frame goes out at once. In one, frames
        wait in an outbox and go out together (one ``sendmsg`` for many frames, one wake-up of
        the receiver) when the outbox is large, when :meth:`flush` is called, or on any direct
        :meth:`send`. Returns True when the caller must arrange a later :meth:`flush` (the
        outbox just became non-empty). ``size`` is the frame's byte count; ``named`` as for
        :meth:`send`.
        """
        with self._lock:
            if self.closed is not None:
                raise ConnectionClosedError(f"connection to {self.peer} is closed: {self.closed}")
            if named is not None:
                buffers, defined = self._names.ahead(named, buffers)
                size += defined
            if not burst and not self._outbox and not self._backlog:
                sent = self._sendmsg_locked(buffers)  # nearly always all of it goes
                if sent != size:
                    self._queue_rest_locked(_advance(buffers, sent), None)
                return False
            self._outbox.extend(buffers)
            self._outbox_bytes += size
            if len(self._outbox) < OUTBOX_BUFFERS and self._outbox_bytes < OUTBOX_BYTES:
                schedule = not self._flush_scheduled
                self._flush_scheduled = True
                return schedule
            self._write_locked((), wait=False)
            return False

    def flush(self) -> None:
        """Send whatever :meth:`post` left in the outbox."""
        with self._lock:
            self._flush_scheduled = False
            if self._outbox and self.closed is None:
                self._write_locked((), wait=False)

    def _take_outbox(self) -> list[Buffer]:
        outbox, self._outbox = self._outbox, []
        self._outbox_bytes = 0
        self._flush_scheduled = False
        return outbox

    def _write_loop(self) -> None:
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLOUT)
        while True:
            with self._lock:
                while not self._backlog and self.closed is None:
                    self._wakeup.wait()
                if self.closed is not None:
                    self._release_waiters()
                    return
                item = self._backlog[0]
            poller.poll(1000)
            with self._lock:
                if self.closed is not None:
                    self._release_waiters()
                    return
                try:
                    sent = self.sock.sendmsg(item.buffers)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as exc:
                    failure = f"send failed: {exc}"
                    self._close_locked(failure)
                    self._release_waiters()
                    break
                self.sent += 1
                item.buffers = _advance(item.buffers, sent)
                if not item.buffers:
                    self._backlog.popleft()
                    item.ok = True
                    if item.done is not None:
                        item.done.set()

        self.close(failure)

    def _release_waiters(self) -> None:
        while self._backlog:
            item = self._backlog.popleft()
            if item.done is not None:
                item.done.set()

    def _close_locked(self, reason: str) -> None:
        if self.closed is None:
            self.closed = reason
            self._wakeup.notify_all()
            if self._writer is None:
                self._release_waiters()

    def close(self, reason: str) -> None:
        """Close the connection (idempotent) and tell the owner why."""
        with self._lock:
            first = not self._released
            self._released = True
            self._close_locked(reason)
            reason = self.closed or reason
        if first:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            self._on_close(self, reason)
