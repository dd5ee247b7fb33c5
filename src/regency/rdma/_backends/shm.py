"""The shared-memory backend's client: a sealed memfd handed to the owner's transfer service.

For peers on one host where cross-memory attach is not allowed. Each channel is an
authenticated Unix connection to the owner's service plus a memfd of two slots, passed once
with ``SCM_RIGHTS`` and sealed against shrinking (so the owner can never fault on it). The
service copies between the buffer and a slot; this side copies between the slot and local
memory. The two slots are double-buffered, so both copies run at once, and a large transfer uses
up to two channels in parallel.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import mmap
import os
import socket
import threading
from collections import deque
from typing import Any

from regency._transport.connection import ConnectionClosedError
from regency._transport.deadline import time_left
from regency.rdma import _parallel
from regency.rdma._handle import BufferHandle
from regency.rdma._memory import Region
from regency.rdma._pool import ConnectionPool
from regency.rdma._protocol import (
    REQUEST,
    Op,
    RemoteRefusedError,
    Status,
    check_reply,
    connect,
    read_error,
    read_reply,
)

SLOT_BYTES = 8 << 20
SLOTS = 2
MAX_CHANNELS = 2
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class _Channel:
    """A Unix connection to one owner's service, with an attached memfd staging area."""

    def __init__(self, target: str, secret: bytes, timeout: float) -> None:
        sock = connect(target, secret, timeout)
        assert isinstance(sock, socket.socket)  # a unix connection: no TLS
        self.sock = sock
        self.map: mmap.mmap | None = None
        self._anchor: Any = None
        try:
            fd = os.memfd_create("regency-rdma", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            try:
                os.ftruncate(fd, SLOT_BYTES * SLOTS)
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
                self.map = mmap.mmap(fd, SLOT_BYTES * SLOTS)
                head = REQUEST.pack(Op.SHM_ATTACH, 0, 0, 0, SLOT_BYTES * SLOTS, 0)
                socket.send_fds(self.sock, [head], [fd])
            finally:
                os.close(fd)
            status, n = read_reply(self.sock)
            if status != Status.OK:
                raise RemoteRefusedError(status, read_error(self.sock, n))
            self._anchor = ctypes.c_char.from_buffer(self.map)
            self.address = ctypes.addressof(self._anchor)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Unmap the staging area and close the connection."""
        self._anchor = None
        if self.map is not None:
            with contextlib.suppress(BufferError):
                self.map.close()
        self.sock.close()


_pool: ConnectionPool[_Channel] = ConnectionPool()


def _stream(
    chan: _Channel,
    handle: BufferHandle,
    local: int,
    span: tuple[int, int],
    *,
    write: bool,
    deadline: float,
    failed: threading.Event,
) -> None:
    start, end = span
    chunks = [(off, min(SLOT_BYTES, end - off)) for off in range(start, end, SLOT_BYTES)]
    op = Op.SHM_WRITE if write else Op.SHM_READ
    inflight: deque[tuple[int, int, int]] = deque()

    def post(index: int) -> None:
        off, n = chunks[index]
        slot = (index % SLOTS) * SLOT_BYTES
        if write:
            ctypes.memmove(chan.address + slot, local + off, n)
        chan.sock.settimeout(time_left(deadline))
        chan.sock.sendall(REQUEST.pack(op, handle.buffer_id, handle.token, off, n, slot))
        inflight.append((off, n, slot))

    def complete() -> None:
        off, n, slot = inflight.popleft()
        chan.sock.settimeout(time_left(deadline))
        check_reply(chan.sock, 0)
        if not write:
            ctypes.memmove(local + off, chan.address + slot, n)

    for index in range(len(chunks)):
        if failed.is_set():
            raise ConnectionClosedError("another stream of this transfer failed")
        if len(inflight) == SLOTS:
            complete()
        post(index)
    while inflight:
        complete()


def transfer(
    target: str,
    secret: bytes,
    handle: BufferHandle,
    local: Region,
    nbytes: int,
    *,
    write: bool,
    deadline: float,
) -> None:
    """Move ``nbytes`` between ``local`` and the remote buffer through a shared memfd."""

    def job(span: tuple[int, int]) -> _parallel.Job:
        def run(failed: threading.Event) -> None:
            with _pool.lease(target, lambda: _Channel(target, secret, time_left(deadline))) as chan:
                _stream(
                    chan, handle, local.address, span, write=write, deadline=deadline, failed=failed
                )

        return run

    spans = _parallel.split(nbytes, _parallel.default_streams(MAX_CHANNELS), SLOT_BYTES)
    _parallel.run_all([job(span) for span in spans])


def forget(target: str) -> None:
    """Close idle channels to a service whose process is gone."""
    _pool.discard(target)
