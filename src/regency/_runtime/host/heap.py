"""A proc's malloc settings: large freed blocks stay in the heap, so the next one reuses them.

By default glibc maps every block of 32 MiB or more afresh and unmaps it when freed, and a
thread other than the main one gets such blocks mapped afresh from 64 MiB up. A fresh page costs
a page fault on first touch, which on a VM makes writing fresh memory several times slower than
copying into memory already used: a 128 MiB ``bytes`` argument that an actor's thread rebuilds
out of the received part (one copy) took ~6x longer into fresh pages than into reused ones.

So a proc, before it starts any thread, has glibc serve every block from one heap (one arena,
nothing mapped on its own) and keep up to ``heap_keep_bytes`` of freed memory at the
heap's top for reuse. The cost: a proc holds on to memory it freed (up to that much at the top,
and whatever lies free below a block still in use), as a proc's shared-memory arena does; a
proc's threads share one allocator lock (allocations under 1 KiB are served from per-thread
caches without it). ``heap_keep_bytes=0`` leaves glibc's defaults, and so does anything
else than glibc (where ``mallopt`` is missing or refuses).
"""

from __future__ import annotations

import ctypes
import sys

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8


def keep_freed_memory(keep_bytes: int) -> bool:
    """Apply the settings above (keeping up to ``keep_bytes``); whether glibc took them all.

    Call it before the process starts a thread: threads that already have an arena keep it.
    """
    if keep_bytes <= 0 or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    keep = min(keep_bytes, 2**31 - 1)  # mallopt takes an int
    settings = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, keep))
    return all(mallopt(param, value) == 1 for param, value in settings)
