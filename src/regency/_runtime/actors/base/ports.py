"""Ports: where replies go. ``Port``/``PortReceiver``/``Channel`` for users, and the handlers that
turn replies into futures for ``call_one``, ``call`` and ``stream``."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from regency._runtime.actors.base.errors import SupervisionError
from regency._runtime.actors.base.future import Future
from regency._runtime.kernel import casting, codec, state, wire
from regency._runtime.kernel.errors import PeerLostError
from regency._runtime.kernel.pending import Pending
from regency._runtime.kernel.refs import Part, PortRef

T = TypeVar("T")

LostDescriber = Callable[[str, str], SupervisionError]


class Port(Generic[T]):
    """The sending end of a port. Picklable: pass it to other actors, who can then reply.

    Delivery from one sender is reliable and in order. A port opened with ``once=True`` takes
    one message: a second ``send`` or ``exception`` through it raises ``RuntimeError``.
    """

    __slots__ = ("_once", "_rank", "_ref", "_used", "return_undeliverable")

    def __init__(self, ref: PortRef, rank: int = 0, once: bool = False) -> None:
        self._ref = ref
        self._rank = rank
        self._once = once
        self._used = False
        self.return_undeliverable = True

    @property
    def ref(self) -> PortRef:
        """The port's address."""
        return self._ref

    def send(self, obj: T) -> None:
        """Deliver ``obj`` to the receiver."""
        self._post(0, codec.dumps(obj))

    def exception(self, exc: BaseException) -> None:
        """Deliver an error: the receiver's ``recv()`` raises it."""
        self._post(wire.FLAG_ERROR, codec.dumps(exc))

    def _post(self, flags: int, parts: list[Part]) -> None:
        if self._once:
            if self._used:
                raise RuntimeError("OncePortRef already used")
            self._used = True
        try:
            state.runtime().send_port(self._ref, self._rank, flags, parts)
        except PeerLostError:
            if self.return_undeliverable:
                raise

    def __reduce__(self) -> tuple[Any, ...]:
        return (Port, (self._ref, self._rank, self._once))

    def __repr__(self) -> str:
        return f"Port({self._ref.addr}:{self._ref.port})"


class _Queue:
    """Port handler that queues messages for a :class:`PortReceiver`."""

    def __init__(self, once: bool) -> None:
        self._lock = threading.Lock()
        self._ready: deque[tuple[int, int, Sequence[Part]]] = deque()
        self._waiting: deque[tuple[Pending, bool]] = deque()
        self._once = once
        self.port = -1

    def deliver(self, rank: int, flags: int, parts: Sequence[Part]) -> None:
        with self._lock:
            if self._waiting:
                waiter, ranked = self._waiting.popleft()
            else:
                self._ready.append((rank, flags, parts))
                waiter = None
        if waiter is not None:
            if ranked:
                waiter.set_decoder(_with_rank(rank))
            waiter.set_raw(parts, bool(flags & wire.FLAG_ERROR))
        if self._once:
            rt = state.existing()
            if rt is not None:
                rt.close_port(self.port)

    def peer_lost(self, addr: str, reason: str) -> None:
        pass

    def take(self, ranked: bool) -> Future[Any]:
        with self._lock:
            if self._ready:
                rank, flags, parts = self._ready.popleft()
                pending = Pending(_with_rank(rank) if ranked else None)
                pending.set_raw(parts, bool(flags & wire.FLAG_ERROR))
            else:
                pending = Pending()
                self._waiting.append((pending, ranked))
        return Future._from_pending(pending)


def _with_rank(rank: int) -> Callable[[Any], Any]:
    return lambda value: (rank, value)


class PortReceiver(Generic[T]):
    """The receiving end of a port opened with :meth:`Channel.open`."""

    def __init__(self, queue: _Queue, ranked: bool = False) -> None:
        self._queue = queue
        self._ranked = ranked

    def recv(self) -> Future[T]:
        """The next message, in order, as a :class:`Future`."""
        return self._queue.take(self._ranked)

    def ranked(self) -> PortReceiver[tuple[int, T]]:
        """A receiver yielding ``(rank, value)`` pairs from the same port."""
        return PortReceiver(self._queue, ranked=True)


