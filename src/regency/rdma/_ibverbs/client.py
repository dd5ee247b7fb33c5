"""The reader's side of the ibverbs backend: channels to owners, and transfers over them.

A *channel* is an authenticated connection to the owner's transfer service plus a queue pair
connected to one the owner made for it (``IBV_CONNECT``), and a pre-registered staging region.
Idle channels are kept per owner, like the TCP backend's connections. A transfer fetches the
buffer's remote key once (``IBV_KEY``, cached per process), registers the local memory for the
duration of the transfer (or copies through the staging region when it is small), then posts
RDMA READs or WRITEs chunk by chunk, several in flight, and polls the completion queue until all
are done or the deadline passes.

When a request fails, the owner's service says why: a refused key with the buffer gone is a
dropped buffer, a service that cannot be reached is a dead owner, anything else is reported
with the work completion's status. A channel that saw any failure is closed, never reused.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import os
import socket
import threading
import time
from collections import OrderedDict

from regency._transport.connection import ConnectionClosedError
from regency._transport.deadline import time_left
from regency.rdma._handle import BufferHandle
from regency.rdma._ibverbs.load import (
    IbvUnavailableError,
    close_quietly,
    data_path_errors,
    verbs_errors,
)
from regency.rdma._ibverbs.plan import (
    STAGING_BYTES,
    Window,
    chunk_size,
    chunks,
    make_wr_id,
    next_epoch,
    pause_after,
    split_wr_id,
    use_staging,
)
from regency.rdma._ibverbs.port import agree_depth
from regency.rdma._ibverbs.status import (
    IbvCompletionError,
    completion_error,
    first_failure,
    needs_owner,
)
from regency.rdma._ibverbs.verbs import Endpoint, Registered, device
from regency.rdma._ibverbs.wire import KEY_BYTES, QP_INFO_BYTES, QpInfo, RemoteKey
from regency.rdma._memory import Region
from regency.rdma._pool import ConnectionPool
from regency.rdma._protocol import (
    REQUEST,
    Op,
    RemoteRefusedError,
    Status,
    connect,
    read_error,
    read_reply,
    recv_exact,
)

_KEY_CACHE_SIZE = 4096


class _KeyCache:
    """Remote keys of buffers (or the owner's reason not to give one), per owner."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: OrderedDict[tuple[str, int, int], RemoteKey | str] = OrderedDict()

    def get(self, target: str, handle: BufferHandle) -> RemoteKey | str | None:
        with self._lock:
            found = self._keys.get((target, handle.buffer_id, handle.token))
            if found is not None:
                self._keys.move_to_end((target, handle.buffer_id, handle.token))
            return found

    def put(self, target: str, handle: BufferHandle, key: RemoteKey | str) -> None:
        with self._lock:
            self._keys[(target, handle.buffer_id, handle.token)] = key
            while len(self._keys) > _KEY_CACHE_SIZE:
                self._keys.popitem(last=False)

    def evict(self, target: str, handle: BufferHandle) -> None:
        with self._lock:
            self._keys.pop((target, handle.buffer_id, handle.token), None)

    def forget(self, target: str) -> None:
        with self._lock:
            for k in [k for k in self._keys if k[0] == target]:
                del self._keys[k]


class _Channel:
    """A service connection and a connected queue pair to one owner; one user at a time."""

    def __init__(self, target: str, secret: bytes, deadline: float) -> None:
        self.sock = connect(target, secret, time_left(deadline))
        self.endpoint: Endpoint | None = None
        self.staging: Registered | None = None
        self.epoch = 0
        try:
            dev = device()
            with verbs_errors("creating a queue pair failed", lasting=True):
                self.endpoint = dev.endpoint(remote_access=False)
                mine = self.endpoint.info(dev.initiator_depth)
            theirs = self._handshake(mine, deadline)
            with verbs_errors("connecting to the owner's queue pair failed", lasting=True):
                depth = agree_depth(theirs.depth, dev.initiator_depth)
                self.endpoint.connect(theirs, initiator_depth=depth, responder_depth=1)
                self.staging = dev.allocate(STAGING_BYTES)
            self.chunk = chunk_size(dev.choice.max_msg, theirs.max_msg)
            self.window = dev.window
        except BaseException:
            self.close()
            raise

    def _handshake(self, mine: QpInfo, deadline: float) -> QpInfo:
        body = mine.pack()
        self.sock.settimeout(time_left(deadline))
        self.sock.sendall(REQUEST.pack(Op.IBV_CONNECT, 0, 0, 0, len(body), 0) + body)
        status, n = read_reply(self.sock)
        if status == Status.UNSUPPORTED:
            raise IbvUnavailableError(read_error(self.sock, n), lasting=True)
        if status != Status.OK:
            raise RemoteRefusedError(status, read_error(self.sock, n))
        if n != QP_INFO_BYTES:
            raise ConnectionClosedError(f"queue pair info of {n} bytes, expected {QP_INFO_BYTES}")
        try:
            return QpInfo.unpack(recv_exact(self.sock, n))
        except ValueError as exc:
            raise IbvUnavailableError(f"the owner's queue pair: {exc}", lasting=True) from exc

    def idle_ok(self) -> bool:
        """Whether an idle channel is still usable: its owner has not closed the connection.

        An idle connection has nothing to read; an end of stream (or anything else) means the
        owner's side is gone or out of step.
        """
        self.sock.setblocking(False)  # every exchange sets its own timeout first
        try:
            self.sock.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return True
        except OSError:
            return False
        return False

    def fetch_key(self, handle: BufferHandle, deadline: float) -> RemoteKey | str:
        """The buffer's remote key, or the owner's reason not to serve it over ibverbs.

        Raises :class:`RemoteRefusedError` (e.g. dropped), or ``OSError`` if the owner's
        service cannot be reached.
        """
        self.sock.settimeout(time_left(deadline))
        self.sock.sendall(REQUEST.pack(Op.IBV_KEY, handle.buffer_id, handle.token, 0, 0, 0))
        status, n = read_reply(self.sock)
        if status == Status.UNSUPPORTED:
            return read_error(self.sock, n)
        if status != Status.OK:
            raise RemoteRefusedError(status, read_error(self.sock, n))
        if n != KEY_BYTES:
            raise ConnectionClosedError(f"remote key of {n} bytes, expected {KEY_BYTES}")
        key = RemoteKey.unpack(recv_exact(self.sock, n))
        try:
            key.check_covers(handle.address, handle.nbytes)
        except ValueError as exc:
            raise OSError(f"the owner's key does not match the buffer: {exc}") from exc
        return key

    def move(
        self,
        handle: BufferHandle,
        key: RemoteKey,
        local: Registered,
        nbytes: int,
        *,
        write: bool,
        deadline: float,
    ) -> None:
        """Move ``nbytes`` between ``local`` and the buffer's start, several chunks in flight."""
        assert self.endpoint is not None
        endpoint = self.endpoint
        self.epoch = next_epoch(self.epoch)
        parts = chunks(nbytes, self.chunk)
        window = Window(len(parts), self.window)
        operation = "RDMA WRITE" if write else "RDMA READ"
        empty = 0
        while not window.done:
            for index in window.take():
                offset, length = parts[index]
                with data_path_errors(f"posting an {operation} failed"):
                    endpoint.post(
                        make_wr_id(self.epoch, index),
                        write=write,
                        local=local.address + offset,
                        length=length,
                        lkey=local.lkey,
                        rkey=key.rkey,
                        remote=key.address + offset,
                    )
            with data_path_errors("polling the completion queue failed"):
                got = endpoint.poll(window.outstanding)
            time_left(deadline)
            if not got:
                empty += 1
                pause = pause_after(empty)
                if pause:
                    time.sleep(pause)
                continue
            empty = 0
            for c in got:
                epoch, index = split_wr_id(c.wr_id)
                if epoch != self.epoch:
                    raise IbvCompletionError(f"a completion of another transfer ({c.wr_id:#x})")
                try:
                    window.complete(index)
                except ValueError as exc:
                    raise IbvCompletionError(str(exc)) from exc
            failed = first_failure(got)
            if failed is not None:
                if needs_owner(failed):
                    self.fetch_key(handle, deadline)  # raises if dropped or the owner is gone
                raise completion_error(operation, failed)

    def close(self) -> None:
        """Destroy the queue pair first (no more DMA), then the staging region; idempotent."""
        if self.endpoint is not None:
            self.endpoint.close()
            self.endpoint = None
        if self.staging is not None:
            close_quietly(self.staging)
            self.staging = None
        self.sock.close()


_pool: ConnectionPool[_Channel] = ConnectionPool()
_keys = _KeyCache()


def _key(chan: _Channel, target: str, handle: BufferHandle, deadline: float) -> RemoteKey:
    found = _keys.get(target, handle)
    if found is None:
        found = chan.fetch_key(handle, deadline)
        _keys.put(target, handle, found)
    if isinstance(found, str):
        raise IbvUnavailableError(f"the owner cannot serve this buffer: {found}", lasting=False)
    return found


def _run(
    chan: _Channel,
    handle: BufferHandle,
    key: RemoteKey,
    local: Region,
    registered: Registered | None,
    nbytes: int,
    *,
    write: bool,
    deadline: float,
) -> None:
    if registered is not None:
        chan.move(handle, key, registered, nbytes, write=write, deadline=deadline)
        return
    staging = chan.staging
    assert staging is not None
    if write:
        ctypes.memmove(staging.address, local.address, nbytes)
    chan.move(handle, key, staging, nbytes, write=write, deadline=deadline)
    if not write:
        ctypes.memmove(local.address, staging.address, nbytes)


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
    """Move ``nbytes`` between ``local`` (host memory) and the remote buffer over RDMA.

    Raises :class:`IbvUnavailableError` when ibverbs cannot serve it (the caller falls back),
    :class:`RemoteRefusedError` / ``OSError`` / ``TimeoutError`` like the other backends.
    """
    known = _keys.get(target, handle)
    if isinstance(known, str):
        raise IbvUnavailableError(f"the owner cannot serve this buffer: {known}", lasting=False)
    registered: Registered | None = None
    if not use_staging(nbytes):
        with verbs_errors(
            f"registering {nbytes} bytes of local memory with the RDMA NIC failed (the memlock "
            "limit, `ulimit -l`, caps how much memory a process may register)",
            lasting=False,
        ):
            registered = device().register(local.address, nbytes, remote=False, writable=not write)
    try:
        refused: IbvUnavailableError | RemoteRefusedError | None = None
        dial = functools.partial(_Channel, target, secret, deadline)
        with _pool.lease(target, dial, _Channel.idle_ok) as chan:
            try:
                key = _key(chan, target, handle, deadline)
            except (IbvUnavailableError, RemoteRefusedError) as exc:
                refused = exc  # the owner answered in full; the channel goes back to the pool
            else:
                try:
                    _run(
                        chan, handle, key, local, registered, nbytes, write=write, deadline=deadline
                    )
                except BaseException:
                    _keys.evict(target, handle)
                    raise
        if refused is not None:
            raise refused
    finally:
        if registered is not None:
            close_quietly(registered)


def forget(target: str) -> None:
    """Close idle channels to an owner that is gone, and forget its keys."""
    _pool.discard(target)
    _keys.forget(target)


def _after_fork_in_child() -> None:
    global _keys
    _keys = _KeyCache()


atexit.register(_pool.close_all)
os.register_at_fork(after_in_child=_after_fork_in_child)
