"""New CPU tensors for a worker's large outputs, in memory the next output of the size reuses.

torch takes CPU memory with ``posix_memalign(64)``. glibc before 2.38 serves an aligned request
of ``n`` bytes from a free block only if the block has room for ``n`` plus the alignment plus a
minimum chunk, so the block a freed output leaves is too small for the next output of the same
size. A loop that makes one large output per step (``y = x.reduce(...)``) therefore took new
memory from the top of the heap for its first ~10 steps, each of its pages faulted in on first
touch (4096 faults per 16 MiB: the copy into it took ~2x as long), until freed neighbours
happened to merge into blocks large enough (issue 15's reduce benchmark). A plain ``malloc`` of
the size a freed block was made for gets that block back, and ``numpy.empty`` is one (its data
is 16-byte aligned, enough for every dtype; numpy also asks the kernel for huge pages from
4 MiB). The cost: such a tensor's storage cannot be resized (``resize_`` to a larger size raises).
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence

import torch

NUMPY_FROM = 1 << 20
"""Bytes from which a CPU output is made by numpy (below, the faults are few and torch's own
allocation is cheaper)."""


def empty(size: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialized contiguous tensor of ``size`` and ``dtype`` on ``device``."""
    nbytes = math.prod(size) * dtype.itemsize
    if device.type != "cpu" or nbytes < NUMPY_FROM:
        return torch.empty(size, dtype=dtype, device=device)
    import numpy as np

    raw = torch.from_numpy(np.empty(nbytes, dtype=np.uint8))
    return raw.view(dtype).view(size)


def empty_like(t: torch.Tensor) -> torch.Tensor:
    """An uninitialized contiguous tensor of ``t``'s shape, dtype and device."""
    return empty(t.shape, t.dtype, t.device)


def copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``t`` (``t.clone(memory_format=torch.contiguous_format)``)."""
    return copy_into(empty_like(t), t)


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``dst.copy_(src)``; return ``dst``.

    Between contiguous CPU tensors of one dtype and shape this is libc's ``memmove`` (through
    ctypes, the GIL released), faster on large blocks than torch's element loop: in a 16 MiB
    ``reduce`` over 4 procs on 2 cores the copying thread used 20-25% less CPU (4.1-5.5 ms per
    reduction against 5.1-7.5, two runs).
    """
    if dst.dtype == src.dtype and dst.shape == src.shape and _plain_cpu(dst) and _plain_cpu(src):
        ctypes.memmove(dst.data_ptr(), src.data_ptr(), src.numel() * src.element_size())
        return dst
    return dst.copy_(src)


def _plain_cpu(t: torch.Tensor) -> bool:
    """Whether ``t``'s bytes are its values, in order, in this process's memory (a dense
    contiguous CPU tensor without a lazy conjugate or negation)."""
    return (
        t.device.type == "cpu"
        and t.layout == torch.strided
        and t.is_contiguous()
        and not t.is_conj()
        and not t.is_neg()
    )
