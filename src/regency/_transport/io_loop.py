"""The per-process I/O thread: one epoll set for every socket and process descriptor."""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable

log = logging.getLogger("regency.io")

Handler = Callable[[int], None]

# A thread waiting for a reply polls without sleeping this long first: a quick reply then
# neither wakes it nor pays for waking it (costly on VMs). It does so only while its replies
# come that quickly (kernel/waiting.py). Idle readers do not spin: with many procs per core,
# spinning steals the CPU the others need.
REPLY_SPIN_SECONDS = 50e-6
_RECHECK_MS = 100
# Beyond this many connections, taking them from the loop costs more syscalls than it saves.
_MAX_STOLEN = 16


class Turn:
    """A thread's turn as the one that reads the loop's connections inline (see
    :meth:`IOLoop.claim`): the descriptors it polls and the eventfd that wakes it."""

    __slots__ = ("fds", "wake_fd")

    def __init__(self, wake_fd: int, fds: tuple[int, ...] = ()) -> None:
        self.wake_fd = wake_fd
        self.fds = fds


class _Poller(threading.local):
    """Each thread's ``poll`` object for reading inline, kept between its waits: a thread
    waits on the same descriptors again and again (its wake eventfd and the connections)."""

    def __init__(self) -> None:
        self.key: tuple[int, tuple[int, ...]] | None = None
        self.poller = select.poll()

    def get(self, wake_fd: int, fds: tuple[int, ...]) -> select.poll:
        """A poller of ``wake_fd`` and ``fds`` (made anew when they changed)."""
        key = (wake_fd, fds)
        if key != self.key:
            poller = select.poll()
            poller.register(wake_fd, select.POLLIN)
            for fd in fds:
                poller.register(fd, select.POLLIN)
            self.key, self.poller = key, poller
        return self.poller

    def drop(self) -> None:
        """Forget the kept poller (it is about to lose a descriptor)."""
        self.key = None


_poller = _Poller()


class IOLoop:
    """Runs readiness callbacks and scheduled calls on one daemon thread.

    ``register`` and ``call_soon`` are safe from any thread; callbacks run on the loop thread.
    A callback that raises is logged and the loop carries on.
    """

    def __init__(self, name: str = "regency-io") -> None:
        self._epoll = select.epoll()
        self._handlers: dict[int, Handler] = {}
        self._stealable: dict[int, Handler] = {}
        self._stealable_fds: tuple[int, ...] = ()  # the keys of _stealable, for turns
        # The stealable descriptors out of the epoll set while a thread reads them inline, and
        # that thread's turn and wake eventfd (one reader at a time: see wait_reading).
        self._stolen: dict[int, Handler] = {}
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
        return threading.get_ident() == self._ident

    def register(
        self, fd: int, handler: Handler, events: int = select.EPOLLIN, stealable: bool = False
    ) -> None:
        """Call ``handler(events)`` on the loop thread whenever ``fd`` is ready.

        A ``stealable`` handler must be safe to call from any thread: a thread waiting in
        :meth:`wait_reading` may run it instead of the loop thread.
        """
        with self._steal_lock:
            self._stolen.pop(fd, None)
            self._handlers[fd] = handler
            if stealable:
                self._stealable[fd] = handler
                self._stealable_fds = tuple(self._stealable)
            self._epoll.register(fd, events)

    def unregister(self, fd: int) -> None:
        """Stop watching ``fd`` (it stays open)."""
        with self._steal_lock:
            if self._stealable.pop(fd, None) is not None:
                self._stealable_fds = tuple(self._stealable)
            stolen = self._stolen.pop(fd, None)
            if self._handlers.pop(fd, None) is not None and stolen is None:
                with contextlib.suppress(OSError, ValueError):
                    self._epoll.unregister(fd)

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
        """
        if threading.get_ident() == self._ident:
            return None
        with self._steal_lock:
            stealable = self._stealable
            if not stealable or len(stealable) > _MAX_STOLEN:
                return None
            stolen = self._stolen
            for fd, owner in stealable.items():
                if fd not in stolen:
                    try:  # noqa: SIM105 (per wait: suppress() costs three Python calls)
                        self._epoll.unregister(fd)
                    except (OSError, ValueError):
                        pass
                    stolen[fd] = owner
            turn = Turn(wake_fd, self._stealable_fds)
            previous, self._reader = self._reader, turn
        if previous is not None:
            with contextlib.suppress(OSError):
                os.eventfd_write(previous.wake_fd, 1)
        return turn

    def release(self, turn: Turn) -> None:
        """The thread that claimed ``turn`` will not wait after all: the loop reads again."""
        self._give_back(turn)

    def wait_reading(
        self,
        until: Callable[[], bool],
        wake_fd: int,
        timeout: float | None,
        spin: float = 0.0,
        turn: Turn | None = None,
    ) -> bool | None:
        """Wait for ``until()`` on the calling thread while reading the connections directly.

        The calling thread takes the stealable descriptors out of the loop's epoll set (or
        uses ``turn``, taken earlier with :meth:`claim`) and polls them itself, so a reply
        wakes it straight away instead of waking the loop thread which would then wake it.
        ``wake_fd`` (an eventfd) is written by whoever makes ``until()`` true from another
        thread. For ``spin`` seconds it polls without sleeping. Returns whether ``until()``
        became true, or ``None`` when reading inline is not possible (the caller then waits
        the plain way).

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
        poller = _poller.get(wake_fd, turn.fds)
        reading = True
        monotonic = time.monotonic
        deadline = None if timeout is None else monotonic() + timeout
        spin_until = monotonic() + spin if spin else 0.0
        stealable = self._stealable
        try:
            while not until():
                if reading and self._reader is not turn:
                    # A later waiter took over; this one is woken through wake_fd.
                    reading = False
                    poller = _poller.get(wake_fd, ())
                # A bounded sleep: the condition is re-checked even if a wake-up is lost.
                wait_ms = _RECHECK_MS
                if deadline is not None:
                    left = deadline - monotonic()
                    if left <= 0:
                        return False
                    wait_ms = min(wait_ms, int(left * 1000) + 1)
                if spin_until and monotonic() < spin_until:
                    wait_ms = 0
                for fd, mask in poller.poll(wait_ms):
                    if fd == wake_fd:
                        try:  # noqa: SIM105 (per wake-up: suppress() costs three Python calls)
                            os.eventfd_read(wake_fd)
                        except BlockingIOError:
                            pass
                        continue
                    handler = stealable.get(fd)
                    if handler is None or mask & select.POLLNVAL:
                        _poller.drop()
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
            stolen, self._stolen = self._stolen, {}
            stealable = self._stealable
            for fd, handler in stolen.items():
                if stealable.get(fd) is handler:
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
            heapq.heappush(self._timers, (time.monotonic() + delay, next(self._counter), fn))

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
        handlers = self._handlers
        wake_fd = self._wake_fd
        while not self._stopping:
            timeout = -1.0
            if self._timers:
                timeout = max(0.0, self._timers[0][0] - time.monotonic())
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
            now = time.monotonic()
            while self._timers and self._timers[0][0] <= now:
                _, _, fn = heapq.heappop(self._timers)
                try:
                    fn()
                except Exception:
                    log.exception("timer callback failed")
        with contextlib.suppress(OSError):
            self._epoll.close()
            os.close(wake_fd)
