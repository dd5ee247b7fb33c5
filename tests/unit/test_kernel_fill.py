"""Large ``bytes``/``bytearray`` values rebuilt from a received part (``kernel/fill.py``).

Each comes back byte-identical, of its type, a new object, at odd sizes around the threshold
and far above it; with the trick refused (no ctypes functions, or ``mincore``/``madvise``
failing) the same values come back by the plain copy; and a fresh block is filled without a
page fault per page.
"""

from __future__ import annotations

import ctypes
import mmap
import resource
import sys
from collections.abc import Callable
from typing import Any

import pytest

from regency._runtime.kernel import codec, fill

pytestmark = pytest.mark.timeout(120)

MiB = 1 << 20
SIZES = [fill.FILL_MIN - 1, fill.FILL_MIN, fill.FILL_MIN + 1, 64 * MiB + 3]
SIZE_IDS = ["min-1", "min", "min+1", "64MiB+3"]
REBUILD: dict[type, Callable[[Any], Any]] = {bytes: fill.bytes_from, bytearray: fill.bytearray_from}


def pattern(size: int) -> bytes:
    """``size`` bytes that differ from one MiB to the next, ending with a marker."""
    block = bytes(range(251))
    return (block * (size // len(block) + 1))[: size - 1] + b"!"


class _Refused(fill._Calls):
    """The calls of a kernel or sandbox that refuses ``mincore`` and ``madvise``."""

    def __init__(self) -> None:
        super().__init__()
        self.mincore = self.madvise = lambda *args: -1


@pytest.fixture(params=["trick", "no-ctypes", "advice-refused"])
def calls(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test of it runs with the trick, without ctypes, and with the advice refused."""
    if request.param == "no-ctypes":
        monkeypatch.setattr(fill, "_calls", None)
    elif request.param == "advice-refused":
        monkeypatch.setattr(fill, "_calls", _Refused())


@pytest.mark.usefixtures("calls")
@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
@pytest.mark.parametrize("kind", [bytes, bytearray])
def test_a_rebuilt_value_is_byte_identical_of_its_type_and_new(kind: type, size: int) -> None:
    data = pattern(size)
    part = memoryview(bytearray(data)).toreadonly()  # what pickle hands over for a bytes part
    value = REBUILD[kind](part)
    assert type(value) is kind
    assert len(value) == size
    assert value == data
    assert sys.getrefcount(value) == 2, "one reference here (and getrefcount's own)"
    if kind is bytearray:
        value[-1] = 0  # the receiver's own, writable copy
        assert part[-1] == ord("!")


@pytest.mark.usefixtures("calls")
@pytest.mark.parametrize("kind", [bytes, bytearray])
def test_large_values_through_the_codec_stay_correct(kind: type) -> None:
    data = kind(pattern(64 * MiB + 3))
    parts = codec.dumps_call((data,), {"again": data})
    assert len(parts) == 2, "one out-of-band part for the object passed twice"
    (args, kwargs) = codec.loads([memoryview(bytes(p)) for p in parts])  # type: ignore[misc]
    assert type(args[0]) is kind
    assert args[0] == data
    assert kwargs["again"] is args[0]


def test_repeated_rebuilds_give_their_memory_back() -> None:
    part = memoryview(pattern(32 * MiB))
    for rebuild in REBUILD.values():
        rebuild(part)  # a first one: whatever the allocator keeps, it keeps now
    before = _resident_bytes()
    for _ in range(20):
        for rebuild in REBUILD.values():
            assert len(rebuild(part)) == 32 * MiB
    assert _resident_bytes() - before < 16 * MiB


def test_a_large_value_decoded_into_fresh_memory_costs_no_fault_per_page() -> None:
    if not _kernel_populates():
        pytest.skip("this kernel has no MADV_POPULATE_WRITE")
    size = 64 * MiB  # above glibc's largest mmap threshold: a new mapping each time
    pages = size // mmap.PAGESIZE
    part = memoryview(pattern(size))
    plain_faults, plain = _minor_faults(lambda: bytes(part))
    del plain
    if plain_faults < pages // 2:
        pytest.skip(f"the allocator reused memory here ({plain_faults} faults for {pages} pages)")
    body, sent = codec.dumps(pattern(size))
    faults, value = _minor_faults(lambda: codec.loads([body, part]))
    assert type(value) is bytes
    assert value == sent
    assert faults < pages // 8, f"{faults} faults for {pages} fresh pages"


def _minor_faults(make: Callable[[], Any]) -> tuple[int, Any]:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    value = make()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, value


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * mmap.PAGESIZE


def _kernel_populates() -> bool:
    region = mmap.mmap(-1, mmap.PAGESIZE)
    anchor = ctypes.c_char.from_buffer(region)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        return bool(libc.madvise(ctypes.addressof(anchor), mmap.PAGESIZE, 23) == 0)
    finally:
        del anchor
        region.close()
