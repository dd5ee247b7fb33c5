"""Large message parts between processes of one host, through shared memory.

Copying 128 MiB through a unix socket costs two copies plus page faults on freshly allocated
memory in the receiver (very slow on VMs). Instead, the sender copies each large part into its
*arena* — one memfd per process, whose pages stay mapped and warm — and sends a small
descriptor. The receiver hands out the region (no copy, no fresh pages) and the value it
unpickles (a numpy array, say) reads straight from it. When the receiver's last reference to the
region goes away, it tells the sender, which then reuses the region.

The receiver opens the sender's memfd through ``/proc/PID/fd/N`` (same host, same user: the
transport only uses this for unix-socket peers of this job) and maps all of it once, for as long
as the sender lives: a region is a slice of that mapping, so the page tables of regions used
before stay filled. Mapping each region afresh cost a page fault per 4 KiB page touched, as
much time as copying the region once (a ``bytes`` rebuilt from a 128 MiB part took twice as
long).
"""

from __future__ import annotations

import bisect
import ctypes
import logging
import mmap
import os
import pickle
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger("regency.bulk")

BULK_MIN = 1 << 20  # parts at least this large go through the arena
_PARALLEL_COPY_MIN = 16 << 20
_PAGE = mmap.ALLOCATIONGRANULARITY

Part = bytes | bytearray | memoryview
Descriptor = tuple[int, int, int, int, int]  # (part index, pid, fd, offset, length)


def _nbytes(part: Part) -> int:
    return part.nbytes if isinstance(part, memoryview) else len(part)


def _spare_core() -> bool:
    """Whether a second copying thread would find a core of its own: the 1-minute load average
    is below the CPUs this process may run on, less one. On a busy machine the helper waits for
    a core, and two threads copy slower than one: a 128 MiB ``bytes`` argument went at 3.3-3.4
    GB/s on two threads against 4.2 on one, numpy arrays 5.3-6.0 against 7.8-8.1 (2 cores,
    load 6.5, issue 17)."""
    return os.getloadavg()[0] < len(os.sched_getaffinity(0)) - 1


