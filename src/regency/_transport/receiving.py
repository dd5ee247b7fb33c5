"""Reading one connection: the I/O loop's handler that cuts its bytes into frames and hands each
on, in order; heartbeats and requests for reverse connections go apart, and parts sent by name
are put back (:mod:`.names`).

A protocol error (bytes that cannot be a frame, or a frame the receiver refuses) closes the
connection; any other error while routing a frame drops that frame alone.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable

from regency._transport.connection import Connection
from regency._transport.frames import KIND_HEARTBEAT, Frame, FrameError
from regency._transport.names import FLAG_NAMED, KIND_NAME, NamesReceived
from regency._transport.reader import FrameReader
from regency._transport.reverse import KIND_REVERSE

log = logging.getLogger("regency.transport")

_TCP_CLOSE = 7  # tcpi_state of a connection the kernel ended (timed out, reset), not a peer's FIN

FrameHandler = Callable[[Connection, Frame], None]
BeatHandler = Callable[[Connection, int], None]  # a heartbeat's flags


def reading(
    conn: Connection,
    frame_limit: int,
    on_frame: FrameHandler,
    on_reverse: FrameHandler,
    on_beat: BeatHandler,
) -> Callable[[int], None]:
    """The handler of ``conn``'s socket becoming readable: its frames go to ``on_frame``, those
    asking for a reverse connection to ``on_reverse``, the flags of heartbeats to ``on_beat``."""
    read = FrameReader(conn.sock, frame_limit).read
    peer = conn.peer
    read_lock = threading.Lock()
    names = NamesReceived()

    def readable(_: int) -> None:
        # Any thread may run this (see IOLoop.wait_reading); the lock keeps both the byte
        # stream and the dispatch of its frames in order.
        with read_lock:
            if conn.closed is not None:
                conn.close(conn.closed)  # a failed send closed it: release the socket
                return
            try:
                frames = read()
                if frames is not None:
                    conn.received += 1
                    for frame in frames:
                        dispatch(frame)
            except FrameError as exc:
                log.warning("closing connection from %s: %s", peer, exc)
                conn.close(f"protocol error: {exc}")
                return
            except OSError as exc:
                conn.close(f"read failed: {exc}")
                return
            if frames is None:
                conn.close(_end_reason(conn))

    def dispatch(frame: Frame) -> None:
        # FrameError: the peer broke the protocol (the connection closes).
        kind = frame.kind
        # Kinds are one byte: a heartbeat is 0, the transport's own are the last.
        if KIND_HEARTBEAT < kind < KIND_NAME:
            if frame.flags & FLAG_NAMED:
                names.resolve(frame)
            try:
                on_frame(conn, frame)
            except FrameError:
                raise
            except Exception:
                log.exception("dropping a frame from %s that could not be routed", peer)
        elif kind == KIND_NAME:
            names.define(frame)
        elif kind == KIND_REVERSE:
            on_reverse(conn, frame)
        else:
            on_beat(conn, frame.flags)

    return readable


def _end_reason(conn: Connection) -> str:
    """Why a read of ``conn`` found the end of its stream: the peer closed it, or the kernel
    ended the connection (a peer that stopped answering its keepalive probes or data within
    ``TCP_USER_TIMEOUT``, or a reset; over TLS the error itself can read as an end)."""
    if conn.tcp:
        with contextlib.suppress(OSError):
            info = conn.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)
            if info[0] == _TCP_CLOSE:
                return "the connection timed out or was reset (the peer did not close it)"
    return "peer closed the connection"
