"""Running transfers: validation, the backend plan with its fallbacks, and error translation.

Transfers run on a small thread pool, never on the caller's thread; each returns a regency
``Future``. Whatever goes wrong inside a backend is translated here into the user-facing
:class:`RDMAError` family, so every failure says which buffer, which owner and what happened.
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future as PoolFuture
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from regency._lowlevel import Pending, runtime
from regency._transport.auth import AuthenticationError
from regency.actor import Future
from regency.rdma._backends import choice as _choice
from regency.rdma._backends import cma as _cma
from regency.rdma._backends import cuda as _cuda
from regency.rdma._backends import shm as _shm
from regency.rdma._backends import stream as _stream
from regency.rdma._errors import (
    RDMABackendError,
    RDMABufferDroppedError,
    RDMAError,
    RDMAOwnerGoneError,
    RDMATimeoutError,
)
from regency.rdma._handle import BufferHandle
from regency.rdma._host import is_running, this_host
from regency.rdma._ibverbs import client as _ibv_client
from regency.rdma._ibverbs.load import IbvUnavailableError
from regency.rdma._memory import Region, region_of
from regency.rdma._protocol import RemoteRefusedError, Status
from regency.rdma._registry import registry

_WORKERS = 8
_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None


class Transfer(NamedTuple):
    """One validated transfer between a local region and a remote buffer."""

    handle: BufferHandle
    local: Region
    nbytes: int
    write: bool

    def describe(self) -> str:
        """E.g. ``read of 4096 bytes from RDMA buffer 0x... owned by <root>``."""
        verb = "write of" if self.write else "read of"
        way = "into" if self.write else "from"
        return f"{verb} {self.nbytes} bytes {way} {self.handle.describe()}"


def check_timeout(timeout: float) -> float:
    """Validate a user's ``timeout`` (seconds)."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, got {timeout!r}")
    if not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"timeout must be a positive, finite number of seconds, got {timeout}")
    return float(timeout)


def prepare(handle: BufferHandle, data: Any, *, write: bool) -> Transfer:
    """Validate a transfer before anything moves (``TypeError`` / ``ValueError``)."""
    local = region_of(data)
    if write:
        if not handle.writable:
            raise ValueError(f"cannot write: {handle.describe()} was registered read-only")
        if local.nbytes > handle.nbytes:
            raise ValueError(f"source of {local.nbytes} bytes is larger than {handle.describe()}")
        return Transfer(handle, local, local.nbytes, True)
    if not local.writable:
        raise ValueError("cannot read into a read-only destination")
    if local.nbytes < handle.nbytes:
        raise ValueError(f"destination of {local.nbytes} bytes is smaller than {handle.describe()}")
    return Transfer(handle, local, handle.nbytes, False)


# -- backends --------------------------------------------------------------------------------


def _owner_gone(t: Transfer, why: str) -> RDMAOwnerGoneError:
    served = _choice.service_address(t.handle)
    _stream.forget(served)
    _ibv_client.forget(served)
    _shm.forget(t.handle.unix_address)
    return RDMAOwnerGoneError(
        f"{t.describe()} failed: the owner's process (pid {t.handle.pid} at "
        f"{t.handle.proc_address}) {why}"
    )


def _dropped(t: Transfer, when: str) -> RDMABufferDroppedError:
    return RDMABufferDroppedError(f"{t.describe()} failed: the buffer was dropped {when}")


def _check_token(t: Transfer, when: str) -> None:
    """Read the owner's token slot one-sidedly; raise if the buffer is dropped or its owner gone."""
    h = t.handle
    try:
        live = _cma.read_word(h.pid, h.token_slot) == h.token
    except _cma.CmaProcessGoneError:
        raise _owner_gone(t, "is gone") from None
    except _cma.CmaBadAddressError:
        live = False
    if not live:
        if not is_running(h.pid, h.start_time):
            raise _owner_gone(t, "is gone")
        raise _dropped(t, when)


