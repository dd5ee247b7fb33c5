"""The transfer service's wire protocol, shared by the service and its clients.

A connection (TCP, or a Unix stream socket on the same host) starts with regency's mutual
HMAC handshake over the job secret (:mod:`regency._transport.auth`); the service reads nothing
else from a peer that fails it. After that the client sends requests and the service answers
each one in order, so a client may pipeline several::

    request : op u8 | buffer_id u64 | token u64 | offset u64 | length u64 | shm_offset u64
              [+ length bytes of data, for WRITE]
    reply   : status u8 | n u64 | n bytes (the data for a READ, an error text otherwise)

    READ       offset, length       -> the bytes of the buffer at [offset, offset + length)
    WRITE      offset, length, data -> written into the buffer
    SHM_ATTACH length               -> a sealed memfd of ``length`` bytes, passed with the
                                       request as SCM_RIGHTS (Unix sockets only), becomes this
                                       connection's staging area
    SHM_READ   offset, length, shm_offset -> buffer[offset:+length] copied into the staging area
    SHM_WRITE  offset, length, shm_offset -> staging area copied into buffer[offset:+length]
    DROP                            -> the registration is dropped
    IBV_CONNECT length, queue pair info -> the owner's queue pair info: a reliable connection
                                       between the two, alive as long as this connection
    IBV_KEY                         -> the buffer's remote key (it is registered with the NIC on
                                       first use); see :mod:`regency.rdma._ibverbs.wire`

An owner that cannot serve ibverbs answers ``IBV_CONNECT`` and ``IBV_KEY`` with UNSUPPORTED.
"""

from __future__ import annotations

import enum
import socket
import ssl
import struct

from regency._errors import RegencyError
from regency._transport import address, auth, tls
from regency._transport.connection import ConnectionClosedError
from regency._transport.deadline import time_left
from regency._transport.tls import Stream

REQUEST = struct.Struct("<BQQQQQ")
REPLY = struct.Struct("<BQ")
MAX_ERROR_TEXT = 4096
HANDSHAKE_TIMEOUT_S = 10.0
SOCKET_BUFFER_BYTES = 4 << 20


class Op(enum.IntEnum):
    """Request kinds."""

    READ = 1
    WRITE = 2
    SHM_ATTACH = 3
    SHM_READ = 4
    SHM_WRITE = 5
    DROP = 6
    IBV_CONNECT = 7
    IBV_KEY = 8


class Status(enum.IntEnum):
    """Reply kinds."""

    OK = 0
    DROPPED = 1
    BAD_REQUEST = 2
    FAILED = 3
    UNSUPPORTED = 4


class RemoteRefusedError(RegencyError):
    """The service answered a request with an error status."""

    def __init__(self, status: Status, text: str) -> None:
        super().__init__(text)
        self.status = status


def recv_exact_into(sock: Stream, mv: memoryview, deadline: float | None = None) -> None:
    """Fill ``mv`` from ``sock``; raise :class:`ConnectionClosedError` on end of stream.

    With a ``deadline`` each receive waits only until it (the socket's timeout would otherwise
    apply to every receive anew).
    """
    got = 0
    total = mv.nbytes
    while got < total:
        if deadline is not None:
            sock.settimeout(time_left(deadline))
        n = sock.recv_into(mv[got:])
        if n == 0:
            raise ConnectionClosedError("connection closed by the peer")
        got += n


def recv_exact(sock: Stream, n: int) -> bytes:
    """Exactly ``n`` bytes from ``sock``."""
    buf = bytearray(n)
    recv_exact_into(sock, memoryview(buf))
    return bytes(buf)


def tune(sock: socket.socket) -> None:
    """Large socket buffers, and no Nagle delay on TCP."""
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER_BYTES)
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def connect(target: str, secret: bytes, timeout: float) -> Stream:
    """Dial a transfer service and authenticate it both ways.

    Over TCP the connection runs TLS first. Raises ``OSError`` subclasses.
    """
    raw = address.dial(target, timeout)
    sock: Stream = raw
    try:
        raw.settimeout(max(min(timeout, HANDSHAKE_TIMEOUT_S), 0.001))
        tune(raw)
        if address.is_tcp(target) and tls.applies(address.tcp_host(target)):
            sock = tls.wrap_client(raw, secret)
        auth.dialer_handshake(sock, secret, f"rdma-client:{target}")
    except ssl.SSLError as exc:
        sock.close()
        raise auth.AuthenticationError(tls.failure(exc)) from None
    except BaseException:
        sock.close()
        raise
    return sock


def send_reply(sock: Stream, status: Status, text: str = "") -> None:
    """Send a reply without data (an error text, or an empty OK)."""
    body = text.encode()[:MAX_ERROR_TEXT]
    sock.sendall(REPLY.pack(status, len(body)) + body)


def read_reply(sock: Stream) -> tuple[Status, int]:
    """Read a reply's head: its status and the number of bytes that follow."""
    status, n = REPLY.unpack(recv_exact(sock, REPLY.size))
    try:
        return Status(status), n
    except ValueError:
        raise ConnectionClosedError(f"unknown reply status {status}") from None


def read_error(sock: Stream, n: int) -> str:
    """Read the error text that follows a non-OK reply head."""
    if n > MAX_ERROR_TEXT:
        raise ConnectionClosedError(f"error text of {n} bytes is too long")
    return recv_exact(sock, n).decode(errors="replace")


def check_reply(sock: Stream, expected: int) -> None:
    """Read a reply head; raise unless it is OK and announces ``expected`` bytes of data."""
    status, n = read_reply(sock)
    if status != Status.OK:
        raise RemoteRefusedError(status, read_error(sock, n))
    if n != expected:
        raise ConnectionClosedError(f"reply announces {n} bytes, expected {expected}")
