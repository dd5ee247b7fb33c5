"""Acknowledged forwarding down the casting tree: a subtree whose head dies before it passed a
cast on still gets the message.

Every destination of a cast took the sender's next sequence number, and a mailbox holds a
sender's later messages until the earlier ones came: a subtree left without one message would
hold back everything that sender sends it afterwards, forever. So a process that sends a cast
frame to a node that must pass it on keeps the message until that node acknowledges it, and if
the node is lost first, sends the message itself, straight to every destination of that node's
subtree. A destination that had it already drops the copy (its mailbox has seen that sequence
number), so each destination gets it once, in order.

Which frames are kept: the sender of a cast keeps those to subtree heads (its frames to leaves
left it; if it dies, nothing it sent matters). A process passing a cast on keeps every frame it
sends: a child acknowledges at once when it is a leaf, and a head once every child it sent the
frame to has acknowledged. An acknowledgement thus says that the whole subtree below has the
message: a head that dies after acknowledging left nothing undelivered behind it, and if a head
and one of its own heads die together, the process above them sends to the whole subtree.

Acknowledgements are cumulative per parent (a node acknowledges its parent's frames in the
order they came) and leave once per burst of frames, as a small port message to the parent's
:class:`Forwards` port. Casts to at most ``cast_fanout`` destinations (no subtree heads) keep
nothing and cost nothing.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import pickle
import threading
from collections import deque
from collections.abc import Sequence
from typing import NamedTuple, Protocol

from regency._runtime.kernel import casting
from regency._runtime.kernel.errors import PeerLostError
from regency._runtime.kernel.losses import Losses
from regency._runtime.kernel.port_handlers import PortHandler
from regency._runtime.kernel.refs import Part, PortRef
from regency._runtime.kernel.seam import Timers
from regency._transport import frames

log = logging.getLogger("regency.proc")


class Ack(NamedTuple):
    """Where a node acknowledges a cast frame: its parent's port, and the frame's token."""

    port: PortRef
    token: int


class ForwardHost(Protocol):
    """What acknowledged forwarding needs of its process's router (``FrameRouter``)."""

    address: str
    frame_limit: int

    def open_port(self, handler: PortHandler, watch: Sequence[str] = ()) -> PortRef:
        """Register a port."""

    def send_port(
        self, ref: PortRef, rank: int, flags: int, parts: Sequence[Part], wait: bool = True
    ) -> None:
        """Send a value to a port (anywhere)."""

    def send_actor(
        self,
        targets: Sequence[tuple[str, int, int]],
        mesh_id: int,
        sender: int,
        encoder: frames.Encoder,
    ) -> None:
        """Send one actor message directly to each ``(addr, seq, rank)``."""


class Cast:
    """One cast message this process sent or passed on, while some child still owes an
    acknowledgement for it."""

    __slots__ = ("done", "mesh_id", "owed", "parts", "sender", "upstream")

    def __init__(self, mesh_id: int, sender: int, parts: list[Part], upstream: Ack | None) -> None:
        self.mesh_id = mesh_id
        self.sender = sender
        self.parts = parts
        self.upstream = upstream
        # Children that owe an acknowledgement, plus one while frames are still being sent.
        self.owed = 1
        self.done = False


class _Kept(NamedTuple):
    """A frame sent to a child and not acknowledged yet."""

    child: str
    cast: Cast
    rest: tuple[casting.Dest, ...]


