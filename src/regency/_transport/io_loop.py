"""The per-process I/O thread: one epoll set for every socket and process descriptor."""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import select
import threading
from collections import deque
from collections.abc import Callable
from threading import get_ident
from time import monotonic

log = logging.getLogger("regency.io")

Handler = Callable[[int], None]

# A thread waiting for a reply polls without sleeping this long first: a quick reply then
# neither wakes it nor pays for waking it (costly on VMs). It does so only while its replies
# come that quickly (kernel/waiting.py); an idle sync actor likewise, only while its messages
# come that quickly (sync_executor.py). A polling thread yields its CPU between polls, so a
# runnable process on the same CPU (the peer it waits for, a sibling proc) goes first.
REPLY_SPIN_SECONDS = 100e-6
_RECHECK_MS = 100
# Beyond this many connections, taking them from the loop costs more syscalls than it saves.
_MAX_STOLEN = 16
_POLLNVAL = select.POLLNVAL


class Turn:
    """A thread's turn as the one that reads the loop's connections inline (see
    :meth:`IOLoop.claim`): the eventfd that wakes it, the descriptors it polls and its ``poll``
    objects for them. Each thread has one, kept between its waits: a thread waits on the same
    descriptors again and again."""

    __slots__ = ("fds", "poller", "wake_fd", "waking")

    def __init__(self, wake_fd: int) -> None:
        self.wake_fd = wake_fd
        # Polls wake_fd alone: the thread waits so once a later waiter took over.
        self.waking = select.poll()
        self.waking.register(wake_fd, select.POLLIN)
        self.fds: tuple[int, ...] | None = None
        self.poller = self.waking

    def watch(self, fds: tuple[int, ...]) -> None:
        """Poll ``fds`` (and the wake eventfd) from now on."""
        poller = select.poll()
        poller.register(self.wake_fd, select.POLLIN)
        for fd in fds:
            poller.register(fd, select.POLLIN)
        self.fds, self.poller = fds, poller


class _Turns(threading.local):
    """The calling thread's :class:`Turn`; none for a loop thread (``barred``)."""

    turn: Turn | None = None
    barred = False


_turns = _Turns()


