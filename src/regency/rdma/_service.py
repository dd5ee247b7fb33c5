"""The owner's side of the TCP and shared-memory backends: a transfer service in each process.

The service starts with the first registration in a process. It listens on a TCP socket (for
peers on other hosts) and on an abstract Unix socket (for the shared-memory backend on this
host), on its own threads: it never goes through an actor's mailbox, so an actor that is busy
in a handler does not stall transfers of its buffers. Each connection runs TLS (over TCP) and is
authenticated with the job secret before a single request is read, on the service's I/O thread
(bounded, one deadline, no thread per unauthenticated peer), then served by its own thread. The
protocol is in :mod:`regency.rdma._protocol`. The ibverbs backend sets up its connections and
buffer keys through the same service (:mod:`regency.rdma._ibverbs.owner`); its transfers then
bypass it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import mmap
import os
import socket
import threading
from collections.abc import Sequence
from typing import Any

from regency._transport import address
from regency._transport.connection import ConnectionClosedError
from regency._transport.inbound import Inbound
from regency._transport.io_loop import IOLoop
from regency._transport.ratelimit import FailureLimiter
from regency._transport.tls import Stream
from regency.rdma._backends import cuda as _cuda
from regency.rdma._ibverbs.owner import OwnerSide
from regency.rdma._memory import view
from regency.rdma._protocol import (
    REPLY,
    REQUEST,
    Op,
    Status,
    recv_exact_into,
    send_reply,
    tune,
)
from regency.rdma._registry import Registration, registry

WILDCARD = "0.0.0.0"  # in a handle's address: "on loopback and the interfaces other hosts use"

_DRAIN_CHUNK = 1 << 20
_REQUIRED_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL


class _Staging:
    """A client's sealed memfd, mapped into this process."""

    def __init__(self, fd: int, nbytes: int) -> None:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        if seals & _REQUIRED_SEALS != _REQUIRED_SEALS:
            raise ValueError("the staging memfd must be sealed against shrinking")
        if os.fstat(fd).st_size != nbytes:
            raise ValueError("the staging memfd's size does not match the request")
        self.map = mmap.mmap(fd, nbytes)
        self.nbytes = nbytes
        self._anchor: Any = ctypes.c_char.from_buffer(self.map)
        self.address = ctypes.addressof(self._anchor)

    def close(self) -> None:
        self._anchor = None
        self.map.close()


def _recv_request(conn: Stream) -> tuple[bytes, list[int]]:
    """Read one request head, with any file descriptors sent along with it."""
    data = bytearray()
    fds: list[int] = []
    while len(data) < REQUEST.size:
        chunk, ancdata, _flags, _addr = conn.recvmsg(
            REQUEST.size - len(data), socket.CMSG_SPACE(4 * 4)
        )
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                usable = len(payload) - len(payload) % 4
                fds.extend(
                    int.from_bytes(payload[i : i + 4], "little") for i in range(0, usable, 4)
                )
        if not chunk:
            for fd in fds:
                os.close(fd)
            raise ConnectionClosedError("connection closed")
        data += chunk
    return bytes(data), fds


def _drain(conn: Stream, nbytes: int) -> None:
    scratch = memoryview(bytearray(min(nbytes, _DRAIN_CHUNK)))
    while nbytes > 0:
        step = min(nbytes, scratch.nbytes)
        recv_exact_into(conn, scratch[:step])
        nbytes -= step


