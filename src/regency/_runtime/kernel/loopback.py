"""An in-memory transport under the send seam, for fast unit tests of the router (issue 16).

Like httpx's ``MockTransport``: several :class:`~.router.FrameRouter` instances in one process,
each over a :class:`Link` of one :class:`Loopback`, exchange real encoded frames through one
FIFO queue, so each sender→receiver pair keeps its order, as a connection does. Nothing is
delivered until the test calls :meth:`Loopback.pump` (or :meth:`Loopback.step`), so a test sees
every frame in flight and runs the routers without threads, sockets or sleeps. Timers run on a
virtual clock (:class:`ManualTimers`) that the test advances.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from regency._runtime.kernel.router import FrameRouter
from regency._runtime.kernel.seam import FrameSink, LossSink
from regency._transport import frames
from regency._transport.connection import Buffer
from regency._transport.names import FLAG_NAMED, KIND_NAME, Named, NamesReceived, NamesSent
from regency._transport.transport import PeerUnreachableError

_FRAME_LIMIT = 1 << 30


@dataclass(frozen=True, slots=True)
class Sent:
    """One frame a link sent: from where, to where, and the frame as decoded on arrival."""

    src: str
    dst: str
    frame: frames.Frame


class ManualTimers:
    """Timers on a virtual clock: callables run only when the test calls :meth:`advance`."""

    def __init__(self) -> None:
        self.now = 0.0
        self._due: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._lock = threading.Lock()

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` at the next :meth:`advance`."""
        self.call_later(0.0, fn)

    def call_later(self, delay: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` once the clock has advanced ``delay`` seconds from now."""
        with self._lock:
            heapq.heappush(self._due, (self.now + delay, next(self._order), fn))

    def advance(self, seconds: float = 0.0) -> int:
        """Move the clock on by ``seconds`` and run what fell due, in time order; how many ran."""
        ran = 0
        with self._lock:
            self.now += seconds
        while True:
            with self._lock:
                if not self._due or self._due[0][0] > self.now:
                    return ran
                _, _, fn = heapq.heappop(self._due)
            fn()
            ran += 1


class _Source:
    """The receiving end's view of where a frame came from."""

    def __init__(self, link: Link, peer: str) -> None:
        self._link = link
        self.peer = peer

    def close(self, reason: str) -> None:
        """Drop the connection: the receiver loses the peer."""
        self._link.lose(self.peer, reason)


class Link:
    """One router's transport into a :class:`Loopback` (a :class:`~.seam.FrameTransport`)."""

    def __init__(
        self, hub: Loopback, address: str, on_frame: FrameSink, on_peer_lost: LossSink
    ) -> None:
        self.address = address
        self._hub = hub
        self._on_frame = on_frame
        self._on_peer_lost = on_peer_lost
        self._lost: dict[str, str] = {}
        # What each peer holds by name, as a connection keeps it (see regency._transport.names).
        self._names: dict[str, NamesSent] = {}

    def send(
        self,
        peer: str,
        buffers: Sequence[Buffer],
        wait: bool = True,
        named: Named | None = None,
    ) -> None:
        """Queue one frame for ``peer`` (after the name frame of ``named``, unless ``peer``
        holds it); raise ``PeerUnreachableError`` if it is lost."""
        reason = self._lost.get(peer) or self._hub.gone(peer)
        if reason is not None:
            raise PeerUnreachableError(f"{peer} is gone: {reason}")
        if named is not None:
            names = self._names.get(peer)
            if names is None:
                names = self._names[peer] = NamesSent()
            define = names.define(named)
            if define is not None:
                self._hub.enqueue(self.address, peer, b"".join(define[0]))
        self._hub.enqueue(self.address, peer, b"".join(buffers))

    def post(
        self,
        frames: Sequence[tuple[str, Sequence[Buffer], int]],
        named: Sequence[Named | None] = (),
    ) -> None:
        """Queue small frames (nothing is coalesced: every frame is queued at once); as the
        real transport does, frames to live peers are queued even when another peer is lost."""
        lost: list[str] = []
        lost_peers: list[str] = []
        for index, (peer, buffers, _) in enumerate(frames):
            try:
                self.send(peer, buffers, True, named[index] if named else None)
            except PeerUnreachableError as exc:
                lost.append(str(exc))
                lost_peers.append(peer)
        if lost:
            raise PeerUnreachableError("; ".join(lost), lost_peers)

    def post_one(self, peer: str, buffers: Sequence[Buffer], size: int) -> None:
        """Queue one small frame (as :meth:`post`)."""
        try:
            self.send(peer, buffers)
        except PeerUnreachableError as exc:
            raise PeerUnreachableError(str(exc), (peer,)) from exc

    def flush(self) -> None:
        """Nothing waits to be coalesced."""

    def is_local(self, peer: str) -> bool:
        """No peer shares memory with this one: large parts travel inside the frames."""
        return False

    def mark_lost(self, peer: str, reason: str) -> None:
        """``peer`` is gone for this link: later sends to it raise."""
        self._lost.setdefault(peer, reason)

    def forget_lost(self, peer: str) -> None:
        """A new router answers at ``peer``: sends to it go through again (a new connection:
        it holds no names)."""
        self._lost.pop(peer, None)
        self._names.pop(peer, None)
        self._hub.forget_names(self.address, peer)

    def close(self) -> None:
        """This router stops: every other router loses it."""
        self._hub.kill(self.address, "closed")

    def lose(self, peer: str, reason: str) -> None:
        """The connection to ``peer`` is gone: tell the router, once."""
        if peer in self._lost:
            return
        self._lost[peer] = reason
        self._on_peer_lost(peer, reason)

    def receive(self, src: str, frame: frames.Frame) -> None:
        """Hand one frame from ``src`` to the router."""
        self._on_frame(_Source(self, src), frame)


class Loopback:
    """Routers in one process over memory: frames queue FIFO until :meth:`pump` delivers them."""

    def __init__(self, timers: ManualTimers | None = None) -> None:
        self.timers = timers or ManualTimers()
        self.sent: list[Sent] = []
        self._links: dict[str, Link] = {}
        self._dead: dict[str, str] = {}
        self._silent: set[str] = set()
        self._queue: deque[tuple[str, str, bytes]] = deque()
        self._lock = threading.Lock()
        self._names: dict[tuple[str, str], NamesReceived] = {}  # by (sender, receiver)

    def router(
        self,
        address: str,
        job_id: str = "loopback",
        connected: Callable[[], None] | None = None,
    ) -> FrameRouter:
        """A new router at ``address`` on this loopback; ``connected`` runs as soon as its link
        exists, before the router is whole (as frames may come on a real transport)."""

        def connect(on_frame: FrameSink, on_peer_lost: LossSink) -> Link:
            link = self._links[address] = Link(self, address, on_frame, on_peer_lost)
            if connected is not None:
                connected()
            return link

        return FrameRouter(job_id, b"loopback", connect, self.timers, _FRAME_LIMIT)

    def link(self, address: str) -> Link:
        """The link of the router at ``address`` (a test cuts it with :meth:`Link.mark_lost`)."""
        return self._links[address]

    def gone(self, address: str) -> str | None:
        """Why ``address`` cannot be reached (unknown or killed), or None if it can."""
        if address in self._dead:
            return self._dead[address]
        return None if address in self._links else "no such router on this loopback"

    def enqueue(self, src: str, dst: str, data: bytes) -> None:
        """Queue one encoded frame from ``src`` to ``dst``."""
        with self._lock:
            self._queue.append((src, dst, data))

    @property
    def in_flight(self) -> int:
        """Frames queued and not yet delivered."""
        return len(self._queue)

    def step(self) -> bool:
        """Deliver the oldest queued frame; False if none was queued."""
        with self._lock:
            if not self._queue:
                return False
            src, dst, data = self._queue.popleft()
        view = memoryview(data)
        frame = frames.decode(view)
        if frame.kind == KIND_NAME or frame.flags & FLAG_NAMED:
            # As a connection's reader does; a protocol error here is a bug in the sender.
            names = self._names.get((src, dst))
            if names is None:
                names = self._names[(src, dst)] = NamesReceived()
            if frame.kind == KIND_NAME:
                names.define(frame)
                return True
            names.resolve(frame)
        self.sent.append(Sent(src, dst, frame))
        if dst not in self._dead and dst not in self._silent:
            self._links[dst].receive(src, frame)
        return True

    def forget_names(self, src: str, dst: str) -> None:
        """A new connection from ``src`` to ``dst``: the names of the old one are gone."""
        self._names.pop((src, dst), None)

    def pump(self, limit: int = 1_000_000) -> int:
        """Deliver frames, those sent meanwhile included, until none is queued; how many.

        Raises ``RuntimeError`` past ``limit`` frames (the routers keep talking forever).
        """
        for delivered in range(limit + 1):
            if not self.step():
                return delivered
        raise RuntimeError(f"loopback still busy after {limit} frames")

    def silence(self, address: str) -> None:
        """The router at ``address`` stops taking frames, and nobody is told (a process that
        died a moment before its peers notice): frames to it are dropped as they arrive."""
        self._silent.add(address)

    def kill(self, address: str, reason: str) -> None:
        """The router at ``address`` dies: its queued frames are dropped and the others lose it."""
        if address in self._dead:
            return
        self._dead[address] = reason
        with self._lock:
            self._queue = deque(q for q in self._queue if address not in (q[0], q[1]))
        for other, link in list(self._links.items()):
            if other != address:
                link.lose(address, reason)