class IOLoop:
    """Runs readiness callbacks and scheduled calls on one daemon thread.

    ``register`` and ``call_soon`` are safe from any thread; callbacks run on the loop thread.
    A callback that raises is logged and the loop carries on.
    """

    def __init__(self, name: str = "regency-io") -> None:
        self._epoll = select.epoll()
        self._handlers: dict[int, Handler] = {}
        self._stealable: dict[int, Handler] = {}
        # The keys of _stealable, for turns; empty while there are too many to claim.
        self._stealable_fds: tuple[int, ...] = ()
        # The stealable descriptors out of the epoll set while a thread reads them inline, and
        # that thread's turn (one reader at a time: see wait_reading).
        self._stolen: tuple[int, ...] = ()
        self._reader: Turn | None = None
        self._steal_lock = threading.Lock()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._epoll.register(self._wake_fd, select.EPOLLIN)
        self._calls: deque[Callable[[], None]] = deque()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._counter = itertools.count()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._ident = self._thread.ident

    def in_loop(self) -> bool:
        """Whether the calling thread is the loop thread."""
        return get_ident() == self._ident

    def register(
        self, fd: int, handler: Handler, events: int = select.EPOLLIN, stealable: bool = False
    ) -> None:
        """Call ``handler(events)`` on the loop thread whenever ``fd`` is ready.

        A ``stealable`` handler must be safe to call from any thread: a thread waiting in
        :meth:`wait_reading` may run it instead of the loop thread.
        """
        with self._steal_lock:
            self._forget_stolen(fd)
            self._handlers[fd] = handler
            if stealable:
                self._stealable[fd] = handler
                self._stealable_changed()
            self._epoll.register(fd, events)

    def unregister(self, fd: int) -> None:
        """Stop watching ``fd`` (it stays open)."""
        with self._steal_lock:
            if self._stealable.pop(fd, None) is not None:
                self._stealable_changed()
            stolen = self._forget_stolen(fd)
            if self._handlers.pop(fd, None) is not None and not stolen:
                with contextlib.suppress(OSError, ValueError):
                    self._epoll.unregister(fd)

    def _stealable_changed(self) -> None:
        fds = tuple(self._stealable)
        self._stealable_fds = fds if len(fds) <= _MAX_STOLEN else ()

    def _forget_stolen(self, fd: int) -> bool:
        """``fd`` is no longer the stolen descriptor of that number: the reader's give-back
        must leave it alone. Whether it was stolen."""
        if fd not in self._stolen:
            return False
        self._stolen = tuple(other for other in self._stolen if other != fd)
        return True

    def claim(self, wake_fd: int) -> Turn | None:
        """Make the calling thread the one that reads the connections inline from now on.

        The stealable descriptors leave the loop's epoll set; until the thread polls them in
        :meth:`wait_reading` (given the returned turn) or hands them back with
        :meth:`release`, frames that arrive wait in the kernel and wake nobody. A thread about
        to send the message whose answer it will then wait for claims first, so that the
        answer is read by this thread even when the send costs it its CPU (the woken receiver
        often runs on it at once) and the answer comes back before it runs again: otherwise
        the loop thread would be woken to read it. So the thread must not block between the
        claim and the wait. ``wake_fd`` (an eventfd) is written by whoever makes the
        thread's condition true from another thread. ``None`` when inline reading is not
        possible (on the loop thread, or too many connections).

        A thread's turn is the same object at each claim: one give-back (:meth:`release`, or
        the end of a wait) ends every claim it made.
        """
        turn = _turns.turn
        if turn is None or turn.wake_fd != wake_fd:
            if _turns.barred or get_ident() == self._ident:
                return None
            turn = _turns.turn = Turn(wake_fd)
        with self._steal_lock:
            fds = self._stealable_fds
            if not fds:
                return None
            previous, self._reader = self._reader, turn
            stolen = self._stolen
            if stolen is not fds:
                # Out of the epoll set: all of them but while an earlier reader holds some.
                for fd in fds:
                    if fd not in stolen:
                        try:  # noqa: SIM105 (per wait: suppress() costs three Python calls)
                            self._epoll.unregister(fd)
                        except (OSError, ValueError):
                            pass
                self._stolen = fds
        if turn.fds is not fds:
            turn.watch(fds)
        if previous is not None and previous is not turn:
            try:  # noqa: SIM105
                os.eventfd_write(previous.wake_fd, 1)
            except OSError:
                pass
        return turn

    def release(self, turn: Turn) -> None:
        """The thread that claimed ``turn`` will not wait after all: the loop reads again."""
        self._give_back(turn)

    def wait_reading(
        self,
        until: Callable[[], bool],
        wake_fd: int,
        timeout: float | None,
        spin_until: float = 0.0,
        turn: Turn | None = None,
        before: Callable[[], None] | None = None,
    ) -> bool | None:
        """Wait for ``until()`` on the calling thread while reading the connections directly.

        The calling thread takes the stealable descriptors out of the loop's epoll set (or
        uses ``turn``, taken earlier with :meth:`claim`), calls ``before()`` if given (once it
        has them: an answer to what ``before`` sends is read by this thread) and polls them
        itself, so a reply wakes it straight away instead of waking the loop thread which
        would then wake it. ``wake_fd`` (an eventfd) is written by whoever makes ``until()``
        true from another thread. Until ``spin_until`` (a ``time.monotonic()``) it polls
        without sleeping. Returns whether ``until()`` became true, or ``None`` when reading
        inline is not possible (the caller then waits the plain way; ``before`` is not called).

        One thread reads inline at a time: the one that began waiting last, the likeliest to
        get the next message (an actor back from handling one; a caller that just sent a
        request), while the threads that wait longer (an idle actor) sink below it. The
        reader it takes over from is woken once to go on waiting on its ``wake_fd`` alone;
        when the reader returns, the loop thread reads the descriptors again. Were every
        waiting thread to poll the same sockets, each frame would wake them all (an idle
        actor's thread as well as the one the frame is for), and whichever won the race read
        it and woke the right one: two wake-ups again.
        """
        if turn is None:
            turn = self.claim(wake_fd)
            if turn is None:
                return None
        try:
            if before is not None:
                before()
            poller = turn.poller
            stealable = self._stealable
            deadline = None if timeout is None else monotonic() + timeout
            wait_ms = _RECHECK_MS
            while not until():
                if self._reader is not turn:
                    # A later waiter took over; this one is woken through wake_fd.
                    poller = turn.waking
                # A bounded sleep: the condition is re-checked even if a wake-up is lost.
                if deadline is not None:
                    left = deadline - monotonic()
                    if left <= 0:
                        return False
                    wait_ms = min(_RECHECK_MS, int(left * 1000) + 1)
                if spin_until:
                    if monotonic() < spin_until:
                        wait_ms = 0
                        os.sched_yield()
                    else:
                        spin_until = 0.0
                        if deadline is None:
                            wait_ms = _RECHECK_MS
                for fd, mask in poller.poll(wait_ms):
                    if fd == wake_fd:
                        try:  # noqa: SIM105 (per wake-up: suppress() costs three Python calls)
                            os.eventfd_read(wake_fd)
                        except BlockingIOError:
                            pass
                        continue
                    handler = stealable.get(fd)
                    if handler is None or mask & _POLLNVAL:
                        turn.fds = None  # polled anew at the next claim
                        poller.unregister(fd)
                        continue
                    handler(mask)
            return True
        finally:
            self._give_back(turn)

    def _give_back(self, turn: Turn) -> None:
        """The reader ``turn`` is done: the loop thread reads the descriptors again."""
        with self._steal_lock:
            if self._reader is not turn:
                return
            self._reader = None
            stolen, self._stolen = self._stolen, ()
            for fd in stolen:
                try:  # noqa: SIM105 (per wait: suppress() costs three Python calls)
                    self._epoll.register(fd, select.EPOLLIN)
                except (OSError, ValueError):
                    pass

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop thread as soon as possible."""
        self._calls.append(fn)
        with contextlib.suppress(OSError):
            os.eventfd_write(self._wake_fd, 1)

    def call_later(self, delay: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop thread after ``delay`` seconds."""

        def add() -> None:
            heapq.heappush(self._timers, (monotonic() + delay, next(self._counter), fn))

        if self.in_loop():
            add()
        else:
            self.call_soon(add)

    def stop(self) -> None:
        """Stop the loop thread (pending calls are dropped)."""
        self._stopping = True
        self.call_soon(lambda: None)
        if not self.in_loop():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        _turns.barred = True  # this thread must never block reading inline
        handlers = self._handlers
        wake_fd = self._wake_fd
        while not self._stopping:
            timeout = -1.0
            if self._timers:
                timeout = max(0.0, self._timers[0][0] - monotonic())
            try:
                events = self._epoll.poll(timeout)
            except InterruptedError:
                continue
            for fd, mask in events:
                if fd == wake_fd:
                    with contextlib.suppress(BlockingIOError):
                        os.eventfd_read(wake_fd)
                    continue
                handler = handlers.get(fd)
                if handler is None:
                    continue
                try:
                    handler(mask)
                except Exception:
                    log.exception("I/O callback for fd %d failed", fd)
            while self._calls:
                fn = self._calls.popleft()
                try:
                    fn()
                except Exception:
                    log.exception("scheduled I/O call failed")
            now = monotonic()
            while self._timers and self._timers[0][0] <= now:
                _, _, fn = heapq.heappop(self._timers)
                try:
                    fn()
                except Exception:
                    log.exception("timer callback failed")
        with contextlib.suppress(OSError):
            self._epoll.close()
            os.close(wake_fd)
