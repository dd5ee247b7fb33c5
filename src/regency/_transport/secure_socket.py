"""A TLS connection with the socket methods regency's transport uses.

OpenSSL objects must not be used by two threads at once, so every TLS call holds the socket's
lock; calls never block while holding it once the socket is non-blocking (after the
handshake). Small buffers of one write go out as one TLS record.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Sequence


class SecureSocket:
    """A TLS connection with the socket methods regency's transport uses."""

    __slots__ = ("_lock", "_ssl", "family")

    def __init__(self, sslsock: ssl.SSLSocket) -> None:
        self._ssl = sslsock
        self._lock = threading.Lock()
        self.family = sslsock.family

    def fileno(self) -> int:
        """The socket's file descriptor."""
        return self._ssl.fileno()

    def setblocking(self, flag: bool) -> None:
        """Blocking or non-blocking I/O."""
        self._ssl.setblocking(flag)

    def settimeout(self, timeout: float | None) -> None:
        """A timeout for blocking I/O."""
        self._ssl.settimeout(timeout)

    def getpeername(self) -> object:
        """The peer's address."""
        return self._ssl.getpeername()

    def getsockopt(self, level: int, option: int, size: int) -> bytes:
        """A socket option of the underlying TCP socket, as bytes."""
        return self._ssl.getsockopt(level, option, size)

    def channel_binding(self) -> bytes:
        """This connection's ``tls-unique`` value, the same at both ends and different on every
        connection (TLS 1.3: the client's Finished message, a MAC over the whole handshake)."""
        with self._lock:
            value = self._ssl.get_channel_binding("tls-unique")
        if not value:
            raise ConnectionError("the TLS handshake has not completed: no channel binding yet")
        return b"tls-unique:" + value

    def pending(self) -> int:
        """Decrypted bytes already read from the kernel but not yet returned."""
        with self._lock:
            return self._ssl.pending()

    def recv(self, n: int, flags: int = 0) -> bytes:
        """Up to ``n`` bytes (``BlockingIOError`` when none are ready; ``b""`` at the end).

        ``MSG_PEEK`` looks at the raw stream: whether anything (or the end) is there.
        """
        if flags & socket.MSG_PEEK:
            if self.pending():
                return b"\0"
            return socket.socket.recv(self._ssl, n, flags)
        with self._lock:
            try:
                return self._ssl.recv(n)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                raise BlockingIOError from None

    def recvmsg(
        self, n: int, _ancbufsize: int = 0
    ) -> tuple[bytes, list[tuple[int, int, bytes]], int, None]:
        """:meth:`recv` in ``socket.recvmsg``'s shape (TLS carries no descriptors)."""
        return self.recv(n), [], 0, None

    def recv_into(self, view: memoryview) -> int:
        """Receive into ``view``; ``BlockingIOError`` when nothing is ready, 0 at the end."""
        with self._lock:
            try:
                return self._ssl.recv_into(view)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                raise BlockingIOError from None

    def sendmsg(self, buffers: Sequence[bytes | bytearray | memoryview]) -> int:
        """Encrypt and send the buffers while the kernel takes them; return how many bytes of
        them went out.

        Small neighbouring buffers go out as one TLS record (one write, one wake-up of the
        reader, instead of one per buffer). The count only ever ends on a buffer boundary, or
        inside a large buffer sent alone: OpenSSL keeps what it already wrote of a record, so
        the caller passes the rest of the same buffers next time and the same pieces form
        again.
        """
        sent = 0
        with self._lock:
            for piece, size in _pieces(buffers):
                try:
                    n = self._ssl.send(piece)
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                    if sent == 0:
                        raise BlockingIOError from None
                    return sent
                except (ssl.SSLEOFError, ssl.SSLZeroReturnError) as exc:
                    raise BrokenPipeError(f"the peer closed the connection: {exc}") from None
                if n < size:
                    return sent if isinstance(piece, bytes) else sent + n
                sent += n
        return sent

    @staticmethod
    def coalesce(buffers: Sequence[bytes | bytearray | memoryview]) -> list[bytes | memoryview]:
        """The buffers as :meth:`sendmsg` writes them (small neighbours joined), for a queue that
        is written a little at a time: the same pieces form again from these, without joining
        the small buffers anew at every try."""
        return [piece for piece, _ in _pieces(buffers)]

    def send(self, data: bytes) -> int:
        """Send ``data`` (blocking sockets: all of it)."""
        return self.sendmsg([data])

    def sendall(self, data: bytes | bytearray | memoryview) -> None:
        """Send all of ``data`` on a blocking socket."""
        with self._lock:
            try:
                self._ssl.sendall(data)
            except (ssl.SSLEOFError, ssl.SSLZeroReturnError) as exc:
                raise BrokenPipeError(f"the peer closed the connection: {exc}") from None

    def shutdown(self, how: int) -> None:
        """Shut the TCP connection down (no TLS close_notify: the peer sees the end)."""
        self._ssl.shutdown(how)

    def close(self) -> None:
        """Close the socket."""
        self._ssl.close()


Stream = socket.socket | SecureSocket

_JOIN_BELOW = 64 * 1024


def _pieces(
    buffers: Sequence[bytes | bytearray | memoryview],
) -> list[tuple[bytes | memoryview, int]]:
    """The buffers as pieces to write: runs of small ones joined (a ``bytes``), large ones
    alone (a ``memoryview``). Small bytes are joined as they are: a queue of many small frames
    is not turned into views one by one."""
    pieces: list[tuple[bytes | memoryview, int]] = []
    run: list[bytes | bytearray | memoryview] = []
    run_bytes = 0
    for given in buffers:
        buf = given
        if type(buf) is memoryview:
            if buf.format != "B" or buf.ndim != 1:
                buf = buf.cast("B")
            size = buf.nbytes
        else:
            size = len(buf)
        if not size:
            continue
        if size >= _JOIN_BELOW:
            if run:
                pieces.append((b"".join(run), run_bytes))
                run, run_bytes = [], 0
            pieces.append((memoryview(buf), size))
            continue
        if run_bytes + size > _JOIN_BELOW:
            pieces.append((b"".join(run), run_bytes))
            run, run_bytes = [], 0
        run.append(buf)
        run_bytes += size
    if run:
        pieces.append((b"".join(run), run_bytes))
    return pieces
