"""Memory regions: where the bytes of a tensor, array or buffer object live, without copying.

:func:`region_of` turns a user object into a :class:`Region`: its base address, size in
bytes, writability and device, plus a strong reference that keeps the memory alive (and, for
buffer exporters such as ``bytearray``, un-resizable) for as long as the region is held.
:func:`view` turns an address range back into a ``memoryview`` for sockets and copies.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any, NamedTuple

_PYBUF_FULL_RO = 0x011C  # PyBUF_INDIRECT | PyBUF_FORMAT: accept any exporter, read-only or not
_PYBUF_READ = 0x100
_PYBUF_WRITE = 0x200

ACCEPTED = "a contiguous torch tensor, numpy array or C-contiguous memoryview/bytes-like object"


class _PyBuffer(ctypes.Structure):
    """CPython's ``Py_buffer`` (stable layout since Python 3.3)."""

    _fields_ = (
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    )


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = (ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int)
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = (ctypes.POINTER(_PyBuffer),)
_release_buffer.restype = None
_memory_view = ctypes.pythonapi.PyMemoryView_FromMemory
_memory_view.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int)
_memory_view.restype = ctypes.py_object


class Region(NamedTuple):
    """A contiguous range of memory in this process."""

    address: int
    """Base address (for CUDA memory, a device pointer)."""
    nbytes: int
    writable: bool
    device: str
    """``"cpu"`` or a CUDA device such as ``"cuda:0"``."""
    keep: Any
    """The object that owns the memory; holding it keeps the address valid."""

    @property
    def is_cuda(self) -> bool:
        """Whether the memory is on a CUDA device."""
        return self.device != "cpu"

    def byte_tensor(self) -> Any:
        """The region as a 1-D ``torch.uint8`` tensor sharing its memory (needs torch)."""
        import torch

        if self.is_cuda:
            return self.keep.reshape(-1).view(torch.uint8)
        # Writable view even over read-only memory: callers only read from a source region.
        return torch.frombuffer(view(self.address, self.nbytes, writable=True), dtype=torch.uint8)


def view(address: int, nbytes: int, *, writable: bool) -> memoryview:
    """A ``memoryview`` of format ``B`` over ``nbytes`` at ``address``.

    The caller keeps the memory alive while the view is used.
    """
    mv: memoryview = _memory_view(address, nbytes, _PYBUF_WRITE if writable else _PYBUF_READ)
    return mv


def _buffer_address(mv: memoryview) -> int:
    info = _PyBuffer()
    _get_buffer(mv, ctypes.byref(info), _PYBUF_FULL_RO)
    try:
        return int(info.buf or 0)
    finally:
        _release_buffer(ctypes.byref(info))


def _torch_region(data: Any, *, one_dim: bool) -> Region:
    if data.is_sparse or data.layout != sys.modules["torch"].strided:
        raise TypeError(f"RDMA needs a dense (strided) tensor, got layout {data.layout}")
    if one_dim and data.dim() != 1:
        raise ValueError(
            f"RDMABuffer needs a 1-D tensor, got shape {tuple(data.shape)}; "
            "register t.view(-1) instead"
        )
    if not data.is_contiguous():
        raise ValueError("RDMA needs a contiguous tensor; call .contiguous() first")
    nbytes = data.numel() * data.element_size()
    kind = data.device.type
    if kind == "cpu":
        return Region(data.data_ptr(), nbytes, True, "cpu", data)
    if kind == "cuda":
        return Region(data.data_ptr(), nbytes, True, str(data.device), data)
    raise TypeError(f"RDMA supports CPU and CUDA tensors, got one on {data.device}")


def _numpy_region(data: Any, *, one_dim: bool) -> Region:
    if data.dtype.hasobject:
        raise TypeError("RDMA cannot move numpy arrays of Python objects (dtype=object)")
    if one_dim and data.ndim != 1:
        raise ValueError(
            f"RDMABuffer needs a 1-D array, got shape {data.shape}; register a.reshape(-1) instead"
        )
    if not data.flags.c_contiguous:
        raise ValueError("RDMA needs a C-contiguous array; call numpy.ascontiguousarray first")
    address, readonly = data.__array_interface__["data"]
    return Region(int(address), int(data.nbytes), not readonly, "cpu", data)


def _buffer_region(data: Any) -> Region:
    try:
        mv = memoryview(data)
    except TypeError:
        raise TypeError(f"RDMA needs {ACCEPTED}, got {type(data).__name__}") from None
    if "O" in mv.format:
        raise TypeError("RDMA cannot move buffers of Python objects")
    if not mv.c_contiguous:
        raise ValueError("RDMA needs a C-contiguous memoryview")
    if mv.nbytes == 0:
        return Region(0, 0, not mv.readonly, "cpu", mv)
    # ``mv`` stays exported while the region is held, so a bytearray cannot be resized under it.
    return Region(_buffer_address(mv), mv.nbytes, not mv.readonly, "cpu", mv)


def region_of(data: Any, *, one_dim: bool = False) -> Region:
    """The memory under ``data``, without copying it.

    Raises ``TypeError`` for unsupported objects and ``ValueError`` for non-contiguous ones
    (and, with ``one_dim``, for tensors and arrays that are not 1-D).
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(data, torch.Tensor):
        return _torch_region(data, one_dim=one_dim)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(data, numpy.ndarray):
        return _numpy_region(data, one_dim=one_dim)
    if isinstance(data, (str, int, float)):
        raise TypeError(f"RDMA needs {ACCEPTED}, got {type(data).__name__}")
    return _buffer_region(data)
