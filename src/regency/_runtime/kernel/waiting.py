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


class Waker:
    """A thread's eventfd for being woken while it reads inline (made once per thread), and
    whether its replies come back within the reply spin."""

    __slots__ = ("fd", "owner", "quick")

    def __init__(self) -> None:
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.owner = threading.get_ident()
        self.quick = True

    def wake(self, _: object = None) -> None:
        """Wake the owning thread, unless called on it (also a pending's done callback)."""
        if threading.get_ident() != self.owner:
            with contextlib.suppress(OSError):
                os.eventfd_write(self.fd, 1)


_local = threading.local()


def thread_waker() -> Waker:
    """The calling thread's :class:`Waker`."""
    waker: Waker | None = getattr(_local, "waker", None)
    if waker is None:
        waker = _local.waker = Waker()
    return waker


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
    loop = runtime.loop
    if turn is None:
        turn = loop.claim(fd)
        if turn is None:
            return None
    # Claimed first, so an answer to what this flush sends is read by this thread.
    try:
        runtime.flush()
    except BaseException:
        loop.release(turn)  # or the connections stay out of the loop with no one reading them
        raise
    return loop.wait_reading(until, fd, timeout, spin, turn)


def wait_pending(pending: Pending, timeout: float | None) -> bool:
    """Block until ``pending`` is done or ``timeout`` passes; return whether it is done.

    Either way the process's next post starts afresh (``Transport.flush``): a thread that takes
    an answer is not streaming, even when the answer came before it asked (a quick
    ``call_one(...).get()`` loop would otherwise look like a burst and have its calls
    coalesced, waking the I/O thread to flush them).
    """
    if pending.done:
        runtime = state.existing()
        if runtime is not None:
            runtime.flush()
        return True
    me = thread_waker()
    pending.add_done_callback(me.wake)
    # Spin only while this thread's replies come back within the spin: one waiting for long
    # calls (a training step per call) would burn the spin every time, right after waking the
    # ranks, which on a busy machine may be queued on this very CPU.
    began = time.monotonic()
    result = wait_until(pending.is_done, me.fd, timeout, REPLY_SPIN_SECONDS if me.quick else 0.0)
    if result:
        me.quick = time.monotonic() - began <= REPLY_SPIN_SECONDS
    if result is None:
        runtime = state.existing()
        if runtime is not None:
            runtime.flush()
        return pending.wait(timeout)
    return result