class Arena:
    """This process's shared region for outgoing large parts, with a first-fit allocator."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity - capacity % _PAGE
        self.fd = os.memfd_create("regency-arena", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, self.capacity)
        self._map = mmap.mmap(self.fd, self.capacity)
        self._view = memoryview(self._map)
        self._lock = threading.Lock()
        self._free: list[tuple[int, int]] = [(0, self.capacity)]  # (offset, size), sorted
        self._used: dict[int, tuple[int, str]] = {}  # offset -> (size, peer)

    def alloc(self, size: int, peer: str) -> int | None:
        """Reserve ``size`` bytes for ``peer``; None when the arena is full."""
        size = -(-size // _PAGE) * _PAGE
        with self._lock:
            for i, (offset, free) in enumerate(self._free):
                if free >= size:
                    if free == size:
                        del self._free[i]
                    else:
                        self._free[i] = (offset + size, free - size)
                    self._used[offset] = (size, peer)
                    return offset
        return None

    def write(self, offset: int, part: Part) -> None:
        """Copy ``part`` into the arena at ``offset`` (large parts on two threads at once, when
        the machine has a core to spare)."""
        view = memoryview(part).cast("B")
        size = view.nbytes
        numpy = sys.modules.get("numpy")
        if numpy is None or size < _PARALLEL_COPY_MIN or not _spare_core():
            self._view[offset : offset + size] = view
            return
        # numpy releases the GIL while copying: two halves on two cores nearly double the rate.
        src = numpy.frombuffer(view, dtype=numpy.uint8)
        dst = numpy.frombuffer(self._view[offset : offset + size], dtype=numpy.uint8)
        half = size // 2
        helper = threading.Thread(target=numpy.copyto, args=(dst[half:], src[half:]))
        helper.start()
        numpy.copyto(dst[:half], src[:half])
        helper.join()

    def free(self, offset: int) -> None:
        """Give a region back (the receiver released it)."""
        with self._lock:
            entry = self._used.pop(offset, None)
            if entry is None:
                return
            self._insert_free(offset, entry[0])

    def free_peer(self, peer: str) -> None:
        """Give back every region a lost peer held."""
        with self._lock:
            mine = [o for o, (_, p) in self._used.items() if p == peer]
            for offset in mine:
                size, _ = self._used.pop(offset)
                self._insert_free(offset, size)

    def _insert_free(self, offset: int, size: int) -> None:
        i = bisect.bisect(self._free, (offset, size))
        self._free.insert(i, (offset, size))
        # Merge with the neighbours.
        if i + 1 < len(self._free) and offset + size == self._free[i + 1][0]:
            size += self._free[i + 1][1]
            self._free[i] = (offset, size)
            del self._free[i + 1]
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == offset:
            prev_offset, prev_size = self._free[i - 1]
            self._free[i - 1] = (prev_offset, prev_size + size)
            del self._free[i]


class Bulk:
    """Turns large parts into arena descriptors (sending) and back into mappings (receiving)."""

    def __init__(self, capacity: int, release: Callable[[str, int], None]) -> None:
        self._capacity = capacity
        self._arena: Arena | None = None
        self._arena_lock = threading.Lock()
        self._release = release
        # (sender, pid, fd) -> the sender's whole arena, mapped here
        self._maps: dict[tuple[str, int, int], mmap.mmap] = {}
        self._maps_lock = threading.Lock()

    def _get_arena(self) -> Arena | None:
        if self._arena is None:
            with self._arena_lock:
                if self._arena is None:
                    try:
                        self._arena = Arena(self._capacity)
                    except OSError as exc:
                        log.warning("no shared-memory arena (%s); large parts use the socket", exc)
                        self._capacity = 0
        return self._arena

    def export(self, peer: str, parts: Sequence[Part]) -> tuple[list[Part], bytes] | None:
        """Move large parts into the arena; return (new parts, descriptor part) or None."""
        if self._capacity <= 0 or not any(_nbytes(p) >= BULK_MIN for p in parts):
            return None
        arena = self._get_arena()
        if arena is None:
            return None
        out = list(parts)
        descriptors: list[Descriptor] = []
        for index, part in enumerate(parts):
            size = _nbytes(part)
            if size < BULK_MIN:
                continue
            offset = arena.alloc(size, peer)
            if offset is None:
                continue  # full: this part goes through the socket
            arena.write(offset, part)
            descriptors.append((index, os.getpid(), arena.fd, offset, size))
            out[index] = b""
        if not descriptors:
            return None
        return out, pickle.dumps(descriptors, protocol=5)

    def released(self, offset: int) -> None:
        """The receiver no longer uses the region at ``offset``."""
        if self._arena is not None:
            self._arena.free(offset)

    def peer_lost(self, peer: str) -> None:
        """Free the regions a lost peer held and forget the lost sender's arena.

        Its regions still held here stay valid: each keeps the mapping (and so the memory).
        """
        if self._arena is not None:
            self._arena.free_peer(peer)
        with self._maps_lock:
            for key in [k for k in self._maps if k[0] == peer]:
                del self._maps[key]

    def import_(self, peer: str, parts: list[Any], descriptor: Part) -> list[Any]:
        """Replace descriptor placeholders in ``parts`` by the sender's regions (no copy).

        A region is a ``ctypes`` array over the sender's mapped arena, because a memoryview
        cannot be watched for its end: when the last view of it goes, the sender is told.
        """
        for index, pid, fd, offset, size in pickle.loads(descriptor):
            region = (ctypes.c_char * size).from_buffer(self._mapping(peer, pid, fd), offset)
            weakref.finalize(region, self._release, peer, offset)
            parts[index] = memoryview(region).cast("B")
        return parts

    def _mapping(self, peer: str, pid: int, fd: int) -> mmap.mmap:
        key = (peer, pid, fd)
        with self._maps_lock:
            whole = self._maps.get(key)
            if whole is None:
                file = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
                try:
                    whole = mmap.mmap(file, 0)  # all of it
                finally:
                    os.close(file)
                self._maps[key] = whole
            return whole
