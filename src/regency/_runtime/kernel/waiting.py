"""Blocking waits that read the process's connections on the waiting thread itself.

On machines where waking a thread on another CPU is expensive (most VMs), a reply that wakes
the I/O thread, which then wakes the waiter, pays that cost twice. A thread that is going to
block anyway polls the sockets directly (see ``IOLoop.wait_reading``) and is woken once.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable

from regency._runtime.kernel import state
from regency._runtime.kernel.pending import Pending
from regency._transport.io_loop import REPLY_SPIN_SECONDS, Turn

_local = threading.local()


def thread_eventfd() -> int:
    """An eventfd owned by the calling thread, for being woken while reading inline."""
    fd: int | None = getattr(_local, "fd", None)
    if fd is None:
        fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        _local.fd = fd
    return fd


def waker(fd: int) -> Callable[[], None]:
    """A function that wakes the thread owning ``fd``, unless called on that thread."""
    owner = threading.get_ident()

    def wake() -> None:
        if threading.get_ident() != owner:
            with contextlib.suppress(OSError):
                os.eventfd_write(fd, 1)

    return wake


def claim_reading(fd: int) -> Turn | None:
    """Make the calling thread this process's inline reader before it sends what it will then
    wait for the answer to (see ``IOLoop.claim``); pass the turn to :func:`wait_until`, or give
    it back with :func:`release_reading`. ``None`` if inline reading is not possible."""
    runtime = state.existing()
    return runtime.loop.claim(fd) if runtime is not None else None


def release_reading(turn: Turn) -> None:
    """Give back a turn from :func:`claim_reading` that will not be waited with."""
    runtime = state.existing()
    if runtime is not None:
        runtime.loop.release(turn)


def wait_until(
    until: Callable[[], bool],
    fd: int,
    timeout: float | None,
    spin: float = 0.0,
    turn: Turn | None = None,
) -> bool | None:
    """Wait for ``until()`` while reading inline; ``None`` if inline reading is not possible."""
    runtime = state.existing()
    if runtime is None:
        return None
    if turn is None:
        turn = runtime.loop.claim(fd)
        if turn is None:
            return None
    # Claimed first, so an answer to what this flush sends is read by this thread.
    runtime.flush()
    return runtime.loop.wait_reading(until, fd, timeout, spin, turn)


def wait_pending(pending: Pending, timeout: float | None) -> bool:
    """Block until ``pending`` is done or ``timeout`` passes; return whether it is done."""
    if pending.done:
        return True
    fd = thread_eventfd()
    wake = waker(fd)
    pending.add_done_callback(lambda _: wake())
    # Spin only while this thread's replies come back within the spin: one waiting for long
    # calls (a training step per call) would burn the spin every time, right after waking the
    # ranks, which on a busy machine may be queued on this very CPU.
    quick = getattr(_local, "quick", True)
    began = time.monotonic()
    result = wait_until(lambda: pending.done, fd, timeout, REPLY_SPIN_SECONDS if quick else 0.0)
    if result:
        _local.quick = time.monotonic() - began <= REPLY_SPIN_SECONDS
    if result is None:
        runtime = state.existing()
        if runtime is not None:
            runtime.flush()
        return pending.wait(timeout)
    return result
