"""Cross-memory attach: ``process_vm_readv`` / ``process_vm_writev`` through ctypes.

The kernel copies straight between two address spaces; the other process takes no part and may
be busy or blocked. It needs the same user and a kernel that allows ptrace-style access (Yama
``ptrace_scope`` 0 or 1 for non-descendants with the same uid, no seccomp filter refusing the
calls). Large transfers are cut into chunks so a deadline is checked between them.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import threading
import time
from collections.abc import Callable

from regency._errors import RegencyError
from regency._transport.deadline import DeadlineError
from regency.rdma import _parallel

CHUNK_BYTES = 8 << 20
PARALLEL_MIN_BYTES = 16 << 20
MAX_STREAMS = 4


class _IoVec(ctypes.Structure):
    _fields_ = (("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t))


_libc = ctypes.CDLL(None, use_errno=True)
_SIGNATURE = (
    ctypes.c_int,
    ctypes.POINTER(_IoVec),
    ctypes.c_ulong,
    ctypes.POINTER(_IoVec),
    ctypes.c_ulong,
    ctypes.c_ulong,
)
_readv = _libc.process_vm_readv
_readv.argtypes = _SIGNATURE
_readv.restype = ctypes.c_ssize_t
_writev = _libc.process_vm_writev
_writev.argtypes = _SIGNATURE
_writev.restype = ctypes.c_ssize_t


class CmaDeniedError(RegencyError, PermissionError):
    """The kernel refuses cross-memory attach to that process (other user, hardened kernel)."""


class CmaProcessGoneError(RegencyError, ProcessLookupError):
    """The other process is gone (or a zombie without memory)."""


class CmaBadAddressError(RegencyError, OSError):
    """Part of the remote range is not mapped any more."""


def _copy_once(pid: int, local: int, remote: int, nbytes: int, *, write: bool) -> int:
    liov = _IoVec(local, nbytes)
    riov = _IoVec(remote, nbytes)
    call = _writev if write else _readv
    done = call(pid, ctypes.byref(liov), 1, ctypes.byref(riov), 1, 0)
    if done >= 0:
        return int(done)
    err = ctypes.get_errno()
    if err in (errno.EPERM, errno.EACCES, errno.ENOSYS):
        raise CmaDeniedError(err, f"cross-memory attach to pid {pid}: {os.strerror(err)}")
    if err == errno.ESRCH:
        raise CmaProcessGoneError(err, f"process {pid} is gone")
    if err == errno.EFAULT:
        raise CmaBadAddressError(err, f"range at {remote:#x} is not mapped in pid {pid}")
    raise OSError(err, f"cross-memory attach to pid {pid}: {os.strerror(err)}")


def _copy_range(
    pid: int,
    local: int,
    remote: int,
    nbytes: int,
    *,
    write: bool,
    deadline: float,
    before_chunk: Callable[[], None] | None,
    failed: threading.Event,
) -> None:
    done = 0
    while done < nbytes:
        if failed.is_set():
            return
        if time.monotonic() > deadline:
            raise DeadlineError(f"deadline passed after {done} of {nbytes} bytes")
        if before_chunk is not None:
            before_chunk()
        step = min(CHUNK_BYTES, nbytes - done)
        moved = _copy_once(pid, local + done, remote + done, step, write=write)
        if moved == 0:
            raise CmaBadAddressError(errno.EFAULT, f"no progress at offset {done} in pid {pid}")
        done += moved


def copy(
    pid: int,
    local: int,
    remote: int,
    nbytes: int,
    *,
    write: bool,
    deadline: float,
    before_chunk: Callable[[], None] | None = None,
) -> None:
    """Copy ``nbytes`` between ``local`` (here) and ``remote`` (in ``pid``).

    Large transfers run as one contiguous range per core, side by side: the kernel's copy is
    bound by pinning pages and copying them on one CPU, so two CPUs nearly double it.
    ``before_chunk`` runs before every chunk (a write checks that the buffer is still live).
    """
    streams = _parallel.default_streams(MAX_STREAMS) if nbytes >= PARALLEL_MIN_BYTES else 1
    spans = _parallel.split(nbytes, streams, CHUNK_BYTES)

    def job(span: tuple[int, int]) -> _parallel.Job:
        start, end = span

        def run(failed: threading.Event) -> None:
            _copy_range(
                pid,
                local + start,
                remote + start,
                end - start,
                write=write,
                deadline=deadline,
                before_chunk=before_chunk,
                failed=failed,
            )

        return run

    _parallel.run_all([job(span) for span in spans])


def read_word(pid: int, remote: int) -> int:
    """The unsigned 64-bit word at ``remote`` in ``pid``."""
    word = ctypes.c_uint64(0)
    if _copy_once(pid, ctypes.addressof(word), remote, 8, write=False) != 8:
        raise CmaBadAddressError(errno.EFAULT, f"short read of the word at {remote:#x}")
    return int(word.value)


@functools.lru_cache(maxsize=1)
def allowed_here() -> bool:
    """Whether this kernel lets this process use cross-memory attach at all (a self-probe)."""
    probe = ctypes.c_uint64(0x5EED)
    try:
        return read_word(os.getpid(), ctypes.addressof(probe)) == 0x5EED
    except OSError:
        return False
