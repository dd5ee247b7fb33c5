"""Large ``bytes``/``bytearray`` values rebuilt from a received part, into memory cheap to fill.

A value rebuilt on the receiver is one copy out of the received part into a new object. In a
proc that copy lands in pages its heap kept (``host/heap.py``). In the controller, the user's
process whose malloc settings regency leaves alone, glibc maps every block of 32 MiB or more
afresh, and writing it costs a page fault per 4 KiB page: a 128 MiB ``bytes(part)`` ran at
~1.5 GB/s here against 6-10 GB/s for the same copy into memory in use.

So a value of at least :data:`FILL_MIN` bytes is made uninitialized
(``PyBytes_FromStringAndSize(NULL, n)``, ``PyByteArray_FromStringAndSize(NULL, n)``), and if its
pages are fresh (``mincore``), the 2 MiB-aligned interior is advised as transparent huge pages
(``MADV_HUGEPAGE``: a fault per 2 MiB instead of per 4 KiB) and all of them are mapped in one
call (``MADV_POPULATE_WRITE``) before one copy fills them: ~4 GB/s at 128 MiB. Pages already in
use are left alone: populating them again walks their page tables, a quarter of the copy's
time. Where ctypes, ``mincore`` or ``madvise`` are missing or refused, the value is made as
before, with ``bytes(part)`` / ``bytearray(part)`` (advice refused: the copy faults the pages in).
"""

from __future__ import annotations

import ctypes
import mmap
import sys
from typing import Any

FILL_MIN = 4 << 20  # below: no 2 MiB interior to advise, and glibc reuses freed blocks

_PAGE = mmap.PAGESIZE
_HUGE = 2 << 20
_PyBUF_WRITE = 0x200
_MADV_HUGEPAGE = 14
_MADV_POPULATE_WRITE = 23  # Linux 5.14; Python 3.11's mmap module does not name it
_RESIDENT = bytes(i & 1 for i in range(256))  # mincore: only the lowest bit of a byte is defined


class _Calls:
    """The C functions used here, bound once (``AttributeError``/``OSError`` where missing)."""

    def __init__(self) -> None:
        # Calls that hold the GIL and raise the error they set; ``[name]`` makes our own function
        # objects, so the argtypes set here never change the user's ``ctypes.pythonapi.<name>``.
        api = ctypes.pythonapi
        self.new_bytes = api["PyBytes_FromStringAndSize"]
        self.new_bytearray = api["PyByteArray_FromStringAndSize"]
        for new in (self.new_bytes, self.new_bytearray):
            new.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
            new.restype = ctypes.py_object  # ctypes takes over the new reference
        self.view = api["PyMemoryView_FromMemory"]  # format B, no ctypes array type per size
        self.view.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int)
        self.view.restype = ctypes.py_object
        self.bytes_address = api["PyBytes_AsString"]
        self.bytearray_address = api["PyByteArray_AsString"]
        for address in (self.bytes_address, self.bytearray_address):
            address.argtypes = (ctypes.py_object,)
            address.restype = ctypes.c_void_p
        libc = ctypes.CDLL(None, use_errno=True)  # calls that release the GIL
        self.mincore = libc.mincore
        self.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
        self.madvise = libc.madvise
        self.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        for call in (self.mincore, self.madvise):
            call.restype = ctypes.c_int


def _bind() -> _Calls | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return _Calls()
    except (AttributeError, OSError):
        return None


_calls = _bind()


def bytes_from(buf: Any) -> bytes:
    """A new ``bytes`` with the contents of the buffer ``buf`` (a received part)."""
    view = memoryview(buf)
    calls = _calls
    if calls is None or view.nbytes < FILL_MIN:
        return bytes(view)
    made: bytes = calls.new_bytes(None, view.nbytes)
    _fill(calls, calls.bytes_address(made), view)
    return made


def bytearray_from(buf: Any) -> bytearray:
    """A new ``bytearray`` with the contents of the buffer ``buf`` (a received part)."""
    view = memoryview(buf)
    calls = _calls
    if calls is None or view.nbytes < FILL_MIN:
        return bytearray(view)
    made: bytearray = calls.new_bytearray(None, view.nbytes)
    _fill(calls, calls.bytearray_address(made), view)
    return made


def _fill(calls: _Calls, address: int, view: memoryview) -> None:
    """Copy ``view`` to ``address``, where a new object has room for it, fresh pages advised."""
    size = view.nbytes
    _advise_fresh(calls, address, size)
    target: memoryview = calls.view(address, size, _PyBUF_WRITE)
    target[:] = view.cast("B")


def _advise_fresh(calls: _Calls, address: int, size: int) -> None:
    """Map the fresh pages of ``[address, address + size)`` at once, on huge pages where they fit.

    A block is fresh from some page on (a new mapping: all of it; the top of a heap that grew:
    its end), so its last whole page tells (one ``mincore`` of a page: a full scan costs ~15 ns
    a page, 4% of a copy into warm memory) and the advice starts at the first page not in use.
    """
    start = -(-address // _PAGE) * _PAGE
    end = (address + size) // _PAGE * _PAGE
    last = ctypes.c_ubyte()
    if calls.mincore(end - _PAGE, _PAGE, ctypes.byref(last)) != 0 or last.value & 1:
        return  # in use up to its end (or unknown): a block the allocator reused
    resident = (ctypes.c_ubyte * ((end - start) // _PAGE))()
    if calls.mincore(start, end - start, resident) != 0:
        return
    first = bytes(resident).translate(_RESIDENT).find(0)
    fresh = start + first * _PAGE
    huge_start = -(-fresh // _HUGE) * _HUGE
    huge_end = end // _HUGE * _HUGE
    if huge_end > huge_start:
        calls.madvise(huge_start, huge_end - huge_start, _MADV_HUGEPAGE)
    calls.madvise(fresh, end - fresh, _MADV_POPULATE_WRITE)
