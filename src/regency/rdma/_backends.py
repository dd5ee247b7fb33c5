"""Which backends exist here, which one a transfer uses, and the fallbacks between them.

A transfer picks the first usable backend of a plan that depends on where the buffer lives:

* in this very process: ``local`` (a plain ``memmove`` or tensor copy);
* on this host (same kernel, same PID namespace): ``cma`` (cross-memory attach, one-sided),
  then ``shm`` (memfd staging through the owner's transfer service; needs the same network
  namespace to dial its abstract Unix socket), then ``tcp``;
* GPU memory on this host: ``cuda_ipc``, then ``tcp``;
* on another host: ``tcp`` (``ibverbs`` is detected but has no data path yet).

``REGENCY_RDMA_BACKEND`` (``cma``, ``shm`` or ``tcp``) or ``RDMABuffer(..., backend=...)`` force
one; the buffer's own choice wins over the variable of the process doing the transfer. When
the kernel refuses cross-memory attach, the next backend is used and a warning says so once.
"""

from __future__ import annotations

import functools
import os
import threading
import warnings

from regency.rdma import _cma
from regency.rdma._errors import RDMABackendError, RDMAFallbackWarning, RDMATcpFallbackWarning
from regency.rdma._handle import BufferHandle
from regency.rdma._host import start_time, this_host

BACKEND_ENV = "REGENCY_RDMA_BACKEND"
CHOICES = ("cma", "shm", "tcp", "ibverbs")

_lock = threading.Lock()
_cma_denied = False
_warned: set[tuple[str, str]] = set()


def check_backend_name(name: str) -> str:
    """Validate a backend name given by a user (``ValueError`` if unknown)."""
    canonical = name.strip().lower()
    if canonical not in CHOICES:
        raise ValueError(f"unknown RDMA backend {name!r}; choose one of {', '.join(CHOICES)}")
    return canonical


@functools.lru_cache(maxsize=1)
def is_ibverbs_available() -> bool:
    """Whether ``pyverbs`` is installed and sees at least one RDMA device."""
    try:
        from pyverbs.device import get_device_list  # type: ignore[import-not-found]

        return len(get_device_list()) > 0
    except Exception:  # not installed, or no rdma-core / device nodes
        return False


def cma_usable() -> bool:
    """Whether cross-memory attach works for this process (probed once; refused once = never)."""
    return not _cma_denied and _cma.allowed_here()


def get_rdma_backend() -> str:
    """The fastest backend present here: ``"ibverbs"``, else ``"cma"``, else ``"tcp"``."""
    if is_ibverbs_available():
        return "ibverbs"
    return "cma" if cma_usable() else "tcp"


def warn_once(source: str, target: str, why: str) -> None:
    """Warn, once per process and pair, that ``target`` is used because ``source`` was refused."""
    with _lock:
        if (source, target) in _warned:
            return
        _warned.add((source, target))
    category = RDMATcpFallbackWarning if target == "tcp" else RDMAFallbackWarning
    warnings.warn(
        f"RDMA backend {source!r} is not available ({why}); using {target!r} instead",
        category,
        stacklevel=2,
    )


def deny_cma(why: str, target: str) -> None:
    """Record that the kernel refused cross-memory attach; later plans skip it."""
    global _cma_denied
    _cma_denied = True
    warn_once("cma", target, why)


@functools.lru_cache(maxsize=1)
def _my_start_time() -> int | None:
    return start_time(os.getpid())


def is_this_process(handle: BufferHandle) -> bool:
    """Whether the buffer is owned by the calling process."""
    return (
        handle.pid == os.getpid()
        and handle.host == this_host()
        and handle.start_time == _my_start_time()
    )


def _requested(handle: BufferHandle) -> str | None:
    if handle.backend is not None:
        return handle.backend
    env = os.environ.get(BACKEND_ENV, "").strip()
    return check_backend_name(env) if env else None


def plan(handle: BufferHandle, *, from_owner_peer: bool = False) -> list[str]:
    """The backends to try, best first, for a transfer from this process to ``handle``.

    With ``from_owner_peer`` the plan is made for another process on the owner's host (what
    ``RDMABuffer.backend`` shows in the owner itself).
    """
    here = this_host()
    same_memory = here.shares_memory_with(handle.host)
    same_sockets = here.shares_unix_sockets_with(handle.host)
    local = not from_owner_peer and is_this_process(handle)
    forced = _requested(handle)
    if forced == "ibverbs":
        raise RDMABackendError(
            "the ibverbs backend is not available: regency detects RDMA NICs through pyverbs "
            f"(found: {is_ibverbs_available()}) but has no ibverbs data path yet; "
            "use cma, shm or tcp"
        )
    if handle.device != "cpu":
        if local and forced is None:
            return ["local"]
        if forced == "tcp" or not same_memory:
            return ["tcp"]
        return ["cuda_ipc", "tcp"]
    if forced is None:
        if local:
            return ["local"]
        if not same_memory:
            if is_ibverbs_available():
                warn_once("ibverbs", "tcp", "regency has no ibverbs data path yet")
            return ["tcp"]
        forced = "cma"
    if forced in ("cma", "shm") and not same_memory:
        raise RDMABackendError(
            f"backend {forced!r} needs the buffer's owner on this host, but it runs on "
            f"{handle.host.hostname} (another kernel or PID namespace); use 'tcp'"
        )
    if forced == "shm" and not same_sockets:
        raise RDMABackendError(
            "backend 'shm' needs the owner in this network namespace (to reach its Unix socket)"
        )
    if forced == "cma":
        rest = ["shm", "tcp"] if same_sockets else ["tcp"]
        if cma_usable():
            return ["cma", *rest]
        warn_once("cma", rest[0], "the kernel refuses process_vm_readv for this process")
        return rest
    return [forced]


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    _my_start_time.cache_clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
