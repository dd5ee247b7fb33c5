"""Which backends exist here, which one a transfer uses, and the fallbacks between them.

A transfer picks the first usable backend of a plan that depends on where the buffer lives:

* in this very process: ``local`` (a plain ``memmove`` or tensor copy);
* on this host (same kernel, same PID namespace): ``cma`` (cross-memory attach, one-sided),
  then ``shm`` (memfd staging through the owner's transfer service; needs the same network
  namespace to dial its abstract Unix socket), then ``tcp``;
* GPU memory on this host: ``cuda_ipc``, then ``tcp``;
* host memory on another host: ``ibverbs`` (one-sided RDMA through pyverbs) when this process
  and the owner's both have a usable RDMA NIC, then ``tcp``; GPU memory there: ``tcp``.

``REGENCY_RDMA_BACKEND`` (``cma``, ``shm``, ``tcp`` or ``ibverbs``) or
``RDMABuffer(..., backend=...)`` force one; the buffer's own choice wins over the variable of
the process doing the transfer. When the kernel refuses cross-memory attach, or ibverbs cannot
reach an owner, the next backend is used and a warning says so once.
"""

from __future__ import annotations

import functools
import os
import threading
import warnings

from regency._lowlevel import gateway_ips, runtime
from regency._transport import address
from regency.rdma import _service
from regency.rdma._backends import cma as _cma
from regency.rdma._errors import RDMABackendError, RDMAFallbackWarning, RDMATcpFallbackWarning
from regency.rdma._handle import BufferHandle
from regency.rdma._host import start_time, this_host
from regency.rdma._ibverbs import probe as _ibv_probe

BACKEND_ENV = "REGENCY_RDMA_BACKEND"
CHOICES = ("cma", "shm", "tcp", "ibverbs")

_lock = threading.Lock()
_cma_denied = False
_ibverbs_denied: set[str] = set()
_warned: set[tuple[str, str]] = set()


# Owners on the controller's machine (unix-addressed procs) serve transfers on loopback and on
# the interfaces the controller's gateways listen on; their handles say WILDCARD for that.
WILDCARD = _service.WILDCARD


def service_hosts() -> list[str]:
    """The interfaces this process's transfer service listens on.

    A proc on a worker host: its own address's. On the controller's machine: loopback, and the
    interfaces other hosts reach the controller on (its gateways: the controller's current
    ones, or, in a proc, those open when it started), so a single-host job listens on loopback
    only.
    """
    rt = runtime()
    if address.is_tcp(rt.address):
        return [address.tcp_host(rt.address)]
    ips = gateway_ips() or list(rt.gateway_ips)
    return ["127.0.0.1", *[ip for ip in ips if ip != "127.0.0.1"]]


def service_address(handle: BufferHandle) -> str:
    """Where this process dials the owner's transfer service over TCP.

    An owner listening on every interface of the controller's machine is dialed on the address
    this process reaches that machine by (its gateway to the controller) when it runs on another
    host, and on loopback from the controller's machine itself (which has no gateway).
    """
    served = handle.tcp_address
    if address.tcp_host(served) != WILDCARD:
        return served
    port = address.tcp_port(served)
    gateway = runtime().transport.gateway
    if gateway is None or this_host().shares_unix_sockets_with(handle.host):
        return address.tcp_address("127.0.0.1", port)
    return address.tcp_address(address.tcp_host(gateway), port)


def check_backend_name(name: str) -> str:
    """Validate a backend name given by a user (``ValueError`` if unknown)."""
    canonical = name.strip().lower()
    if canonical not in CHOICES:
        raise ValueError(f"unknown RDMA backend {name!r}; choose one of {', '.join(CHOICES)}")
    return canonical


def is_ibverbs_available() -> bool:
    """Whether this process can use ibverbs: pyverbs imports, a device opens, a port is active.

    Probed once per process (``REGENCY_RDMA_IBV_DEVICE`` picks the device and port).
    """
    return _ibv_probe.availability().usable


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


def deny_ibverbs(owner: str, why: str, target: str) -> None:
    """Record that ibverbs cannot reach the owner at ``owner``; later plans skip it there."""
    with _lock:
        _ibverbs_denied.add(owner)
    warn_once("ibverbs", target, why)


def remote_chain(*, owner_has_nic: bool, here_has_nic: bool, denied: bool) -> list[str]:
    """The backends for host memory on another host, best first.

    ibverbs when both processes have a usable RDMA NIC and it has not failed for this owner
    before, then TCP (which always works).
    """
    if owner_has_nic and here_has_nic and not denied:
        return ["ibverbs", "tcp"]
    return ["tcp"]


def ibverbs_refusal(*, device: str, here: str | None, owner_has_nic: bool) -> str | None:
    """Why a forced ``ibverbs`` cannot serve a buffer, or ``None`` if it can be tried.

    ``device`` is where the buffer's memory lives, ``here`` why this process has no usable
    NIC (``None`` when it has one), ``owner_has_nic`` whether the owner's process has one.
    """
    if device != "cpu":
        return (
            f"backend 'ibverbs' moves host memory only, and this buffer is on {device} "
            "(no GPUDirect RDMA); use 'tcp' or leave the backend unset (CUDA IPC on one host)"
        )
    if here is not None:
        return f"backend 'ibverbs' is not usable in this process: {here}"
    if not owner_has_nic:
        return "backend 'ibverbs' needs a usable RDMA NIC in the buffer's owner, which has none"
    return None


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
    ``RDMABuffer.backend`` shows in the owner itself). A forced ``ibverbs`` is tried alone, on
    the same host too (through the NIC's loopback); it raises ``RDMABackendError`` at once if
    this process or the owner has no usable NIC, or the memory is on a GPU.
    """
    here = this_host()
    same_memory = here.shares_memory_with(handle.host)
    same_sockets = here.shares_unix_sockets_with(handle.host)
    local = not from_owner_peer and is_this_process(handle)
    forced = _requested(handle)
    if forced == "ibverbs":
        found = _ibv_probe.availability()
        refusal = ibverbs_refusal(
            device=handle.device,
            here=None if found.usable else found.detail,
            owner_has_nic=handle.ibverbs,
        )
        if refusal is not None:
            raise RDMABackendError(refusal)
        return ["ibverbs"]
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
            with _lock:
                denied = handle.tcp_address in _ibverbs_denied
            return remote_chain(
                owner_has_nic=handle.ibverbs, here_has_nic=is_ibverbs_available(), denied=denied
            )
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
