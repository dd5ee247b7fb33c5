"""``RDMABuffer``: registered memory that other processes read and write one-sidedly."""

from __future__ import annotations

import os
import time
from typing import Any

from regency._lowlevel import current_context, runtime
from regency.actor import Future
from regency.rdma import _engine
from regency.rdma._backends import choice as _choice
from regency.rdma._backends import cuda as _cuda
from regency.rdma._backends import stream as _stream
from regency.rdma._errors import RDMABackendError, RDMAOwnerGoneError
from regency.rdma._handle import BufferHandle
from regency.rdma._host import is_running, start_time, this_host
from regency.rdma._ibverbs import probe as _ibv_probe
from regency.rdma._memory import region_of
from regency.rdma._registry import registry
from regency.rdma._service import ensure_service

DEFAULT_TIMEOUT = 60


class RDMABuffer:
    """A registered range of memory that other processes read and write without its owner.

    ``RDMABuffer(data)`` registers a 1-D contiguous torch tensor (CPU or CUDA), numpy array or
    C-contiguous memoryview / bytes-like object **without copying it**; the registering process
    (its *owner*) keeps the memory referenced until :meth:`drop`. The buffer pickles as a small
    handle, so it can be sent in actor messages; any process of the job that holds the handle can
    then :meth:`read_into` local memory or :meth:`write_from` local memory, and the owner's
    actor takes no part (on one host the kernel copies between the two address spaces)::

        class ParameterServer(Actor):
            def __init__(self) -> None:
                self.weights = torch.zeros(1 << 20)
                self.handle = RDMABuffer(self.weights)

            @endpoint
            def weights_handle(self) -> RDMABuffer:
                return self.handle

        buf = server.weights_handle.call_one().get()
        local = torch.empty(1 << 20)
        buf.read_into(local).get()

    ``backend`` forces a backend (``"cma"``, ``"shm"``, ``"tcp"`` or ``"ibverbs"``) for every
    transfer of this buffer, wherever its handle goes; otherwise ``REGENCY_RDMA_BACKEND`` in the
    transferring process, then automatic choice (between hosts that means ibverbs when both
    processes have a usable RDMA NIC, else TCP). Registering empty memory raises ``ValueError``;
    unsupported or non-contiguous memory raises ``TypeError`` / ``ValueError``; a forced
    ``"ibverbs"`` without a usable NIC here (or for GPU memory) raises ``RDMABackendError``.
    """

    __slots__ = ("_handle",)
    _handle: BufferHandle

    def __init__(self, data: Any, *, backend: str | None = None) -> None:
        if backend is not None:
            backend = _choice.check_backend_name(backend)
        region = region_of(data, one_dim=True)
        if region.nbytes == 0:
            raise ValueError("RDMABuffer needs at least one byte; got an empty buffer")
        nic = not region.is_cuda and _choice.is_ibverbs_available()
        if backend == "ibverbs" and not nic:
            found = _ibv_probe.availability()
            refusal = _choice.ibverbs_refusal(
                device=region.device,
                here=None if found.usable else found.detail,
                owner_has_nic=True,
            )
            raise RDMABackendError(f"{refusal}; use 'cma', 'shm' or 'tcp' (or leave backend unset)")
        rt = runtime()
        owner = str(current_context().actor_instance)
        entry = registry().register(region, owner)
        try:
            service = ensure_service(
                rt.secret,
                _choice.service_hosts(),
                f"regency-rdma-{rt.job_id}-{os.getpid()}-{os.urandom(6).hex()}",
            )
            started = start_time(os.getpid())
            assert started is not None
            self._handle = BufferHandle(
                buffer_id=entry.buffer_id,
                token=entry.token,
                nbytes=region.nbytes,
                writable=region.writable,
                device=region.device,
                owner=owner,
                proc_address=rt.address,
                pid=os.getpid(),
                start_time=started,
                host=this_host(),
                address=region.address,
                token_slot=entry.slot,
                tcp_address=service.tcp_address,
                unix_address=service.unix_address,
                backend=backend,
                ibverbs=nic,
            )
        except BaseException:
            registry().drop(entry.buffer_id, entry.token)
            raise

    @classmethod
    def _from_handle(cls, handle: BufferHandle) -> RDMABuffer:
        buf: RDMABuffer = object.__new__(cls)
        buf._handle = handle
        return buf

    def __reduce__(self) -> tuple[Any, tuple[BufferHandle]]:
        handle = self._handle
        if handle.device != "cpu" and handle.cuda_ipc is None:
            handle = handle._replace(cuda_ipc=self._export_cuda())
        # Rebuilt through the class as ``regency.rdma`` names it: unpickling then imports the
        # package (whose lock serializes threads) rather than this submodule, which a thread
        # could otherwise start loading while another thread is importing the package.
        return RDMABuffer._from_handle, (handle,)

    def _export_cuda(self) -> Any:
        h = self._handle
        if not _choice.is_this_process(h):
            return None
        entry = registry().lookup(h.buffer_id, h.token)
        if entry is None:
            return None
        if entry.cuda_ipc is None:
            try:
                entry.cuda_ipc = _cuda.export_ipc(entry.region)
            except Exception:  # no CUDA IPC here: peers fall back to staged TCP
                return None
        return entry.cuda_ipc

    # -- description ---------------------------------------------------------------------------

    def size(self) -> int:
        """The registered size in bytes."""
        return self._handle.nbytes

    @property
    def owner(self) -> str:
        """The name of the actor that registered the buffer (``<root>`` for the controller)."""
        return self._handle.owner

    @property
    def backend(self) -> str:
        """The backend that transfers of this buffer from this process use.

        One of ``"cma"``, ``"shm"``, ``"tcp"``, ``"ibverbs"`` or ``"cuda_ipc"``. In the owner's
        process, where transfers are plain copies, it names what peers on the owner's host use.
        """
        h = self._handle
        return _choice.plan(h, from_owner_peer=_choice.is_this_process(h))[0]

    @property
    def writable(self) -> bool:
        """Whether the registered memory may be written (``False`` for ``bytes`` and the like)."""
        return self._handle.writable

    # -- transfers -----------------------------------------------------------------------------

    def read_into(self, dst: Any, *, timeout: float = DEFAULT_TIMEOUT) -> Future[None]:
        """Copy the whole buffer into the start of ``dst`` (local memory at least as large).

        One-sided: the owner's actor is not involved. Raises ``ValueError`` at once if ``dst``
        is too small or read-only; the ``Future`` fails with an ``RDMAError`` if the buffer was
        dropped, its owner is gone, or ``timeout`` seconds pass.
        """
        seconds = _engine.check_timeout(timeout)
        return _engine.submit_all([_engine.prepare(self._handle, dst, write=False)], seconds)

    def write_from(self, src: Any, *, timeout: float = DEFAULT_TIMEOUT) -> Future[None]:
        """Copy all of ``src`` (local memory no larger than the buffer) to the buffer's start.

        Raises ``ValueError`` at once if ``src`` is too large or the buffer was registered
        read-only; the ``Future`` fails as for :meth:`read_into`.
        """
        seconds = _engine.check_timeout(timeout)
        return _engine.submit_all([_engine.prepare(self._handle, src, write=True)], seconds)

    def drop(self) -> Future[None]:
        """Release the registration: later transfers fail, and the owner lets go of the memory.

        Idempotent. From another process it asks the owner's transfer service; a buffer whose
        owner is gone counts as dropped.
        """
        h = self._handle
        if _choice.is_this_process(h):
            registry().drop(h.buffer_id, h.token)
            return Future._resolved(None)
        return _engine.submit_call(lambda: _drop_remote(h))

    # -- identity ------------------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RDMABuffer):
            return NotImplemented
        return (self._handle.buffer_id, self._handle.token) == (
            other._handle.buffer_id,
            other._handle.token,
        )

    def __hash__(self) -> int:
        return hash((self._handle.buffer_id, self._handle.token))

    def __repr__(self) -> str:
        h = self._handle
        where = "" if h.device == "cpu" else f", device={h.device}"
        return f"RDMABuffer({h.nbytes} bytes, owner={h.owner}{where})"


def _drop_remote(h: BufferHandle) -> None:
    here = this_host()
    if here.shares_memory_with(h.host) and not is_running(h.pid, h.start_time):
        return
    target = h.unix_address if here.shares_unix_sockets_with(h.host) else _choice.service_address(h)
    try:
        _stream.drop(target, runtime().secret, h, time.monotonic() + DEFAULT_TIMEOUT)
    except (ConnectionError, TimeoutError) as exc:
        if here.shares_memory_with(h.host) and _exits_soon(h):
            return
        raise RDMAOwnerGoneError(f"cannot drop {h.describe()}: {exc}") from exc


def _exits_soon(h: BufferHandle, within: float = 1.0) -> bool:
    """Whether the owner is gone, or goes within ``within`` seconds."""
    # A killed process closes its sockets before the kernel shows it as a zombie.
    deadline = time.monotonic() + within
    while is_running(h.pid, h.start_time):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True
