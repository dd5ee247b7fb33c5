"""The picklable description of a registered buffer: everything a peer needs to reach it."""

from __future__ import annotations

from typing import Any, NamedTuple

from regency.rdma._host import HostIdentity


class BufferHandle(NamedTuple):
    """Where a registered buffer lives and how to reach it; travels inside pickled buffers."""

    buffer_id: int
    token: int
    """Random per registration; a transfer with a stale token is refused."""
    nbytes: int
    writable: bool
    device: str
    owner: str
    """The owning actor's name (``<root>`` for the controller's own code)."""
    proc_address: str
    """The regency address of the owner's process."""
    pid: int
    start_time: int
    host: HostIdentity
    address: int
    """Base address of the memory in the owner's address space."""
    token_slot: int
    """Address, in the owner, of the 8-byte word that holds ``token`` while the buffer is live."""
    tcp_address: str
    unix_address: str
    backend: str | None
    """The backend the owner asked for at registration, if any."""
    cuda_ipc: Any = None
    """For CUDA memory: ``(rebuild_function, args)`` from torch's CUDA IPC reductions."""
    ibverbs: bool = False
    """The owner's process had a usable RDMA NIC (pyverbs) when it registered host memory."""

    def describe(self) -> str:
        """A short name for error messages."""
        return f"RDMA buffer {self.buffer_id:#x} ({self.nbytes} bytes) owned by {self.owner}"