class Channel(Generic[T]):
    """Opens ports on the current actor: ``port, receiver = Channel[int].open()``."""

    @staticmethod
    def open(once: bool = False) -> tuple[Port[T], PortReceiver[T]]:
        """A new port and its receiver; ``once=True`` makes a single-use port."""
        queue = _Queue(once)
        ref = state.runtime().open_port(queue)
        queue.port = ref.port
        return Port(ref, once=once), PortReceiver(queue)

    @staticmethod
    def open_ranked(once: bool = False) -> tuple[Port[T], PortReceiver[tuple[int, T]]]:
        """Like :meth:`open`, but the receiver yields ``(rank, value)`` pairs."""
        port, receiver = Channel[T].open(once)
        return port, receiver.ranked()


class OnceReply(Pending):
    """Handler for a single reply (``call_one``, ``choose``), and the pending reply itself.

    ``watching`` names the process the call went to: its loss fails the call (the router
    tells every open port whose handler waits on the lost process, see ``Losses``).
    """

    __slots__ = ("_close", "_describe", "port", "watching")

    def __init__(
        self, watching: Sequence[str], describe: LostDescriber, close: Callable[[int], None]
    ) -> None:
        super().__init__()
        self.watching = watching
        self._describe = describe
        self._close = close  # the router's close_port
        self.port = -1

    def deliver(self, rank: int, flags: int, parts: Sequence[Part]) -> None:
        if self.set_raw(parts, bool(flags & wire.FLAG_ERROR)):
            self._close(self.port)

    def peer_lost(self, addr: str, reason: str) -> None:
        if self.set_exception(self._describe(addr, reason)):
            self._close(self.port)


class GatherReply:
    """Handler for ``call``: collects one reply per rank, merged or not, then completes."""

    def __init__(self, expected: int, watching: Sequence[str], describe: LostDescriber) -> None:
        self.pending = Pending()
        self._expected = expected
        self._entries: list[casting.Entry] = []
        self._lock = threading.Lock()
        self.watching = watching  # the processes the call went to (see OnceReply)
        self._describe = describe
        self.port = -1

    def deliver(self, rank: int, flags: int, parts: Sequence[Part]) -> None:
        entries = casting.unpack_entries(rank, flags, parts)
        with self._lock:
            self._entries.extend(entries)
            if len(self._entries) < self._expected:
                return
            done = self._entries
        if self.pending.set_result(done):
            state.runtime().close_port(self.port)

    def peer_lost(self, addr: str, reason: str) -> None:
        if self.pending.set_exception(self._describe(addr, reason)):
            state.runtime().close_port(self.port)


class StreamReply:
    """Handler for ``stream``: the i-th reply to arrive completes the i-th future."""

    def __init__(self, expected: int, watching: Sequence[str], describe: LostDescriber) -> None:
        self.pendings = [Pending() for _ in range(expected)]
        self._next = 0
        self._lock = threading.Lock()
        self.watching = watching  # the processes the call went to (see OnceReply)
        self._describe = describe
        self.port = -1

    def deliver(self, rank: int, flags: int, parts: Sequence[Part]) -> None:
        for _, entry_flags, entry_parts in casting.unpack_entries(rank, flags, parts):
            with self._lock:
                index = self._next
                self._next += 1
            if index < len(self.pendings):
                self.pendings[index].set_raw(entry_parts, bool(entry_flags & wire.FLAG_ERROR))
        if self._next >= len(self.pendings):
            state.runtime().close_port(self.port)

    def peer_lost(self, addr: str, reason: str) -> None:
        error = self._describe(addr, reason)
        with self._lock:
            rest = self.pendings[self._next :]
            self._next = len(self.pendings)
        for pending in rest:
            pending.set_exception(error)
        state.runtime().close_port(self.port)


def fail_handler(handler: object, error: BaseException) -> None:
    """Fail every future of a reply handler at once (the call was never sent)."""
    if isinstance(handler, StreamReply):
        for pending in handler.pendings:
            pending.set_exception(error)
    elif isinstance(handler, OnceReply):
        handler.set_exception(error)
    elif isinstance(handler, GatherReply):
        handler.pending.set_exception(error)
