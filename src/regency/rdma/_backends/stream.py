"""The TCP backend's client: chunked, pipelined transfers over parallel authenticated streams.

A transfer is cut into contiguous ranges, one per stream; each stream sends the requests for
all its chunks at once (reads) or back to back with their data (writes), then takes the replies
in order. Read data is received straight into the destination's memory (``recv_into``), write
data is sent straight from the source's memory: no intermediate copies on this side.
"""

from __future__ import annotations

import threading

from regency._transport.connection import ConnectionClosedError
from regency._transport.deadline import time_left
from regency._transport.tls import Stream
from regency.rdma import _parallel
from regency.rdma._handle import BufferHandle
from regency.rdma._memory import Region, view
from regency.rdma._pool import ConnectionPool
from regency.rdma._protocol import (
    REQUEST,
    Op,
    check_reply,
    connect,
    recv_exact_into,
)

CHUNK_BYTES = 4 << 20
MAX_STREAMS = 4

_pool: ConnectionPool[Stream] = ConnectionPool()


def _stream(
    sock: Stream,
    handle: BufferHandle,
    mem: memoryview,
    span: tuple[int, int],
    *,
    write: bool,
    deadline: float,
    failed: threading.Event,
) -> None:
    start, end = span
    chunks = [(off, min(CHUNK_BYTES, end - off)) for off in range(start, end, CHUNK_BYTES)]
    op = Op.WRITE if write else Op.READ
    heads = [REQUEST.pack(op, handle.buffer_id, handle.token, off, n, 0) for off, n in chunks]
    if not write:
        sock.settimeout(time_left(deadline))
        sock.sendall(b"".join(heads))
        for off, n in chunks:
            sock.settimeout(time_left(deadline))
            check_reply(sock, n)
            recv_exact_into(sock, mem[off : off + n], deadline)
            if failed.is_set():
                raise ConnectionClosedError("another stream of this transfer failed")
        return
    for head, (off, n) in zip(heads, chunks, strict=True):
        if failed.is_set():
            raise ConnectionClosedError("another stream of this transfer failed")
        sock.settimeout(time_left(deadline))
        sock.sendall(head)
        sock.sendall(mem[off : off + n])
    for _ in chunks:
        sock.settimeout(time_left(deadline))
        check_reply(sock, 0)


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
    """Move ``nbytes`` between ``local`` and the remote buffer through its transfer service."""
    mem = view(local.address, nbytes, writable=not write)

    def dial() -> Stream:
        return connect(target, secret, time_left(deadline))

    def job(span: tuple[int, int]) -> _parallel.Job:
        def run(failed: threading.Event) -> None:
            with _pool.lease(target, dial) as sock:
                _stream(sock, handle, mem, span, write=write, deadline=deadline, failed=failed)

        return run

    spans = _parallel.split(nbytes, _parallel.default_streams(MAX_STREAMS), CHUNK_BYTES)
    _parallel.run_all([job(span) for span in spans])


def drop(target: str, secret: bytes, handle: BufferHandle, deadline: float) -> None:
    """Ask the owner's transfer service to drop the registration."""
    with _pool.lease(target, lambda: connect(target, secret, time_left(deadline))) as sock:
        sock.settimeout(time_left(deadline))
        sock.sendall(REQUEST.pack(Op.DROP, handle.buffer_id, handle.token, 0, 0, 0))
        check_reply(sock, 0)


def forget(target: str) -> None:
    """Close idle connections to a service whose process is gone."""
    _pool.discard(target)
