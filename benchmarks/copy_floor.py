"""What the machine allows for moving a large buffer between two processes, without a runtime.

The ceilings behind issue 17's target 3 (``bytes``/``bytearray`` of 128 MiB at ≥ 0.5x memcpy),
each the median of ``--reps`` runs, in GB/s and as a ratio to one memcpy in the same run:

* ``memcpy``: one thread copying between two warm buffers (the target's yardstick);
* ``memcpy_two_threads``: the same copy split across two threads (``ctypes.memmove`` releases
  the GIL), i.e. how much more the memory gives when both cores copy at once;
* ``two_copies``: a copy into a warm buffer, then a copy out of it into another warm buffer:
  what a value that is not in shared memory costs at least (the sender's private heap into
  shared memory, then shared memory into the receiver's new object);
* ``socket_warm`` / ``socket_fresh``: the bytes sent over a Unix socket by a forked process and
  received into a warm buffer / into freshly mapped memory (the kernel copies twice);
* ``fresh_fill``: a copy into freshly mapped memory (the kernel zeroes each page first), the
  cost of building a new large object in a process that keeps no freed memory;
  ``fresh_fill_populated``: the same with the mapping advised huge and populated in one call
  first (what ``kernel/fill.py`` does), the least such an object costs.

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import socket
import statistics
import threading
import time
from collections.abc import Callable

MADV_POPULATE_WRITE = 23  # Linux 5.14; not named by Python 3.11's mmap module
HUGE_PAGE = 2 << 20


def median_seconds(run: Callable[[], mmap.mmap | None], reps: int) -> float:
    """Median wall time of ``run`` over ``reps`` runs, after one warm-up; a mapping it returns
    is unmapped after its time is taken (freeing is not part of filling)."""
    times = []
    for rep in range(reps + 1):
        start = time.perf_counter()
        made = run()
        if rep:
            times.append(time.perf_counter() - start)
        if made is not None:
            made.close()
    return statistics.median(times)


def private_mapping(size: int) -> mmap.mmap:
    """Fresh private anonymous memory, as malloc maps a large block (``mmap.mmap(-1, n)``
    alone is shared memory, whose pages fault in differently)."""
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def address(buffer: bytearray | mmap.mmap) -> int:
    """The address of a writable buffer's first byte."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))


def copies(size: int, reps: int) -> dict[str, float]:
    """Seconds for the in-process copies."""
    source, middle, target = (
        bytearray(os.urandom(1 << 20) * (size >> 20)),
        bytearray(size),
        bytearray(size),
    )
    src, mid, dst = address(source), address(middle), address(target)

    def one_copy() -> None:
        ctypes.memmove(dst, src, size)

    def two_threads() -> None:
        half = size // 2
        other = threading.Thread(target=ctypes.memmove, args=(dst + half, src + half, size - half))
        other.start()
        ctypes.memmove(dst, src, half)
        other.join()

    def two_copies() -> None:
        ctypes.memmove(mid, src, size)
        ctypes.memmove(dst, mid, size)

    def fresh_fill() -> mmap.mmap:
        fresh = private_mapping(size)
        ctypes.memmove(address(fresh), src, size)
        return fresh

    def fresh_fill_populated() -> mmap.mmap:
        fresh = private_mapping(size)
        start = -address(fresh) % HUGE_PAGE  # huge pages are advised where they can be aligned
        try:
            fresh.madvise(mmap.MADV_HUGEPAGE, start, (size - start) // HUGE_PAGE * HUGE_PAGE)
            fresh.madvise(MADV_POPULATE_WRITE)
        except OSError:
            pass  # an older kernel: the copy faults the pages in
        ctypes.memmove(address(fresh), src, size)
        return fresh

    return {
        "memcpy": median_seconds(one_copy, reps),
        "memcpy_two_threads": median_seconds(two_threads, reps),
        "two_copies": median_seconds(two_copies, reps),
        "fresh_fill": median_seconds(fresh_fill, reps),
        "fresh_fill_populated": median_seconds(fresh_fill_populated, reps),
    }


def over_socket(size: int, reps: int, fresh: bool) -> float:
    """Median seconds to receive ``size`` bytes a forked process sends over a Unix socket."""
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        ours.close()
        data = os.urandom(1 << 20) * (size >> 20)
        while theirs.recv(1):
            theirs.sendall(data)
        os._exit(0)
    theirs.close()
    warm = bytearray(size)

    def receive() -> mmap.mmap | None:
        target: bytearray | mmap.mmap = private_mapping(size) if fresh else warm
        view = memoryview(target)
        ours.send(b"g")
        got = 0
        while got < size:
            got += ours.recv_into(view[got:])
        view.release()
        return target if isinstance(target, mmap.mmap) else None

    try:
        return median_seconds(receive, reps)
    finally:
        ours.close()
        os.waitpid(pid, 0)


def main() -> None:
    """Parse the command line, measure, print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=128)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    size = args.mib << 20
    seconds = copies(size, args.reps)
    seconds["socket_warm"] = over_socket(size, args.reps, fresh=False)
    seconds["socket_fresh"] = over_socket(size, args.reps, fresh=True)
    rates = {name: size / s / 1e9 for name, s in seconds.items()}
    memcpy = rates["memcpy"]
    print(
        json.dumps(
            {
                "mib": args.mib,
                "gb_per_s": rates,
                "over_memcpy": {name: rate / memcpy for name, rate in rates.items()},
                "load": os.getloadavg()[0],
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