def _run_local(t: Transfer, deadline: float) -> None:
    h = t.handle
    entry = registry().lookup(h.buffer_id, h.token)
    if entry is None:
        raise _dropped(t, "before the transfer")
    remote = entry.region
    if t.local.is_cuda or remote.is_cuda:
        dst, src = (remote, t.local) if t.write else (t.local, remote)
        _cuda.copy_between(dst, src, t.nbytes)
    elif t.write:
        ctypes.memmove(remote.address, t.local.address, t.nbytes)
    else:
        ctypes.memmove(t.local.address, remote.address, t.nbytes)
    if registry().lookup(h.buffer_id, h.token) is None:
        raise _dropped(t, "during the transfer")


def _run_cma(t: Transfer, deadline: float) -> None:
    h = t.handle
    _check_token(t, "before the transfer")
    try:
        _cma.copy(
            h.pid,
            t.local.address,
            h.address,
            t.nbytes,
            write=t.write,
            deadline=deadline,
            before_chunk=(lambda: _check_token(t, "during the transfer")) if t.write else None,
        )
    except _cma.CmaBadAddressError:
        _check_token(t, "during the transfer")
        raise
    _check_token(t, "during the transfer")


def _run_cuda_ipc(t: Transfer, deadline: float) -> None:
    h = t.handle
    if not is_running(h.pid, h.start_time):
        raise _owner_gone(t, "is gone")
    if _choice.cma_usable():
        _check_token(t, "before the transfer")
    _cuda.ipc_copy((h.buffer_id, h.token), h.cuda_ipc, t.local, t.nbytes, write=t.write)
    if _choice.cma_usable():
        _check_token(t, "during the transfer")


def _run_service(t: Transfer, deadline: float, backend: str) -> None:
    h = t.handle
    secret = runtime().secret
    move = _shm.transfer if backend == "shm" else _stream.transfer
    target = h.unix_address if backend == "shm" else _choice.service_address(h)
    if not t.local.is_cuda:
        move(target, secret, h, t.local, t.nbytes, write=t.write, deadline=deadline)
        return
    staged = _cuda.pinned_region(t.nbytes)
    if t.write:
        _cuda.copy_between(staged, t.local, t.nbytes)
    move(target, secret, h, staged, t.nbytes, write=t.write, deadline=deadline)
    if not t.write:
        _cuda.copy_between(t.local, staged, t.nbytes)


def _run_ibverbs(t: Transfer, deadline: float) -> None:
    h = t.handle
    secret = runtime().secret
    _ibv_client.transfer(
        _choice.service_address(h), secret, h, t.local, t.nbytes, write=t.write, deadline=deadline
    )


def _run_host_only(run: Callable[[Transfer, float], None], t: Transfer, deadline: float) -> None:
    """Run a host-memory backend; GPU memory on this side is staged through pinned memory."""
    if not t.local.is_cuda:
        run(t, deadline)
        return
    staged = _cuda.pinned_region(t.nbytes)
    if t.write:
        _cuda.copy_between(staged, t.local, t.nbytes)
    run(t._replace(local=staged), deadline)
    if not t.write:
        _cuda.copy_between(t.local, staged, t.nbytes)


def _run_backend(backend: str, t: Transfer, deadline: float) -> None:
    if backend == "local":
        _run_local(t, deadline)
    elif backend == "cma":
        _run_host_only(_run_cma, t, deadline)
    elif backend == "ibverbs":
        _run_host_only(_run_ibverbs, t, deadline)
    elif backend == "cuda_ipc":
        _run_cuda_ipc(t, deadline)
    else:
        _run_service(t, deadline, backend)


