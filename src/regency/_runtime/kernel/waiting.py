"""Blocking waits that read the process's connections on the waiting thread itself.

On machines where waking a thread on another CPU is expensive (most VMs), a reply that wakes
the I/O thread, which then wakes the waiter, pays that cost twice. A thread that is going to
block anyway polls the sockets directly (see ``IOLoop.wait_reading``) and is woken once.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from time import monotonic
from typing import TYPE_CHECKING

from regency._runtime.kernel import state
from regency._runtime.kernel.pending import Pending
from regency._transport.io_loop import REPLY_SPIN_SECONDS, Turn

if TYPE_CHECKING:
    from regency._runtime.kernel.proc_runtime import ProcRuntime


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


class _Local(threading.local):
    """Each thread's :class:`Waker`, made on the thread's first look."""

    def __init__(self) -> None:
        self.waker = Waker()


_local = _Local()


def thread_waker() -> Waker:
    """The calling thread's :class:`Waker`."""
    return _local.waker


def poll_then_wait(
    runtime: ProcRuntime,
    until: Callable[[], bool],
    fd: int,
    timeout: float | None,
    spin: float,
    quick: bool,
    turn: Turn | None = None,
) -> tuple[bool | None, bool]:
    """Wait for ``until()`` reading inline (``IOLoop.wait_reading``, the process's waiting frames
    flushed first), polling without sleeping for ``spin`` seconds first if ``quick``.

    Returns the wait's result and whether it ended within the spin: the next wait's ``quick``.
    So a thread polls only while what it waits for comes that fast (a reply, an actor's next
    message); one waiting for long calls (a training step per call) would burn the spin every
    time, right after waking the ranks, which on a busy machine may be queued on this very CPU.
    """
    began = monotonic()
    result = runtime.loop.wait_reading(
        until, fd, timeout, began + spin if quick else 0.0, turn, runtime.flush
    )
    if result:
        quick = monotonic() - began <= spin
    return result, quick


def wait_pending(pending: Pending, timeout: float | None) -> bool:
    """Block until ``pending`` is done or ``timeout`` passes; return whether it is done.

    Either way the process's next post starts afresh (``Transport.flush``): a thread that takes
    an answer is not streaming, even when the answer came before it asked (a quick
    ``call_one(...).get()`` loop would otherwise look like a burst and have its calls
    coalesced, waking the I/O thread to flush them).
    """
    runtime = state.existing()
    if pending.done:
        if runtime is not None:
            runtime.flush()
        return True
    if runtime is not None:
        me = _local.waker
        pending.add_done_callback(me.wake)
        result, me.quick = poll_then_wait(
            runtime, pending.is_done, me.fd, timeout, REPLY_SPIN_SECONDS, me.quick
        )
        if result is not None:
            if not result:
                pending.remove_done_callback(me.wake)  # timed out: see remove_done_callback
            return result
        pending.remove_done_callback(me.wake)  # not reading inline: the plain wait wakes it
        runtime.flush()
    return pending.wait(timeout)
