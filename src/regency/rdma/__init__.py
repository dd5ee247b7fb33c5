"""One-sided memory transfers: Monarch's ``monarch.rdma``, with backends real on common machines.

Register memory once, send the handle anywhere, and let other processes read or write it
without its owner taking part::

    from regency.rdma import RDMABuffer

    buf = RDMABuffer(weights)            # in the owner: no copy, the owner keeps the memory
    ...                                  # send ``buf`` to other actors in messages
    buf.read_into(my_copy).get()         # in a peer: copy the owner's bytes into ``my_copy``
    buf.write_from(update).get()         # ... or overwrite them

* `RDMABuffer` registers memory and moves it; `RDMAAction` batches several transfers.
* `get_rdma_backend`, `is_rdma_available`, `is_ibverbs_available` report what this machine has.
* Backends: cross-memory attach (``cma``) and shared memory (``shm``) on one host; between
  hosts one-sided RDMA through pyverbs (``ibverbs``) when both processes have a usable RDMA NIC,
  else ``tcp``; CUDA IPC for GPU memory on one host. See ``docs/rdma.md``.
* Errors form the `RDMAError` family; see :mod:`regency.rdma._errors` for the tree.
"""

# A buffer registered in the controller's own code starts the controller's runtime on first
# use, as every public package's first call does: the extension face registers that boot
# when imported.
import regency._lowlevel  # noqa: F401
from regency import _public
from regency.rdma._action import RDMAAction
from regency.rdma._backends.choice import get_rdma_backend
from regency.rdma._backends.choice import is_ibverbs_available as _is_ibverbs_available
from regency.rdma._buffer import RDMABuffer
from regency.rdma._errors import (
    RDMABackendError,
    RDMABufferDroppedError,
    RDMAError,
    RDMAFallbackWarning,
    RDMAOwnerGoneError,
    RDMAReadTransferWarning,
    RDMATcpFallbackWarning,
    RDMATimeoutError,
    RDMAWriteTransferWarning,
)


def is_ibverbs_available() -> bool:
    """Whether this process can use the ``ibverbs`` backend.

    True when ``pyverbs`` (rdma-core's Python bindings) imports, an RDMA device opens and one of
    its ports is active; probed once per process. Transfers of host memory between two
    processes on different hosts that both have it then use one-sided RDMA READ / WRITE;
    ``REGENCY_RDMA_IBV_DEVICE=device[:port[:gid_index]]`` picks the port.
    """
    return _is_ibverbs_available()


def is_rdma_available() -> bool:
    """Whether one-sided transfers work in this process.

    Always ``True``: the TCP backend needs nothing but sockets. Kept for Monarch compatibility,
    where it is deprecated.
    """
    return True


__all__ = [
    "RDMAAction",
    "RDMABackendError",
    "RDMABuffer",
    "RDMABufferDroppedError",
    "RDMAError",
    "RDMAFallbackWarning",
    "RDMAOwnerGoneError",
    "RDMAReadTransferWarning",
    "RDMATcpFallbackWarning",
    "RDMATimeoutError",
    "RDMAWriteTransferWarning",
    "get_rdma_backend",
    "is_ibverbs_available",
    "is_rdma_available",
]

_public.publish(__name__, globals())