class _Session:
    """One authenticated connection."""

    def __init__(self, conn: Stream, is_unix: bool) -> None:
        self.conn = conn
        self.is_unix = is_unix
        self.staging: _Staging | None = None
        self.ibverbs: OwnerSide | None = None

    def _ibverbs(self) -> OwnerSide:
        if self.ibverbs is None:
            self.ibverbs = OwnerSide(self.conn)
        return self.ibverbs

    def _check(
        self, buffer_id: int, token: int, offset: int, length: int, *, write: bool
    ) -> tuple[Registration | None, Status, str]:
        entry = registry().lookup(buffer_id, token)
        if entry is None:
            return None, Status.DROPPED, "the buffer was dropped"
        if offset + length > entry.region.nbytes:
            return None, Status.BAD_REQUEST, "range outside the buffer"
        if write and not entry.region.writable:
            return None, Status.BAD_REQUEST, "the buffer was registered read-only"
        return entry, Status.OK, ""

    def serve(self) -> None:
        """Serve requests until the peer hangs up."""
        while True:
            head, fds = _recv_request(self.conn)
            op, buffer_id, token, offset, length, shm_offset = REQUEST.unpack(head)
            if op == Op.SHM_ATTACH:
                self._attach(fds, length)
                continue
            for fd in fds:
                os.close(fd)
            if op == Op.READ:
                self._read(buffer_id, token, offset, length)
            elif op == Op.WRITE:
                self._write(buffer_id, token, offset, length)
            elif op in (Op.SHM_READ, Op.SHM_WRITE):
                self._shm(buffer_id, token, offset, length, shm_offset, write=op == Op.SHM_WRITE)
            elif op == Op.DROP:
                registry().drop(buffer_id, token)
                send_reply(self.conn, Status.OK)
            elif op == Op.IBV_CONNECT:
                if not self._ibverbs().connect(length):
                    return
            elif op == Op.IBV_KEY:
                self._ibverbs().key(buffer_id, token)
            else:
                send_reply(self.conn, Status.BAD_REQUEST, f"unknown operation {op}")
                return

    def _read(self, buffer_id: int, token: int, offset: int, length: int) -> None:
        entry, status, why = self._check(buffer_id, token, offset, length, write=False)
        if entry is None:
            send_reply(self.conn, status, why)
            return
        region = entry.region
        if region.is_cuda:
            data = _cuda.device_to_host(region, offset, length)
        else:
            data = view(region.address + offset, length, writable=False)
        self.conn.sendall(REPLY.pack(Status.OK, length))
        self.conn.sendall(data)

    def _write(self, buffer_id: int, token: int, offset: int, length: int) -> None:
        entry, status, why = self._check(buffer_id, token, offset, length, write=True)
        if entry is None:
            _drain(self.conn, length)
            send_reply(self.conn, status, why)
            return
        region = entry.region
        if region.is_cuda:
            recv_exact_into(self.conn, _cuda.staging_view(length))
            _cuda.host_to_device(region, offset, length)
        else:
            recv_exact_into(self.conn, view(region.address + offset, length, writable=True))
        if registry().lookup(buffer_id, token) is None:
            send_reply(self.conn, Status.DROPPED, "the buffer was dropped during the write")
        else:
            send_reply(self.conn, Status.OK)

    def _attach(self, fds: list[int], length: int) -> None:
        if not self.is_unix or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            send_reply(self.conn, Status.BAD_REQUEST, "SHM_ATTACH needs one memfd over Unix")
            return
        try:
            staging = _Staging(fds[0], length)
        except (OSError, ValueError) as exc:
            send_reply(self.conn, Status.BAD_REQUEST, f"unusable staging memfd: {exc}")
            return
        finally:
            os.close(fds[0])
        if self.staging is not None:
            self.staging.close()
        self.staging = staging
        send_reply(self.conn, Status.OK)

    def _shm(
        self, buffer_id: int, token: int, offset: int, length: int, shm_offset: int, *, write: bool
    ) -> None:
        staging = self.staging
        if staging is None or shm_offset + length > staging.nbytes:
            send_reply(self.conn, Status.BAD_REQUEST, "no staging area for this range")
            return
        entry, status, why = self._check(buffer_id, token, offset, length, write=write)
        if entry is None:
            send_reply(self.conn, status, why)
            return
        region = entry.region
        shm = staging.address + shm_offset
        if region.is_cuda:
            send_reply(self.conn, Status.BAD_REQUEST, "CUDA buffers are not served over shm")
            return
        if write:
            ctypes.memmove(region.address + offset, shm, length)
        else:
            ctypes.memmove(shm, region.address + offset, length)
        if registry().lookup(buffer_id, token) is None:
            send_reply(self.conn, Status.DROPPED, "the buffer was dropped during the copy")
        else:
            send_reply(self.conn, Status.OK)

    def close(self) -> None:
        if self.ibverbs is not None:
            self.ibverbs.close()
            self.ibverbs = None
        if self.staging is not None:
            self.staging.close()
            self.staging = None
        self.conn.close()