class Forwards:
    """The cast frames this process sent to nodes that pass them on, until acknowledged; a port
    handler for the acknowledgements that come back and for the loss of a child."""

    def __init__(self, router: ForwardHost, losses: Losses, timers: Timers) -> None:
        self._router = router
        self._losses = losses
        self._timers = timers
        self._lock = threading.Lock()
        self._port: PortRef | None = None
        self._tokens = itertools.count(1)
        self._kept: dict[int, _Kept] = {}
        self._by_child: dict[str, deque[int]] = {}
        # The children that owe acknowledgements: Losses tells this port of their loss.
        self.watching: set[str] = set()
        # Casts from each parent in the order they came; acknowledged from the front.
        self._from_parent: dict[PortRef, deque[tuple[int, Cast]]] = {}
        self._acks_due: dict[PortRef, int] = {}

    def kept(self) -> int:
        """How many frames wait for an acknowledgement (for tests and statistics)."""
        return len(self._kept)

    # -- sending -------------------------------------------------------------------------------

    def begin(self, mesh_id: int, sender: int, parts: list[Part], upstream: Ack | None) -> Cast:
        """A cast this process is about to send frames of (``upstream``: where it came from)."""
        cast = Cast(mesh_id, sender, parts, upstream)
        if upstream is not None:
            with self._lock:
                queue = self._from_parent.get(upstream.port)
                if queue is None:
                    queue = self._from_parent[upstream.port] = deque()
                queue.append((upstream.token, cast))
        return cast

    def keep(self, cast: Cast, child: str, rest: tuple[casting.Dest, ...]) -> Ack:
        """Keep ``cast`` until ``child`` (sent a frame of it, to pass on to ``rest``) answers;
        the acknowledgement the frame asks for."""
        if self._port is None:
            self._port = self._router.open_port(self)
        with self._lock:
            token = next(self._tokens)
            self._kept[token] = _Kept(child, cast, rest)
            waiting = self._by_child.get(child)
            if waiting is None:
                waiting = self._by_child[child] = deque()
                self.watching.add(child)
            waiting.append(token)
            cast.owed += 1
        return Ack(self._port, token)

    def unkeep(self, ack: Ack) -> None:
        """The frame of ``ack`` never left (its child was found lost): forget it."""
        with self._lock:
            kept = self._kept.pop(ack.token, None)
            if kept is None:
                return
            waiting = self._by_child.get(kept.child)
            if waiting is not None:
                waiting.remove(ack.token)
                if not waiting:
                    del self._by_child[kept.child]
                    self.watching.discard(kept.child)
            finished = self._settle(kept.cast)
        self._finish(finished)

    def sent(self, cast: Cast) -> None:
        """Every frame of ``cast`` is sent (or the child lost): it is done once acknowledged."""
        with self._lock:
            finished = self._settle(cast)
        self._finish(finished)
        # A child lost while its frame was being kept is told of here: Losses recorded the end
        # before it looked at ``watching``, which may have been before the child was added.
        dead = self._losses.dead
        if dead:
            with self._lock:
                lost = [child for child in self.watching if child in dead]
            for child in lost:
                self.peer_lost(child, dead[child])

    # -- the port: acknowledgements and losses -------------------------------------------------

    def deliver(self, rank: int, flags: int, parts: Sequence[Part]) -> None:
        """An acknowledgement: the child has passed on every frame up to this token."""
        try:
            token = pickle.loads(parts[0])
        except Exception as exc:
            log.warning("dropping an undecodable cast acknowledgement: %s", exc)
            return
        if type(token) is not int:
            log.warning("dropping a malformed cast acknowledgement: %r", token)
            return
        finished: list[Cast] = []
        with self._lock:
            kept = self._kept.get(token)
            if kept is None:
                return  # already settled (its child was lost, or a repeat)
            waiting = self._by_child[kept.child]
            while waiting and waiting[0] <= token:
                settled = self._kept.pop(waiting.popleft())
                finished.extend(self._settle(settled.cast))
            if not waiting:
                del self._by_child[kept.child]
                self.watching.discard(kept.child)
        self._finish(finished)

    def peer_lost(self, addr: str, reason: str) -> None:
        """A child that owed acknowledgements is gone: send each of its frames' messages
        straight to the rest of its subtree."""
        with self._lock:
            waiting = self._by_child.pop(addr, None)
            self.watching.discard(addr)
            lost = [self._kept.pop(token) for token in waiting or ()]
        finished: list[Cast] = []
        for kept in lost:
            if kept.rest:
                self._resend(kept, reason)
            with self._lock:
                finished.extend(self._settle(kept.cast))
        self._finish(finished)

    def _resend(self, kept: _Kept, reason: str) -> None:
        cast = kept.cast
        targets = [(dest.addr, dest.seq, dest.rank) for dest in kept.rest]
        log.info(
            "cast head %s was lost (%s) before its subtree acknowledged: sending to its %d "
            "destinations directly",
            kept.child,
            reason,
            len(targets),
        )
        try:
            self._router.send_actor(
                targets,
                cast.mesh_id,
                cast.sender,
                frames.Encoder(cast.parts, self._router.frame_limit),
            )
        except PeerLostError as exc:
            log.info("some destinations of the lost cast head are gone too: %s", exc)

    # -- acknowledging upstream ----------------------------------------------------------------

    def _settle(self, cast: Cast) -> list[Cast]:
        """One debt of ``cast`` paid (under the lock); the casts now done, in order."""
        cast.owed -= 1
        if cast.owed:
            return []
        cast.done = True
        cast.parts = []
        return [cast]

    def _finish(self, casts: list[Cast]) -> None:
        """Acknowledge to their parents the casts now done, in the order each parent sent them."""
        schedule = False
        with self._lock:
            for cast in casts:
                upstream = cast.upstream
                if upstream is None:
                    continue
                queue = self._from_parent.get(upstream.port)
                last = None
                while queue and queue[0][1].done:
                    last = queue.popleft()[0]
                if queue is not None and not queue:
                    del self._from_parent[upstream.port]
                if last is not None:
                    schedule = schedule or not self._acks_due
                    self._acks_due[upstream.port] = last
        if schedule:
            # Once per burst: the frames read together are acknowledged together.
            self._timers.call_soon(self._send_acks)

    def _send_acks(self) -> None:
        with self._lock:
            due, self._acks_due = self._acks_due, {}
        for port, token in due.items():
            # A parent that is gone no longer needs to hear: what it kept no longer matters.
            with contextlib.suppress(PeerLostError):
                self._router.send_port(port, 0, 0, [pickle.dumps(token, protocol=5)])