def _translate(exc: BaseException, t: Transfer, timeout: float) -> BaseException:
    h = t.handle
    if isinstance(exc, RDMAError):
        return exc
    if isinstance(exc, TimeoutError):
        return RDMATimeoutError(f"{t.describe()} did not finish within {timeout:g} s")
    if isinstance(exc, RemoteRefusedError):
        if exc.status == Status.DROPPED:
            return _dropped(t, f"(the owner says: {exc})")
        return RDMAError(f"{t.describe()} was refused by the owner: {exc}")
    if isinstance(exc, AuthenticationError):
        return RDMAError(
            f"{t.describe()} failed: the owner's transfer service did not accept this job's "
            f"secret (is the buffer from another job?): {exc}"
        )
    if isinstance(exc, (_cma.CmaProcessGoneError, ConnectionError)):
        if h.host.shares_memory_with(this_host()) and not is_running(h.pid, h.start_time):
            return _owner_gone(t, "is gone")
        if isinstance(exc, _cma.CmaProcessGoneError):
            return _owner_gone(t, "is gone")
        return _owner_gone(t, f"cannot be reached ({type(exc).__name__}: {exc})")
    if isinstance(exc, OSError):
        return RDMAError(f"{t.describe()} failed: {exc}")
    return exc


def run(t: Transfer, deadline: float, timeout: float) -> None:
    """Run one transfer to completion on the calling thread, falling back where allowed."""
    if t.nbytes == 0:
        return
    try:
        chain = _choice.plan(t.handle)
        for i, backend in enumerate(chain):
            later = chain[i + 1] if i + 1 < len(chain) else None
            try:
                _run_backend(backend, t, deadline)
                return
            except _cma.CmaDeniedError as exc:
                if later is None:
                    raise RDMAError(f"{t.describe()} failed: {exc}") from exc
                _choice.deny_cma(str(exc), later)
            except _cuda.CudaIpcUnavailableError as exc:
                if later is None:
                    raise RDMAError(f"{t.describe()} failed: {exc}") from exc
                _choice.warn_once("cuda_ipc", later, str(exc))
            except IbvUnavailableError as exc:
                if later is None:
                    raise RDMABackendError(f"{t.describe()} cannot use ibverbs: {exc}") from exc
                if exc.lasting:
                    _choice.deny_ibverbs(t.handle.tcp_address, str(exc), later)
                else:
                    _choice.warn_once("ibverbs", later, str(exc))
    except BaseException as exc:
        translated = _translate(exc, t, timeout)
        if translated is exc:
            raise
        raise translated from exc


# -- futures ---------------------------------------------------------------------------------


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(_WORKERS, thread_name_prefix="regency-rdma")
        return _executor


def submit_all(transfers: Sequence[Transfer], timeout: float) -> Future[None]:
    """Run ``transfers`` in parallel on the transfer pool; one ``Future`` for all of them.

    It fails with the first failure (by submission order) once every transfer has ended.
    """
    deadline = time.monotonic() + timeout
    pending = Pending()
    if not transfers:
        pending.set_result(None)
        return Future._from_pending(pending)
    outcomes: list[BaseException | None] = [None] * len(transfers)
    left = [len(transfers)]
    guard = threading.Lock()

    def finished(index: int) -> Callable[[PoolFuture[None]], None]:
        def done(future: PoolFuture[None]) -> None:
            outcomes[index] = future.exception()
            with guard:
                left[0] -= 1
                last = left[0] == 0
            if last:
                errors = [e for e in outcomes if e is not None]
                if errors:
                    pending.set_exception(errors[0])
                else:
                    pending.set_result(None)

        return done

    for index, t in enumerate(transfers):
        _pool().submit(run, t, deadline, timeout).add_done_callback(finished(index))
    return Future._from_pending(pending)


def submit_call(work: Callable[[], None]) -> Future[None]:
    """Run ``work`` on the transfer pool; a ``Future`` of its outcome."""
    pending = Pending()

    def done(future: PoolFuture[None]) -> None:
        exc = future.exception()
        if exc is None:
            pending.set_result(None)
        else:
            pending.set_exception(exc)

    _pool().submit(work).add_done_callback(done)
    return Future._from_pending(pending)


def _after_fork_in_child() -> None:
    global _executor, _lock
    _executor, _lock = None, threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
