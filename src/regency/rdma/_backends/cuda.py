"""GPU memory: CUDA IPC between processes of one host, pinned host staging everywhere else.

On one host the owner exports its tensor with torch's CUDA IPC reductions (the same handles
``torch.multiprocessing`` sends); a peer opens it once, caches the mapping, and copies with
``Tensor.copy_``, device to device or device to host, with no help from the owner. Across hosts
the bytes travel over TCP through page-locked host memory, staged chunk by chunk on the owner's
side and whole on the peer's side.

Nothing here imports torch until a CUDA tensor is actually involved.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from regency._errors import RegencyError
from regency.rdma._memory import Region, view

_IPC_CACHE_SIZE = 64
_ipc_lock = threading.Lock()
_ipc_cache: OrderedDict[tuple[int, int], Any] = OrderedDict()
_staging = threading.local()


class CudaIpcUnavailableError(RegencyError, RuntimeError):
    """Two processes cannot share CUDA memory by IPC (no handle, or opening it failed)."""


def export_ipc(region: Region) -> Any:
    """``(rebuild_function, args)`` that let another process of this host map ``region``."""
    from torch.multiprocessing.reductions import reduce_tensor

    return reduce_tensor(region.keep)  # type: ignore[no-untyped-call]


def _open_ipc(key: tuple[int, int], ipc: Any) -> Any:
    with _ipc_lock:
        tensor = _ipc_cache.get(key)
        if tensor is not None:
            _ipc_cache.move_to_end(key)
            return tensor
    if ipc is None:
        raise CudaIpcUnavailableError("the buffer's handle carries no CUDA IPC export")
    rebuild, args = ipc
    try:
        tensor = rebuild(*args)
    except Exception as exc:  # driver refusal (another container, no peer access, ...)
        raise CudaIpcUnavailableError(f"opening the CUDA IPC handle failed: {exc}") from exc
    import torch

    flat = tensor.reshape(-1).view(torch.uint8)
    with _ipc_lock:
        _ipc_cache[key] = flat
        while len(_ipc_cache) > _IPC_CACHE_SIZE:
            _ipc_cache.popitem(last=False)
    return flat


def ipc_copy(key: tuple[int, int], ipc: Any, local: Region, nbytes: int, *, write: bool) -> None:
    """Copy ``nbytes`` between the owner's exported tensor and ``local``, synchronously."""
    import torch

    remote = _open_ipc(key, ipc)[:nbytes]
    mine = local.byte_tensor()[:nbytes]
    if write:
        remote.copy_(mine)
        torch.cuda.synchronize(remote.device)
    else:
        mine.copy_(remote)
        if mine.is_cuda:
            torch.cuda.synchronize(mine.device)


def _pinned(nbytes: int) -> Any:
    import torch

    buf = getattr(_staging, "buf", None)
    if buf is None or buf.numel() < nbytes:
        buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        _staging.buf = buf
    return buf[:nbytes]


def device_to_host(region: Region, offset: int, nbytes: int) -> memoryview:
    """``region[offset:offset + nbytes]`` copied into this thread's pinned staging memory."""
    stage = _pinned(nbytes)
    stage.copy_(region.byte_tensor()[offset : offset + nbytes])
    return view(stage.data_ptr(), nbytes, writable=False)


def staging_view(nbytes: int) -> memoryview:
    """A writable view of ``nbytes`` of this thread's pinned staging memory."""
    stage = _pinned(nbytes)
    return view(stage.data_ptr(), nbytes, writable=True)


def host_to_device(region: Region, offset: int, nbytes: int) -> None:
    """Copy this thread's staging memory into ``region[offset:offset + nbytes]``."""
    import torch

    target = region.byte_tensor()[offset : offset + nbytes]
    target.copy_(_pinned(nbytes))
    torch.cuda.synchronize(target.device)


def pinned_region(nbytes: int) -> Region:
    """A fresh page-locked host region (for staging a whole transfer on the peer's side)."""
    import torch

    buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    return Region(buf.data_ptr(), nbytes, True, "cpu", buf)


def copy_between(dst: Region, src: Region, nbytes: int) -> None:
    """Copy ``nbytes`` from ``src`` to ``dst`` where either may be on a GPU."""
    import torch

    out = dst.byte_tensor()[:nbytes]
    out.copy_(src.byte_tensor()[:nbytes])
    if out.is_cuda:
        torch.cuda.synchronize(out.device)