class TransferService:
    """Listening sockets, and one thread per authenticated connection.

    An I/O thread takes every connection through TLS (over TCP) and the secret handshake within
    bounds and one deadline (:mod:`regency._transport.inbound`).
    """

    def __init__(self, secret: bytes, tcp_hosts: Sequence[str], unix_name: str) -> None:
        self._secret = secret
        self._loop = IOLoop("regency-rdma-accept")
        self._inbound = Inbound(
            self._loop,
            lambda: (self._secret,),
            self._authenticated,
            lambda _route, _sock, _tls: False,
            tune,
            limiter=lambda: _auth_failures,
        )
        self._listeners = _listen_on(tcp_hosts)
        port = self._listeners[0].getsockname()[1]
        self.tcp_address = address.tcp_address(
            tcp_hosts[0] if len(tcp_hosts) == 1 else WILDCARD, port
        )
        unix, self.unix_address = address.listen(f"unix:@{unix_name}")
        self._listeners.append(unix)
        for listener in self._listeners:
            self._inbound.listen(listener, routed=False)

    def _authenticated(self, stream: Stream, _peer: str) -> None:
        threading.Thread(
            target=self._serve,
            args=(stream, stream.family == socket.AF_UNIX),
            name="regency-rdma-conn",
            daemon=True,
        ).start()

    def _serve(self, conn: Stream, is_unix: bool) -> None:
        conn.setblocking(True)
        session = _Session(conn, is_unix)
        try:
            session.serve()
        except OSError:
            pass  # a peer that hangs up just loses its connection
        except Exception as exc:  # a failed copy (e.g. on a GPU) ends this connection only
            with contextlib.suppress(OSError):
                send_reply(conn, Status.FAILED, f"{type(exc).__name__}: {exc}")
        finally:
            with contextlib.suppress(OSError):
                session.close()


def _listen_on(hosts: Sequence[str]) -> list[socket.socket]:
    """TCP listeners on every one of ``hosts``, all on the same (free) port."""
    for _ in range(20):
        first, bound = address.listen(address.tcp_address(hosts[0], 0))
        port = address.tcp_port(bound)
        listeners = [first]
        try:
            for host in hosts[1:]:
                try:
                    listeners.append(address.listen(address.tcp_address(host, port))[0])
                except OSError as exc:
                    if exc.errno != errno.EADDRNOTAVAIL:
                        raise
                    # that interface is gone (a gateway's network was torn down): skip it
        except OSError:
            for listener in listeners:
                listener.close()
            continue  # that port is taken on another interface: try another one
        return listeners
    raise OSError(f"no port free on all of {', '.join(hosts)}")


_lock = threading.Lock()
_service: TransferService | None = None
# Failed handshakes per peer, as the transport's listeners count them (issue 12 §3).
_auth_failures = FailureLimiter()


def ensure_service(secret: bytes, tcp_hosts: Sequence[str], unix_name: str) -> TransferService:
    """The transfer service of this process, started on first use.

    It listens on the TCP interfaces ``tcp_hosts`` (see ``_backends.choice.service_hosts``).
    """
    global _service
    with _lock:
        if _service is None:
            _service = TransferService(secret, tcp_hosts, unix_name)
        return _service


def _after_fork_in_child() -> None:
    global _service, _lock, _auth_failures
    _service, _lock, _auth_failures = None, threading.Lock(), FailureLimiter()


os.register_at_fork(after_in_child=_after_fork_in_child)
