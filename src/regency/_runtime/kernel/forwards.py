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
order they came) and leave at most once per :data:`ACK_DELAY` for each parent, as a small port
message to the parent's :class:`Forwards` port: a stream of casts costs a few acknowledgements a
second, not one per cast. Casts to at most ``cast_fanout`` destinations (no subtree heads) keep
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
from typing import Protocol

from regency._runtime.kernel import casting
from regency._runtime.kernel.errors import PeerLostError
from regency._runtime.kernel.losses import Losses
from regency._runtime.kernel.port_handlers import PortHandler
from regency._runtime.kernel.refs import Part, PortRef
from regency._runtime.kernel.seam import Timers
from regency._transport import frames

log = logging.getLogger("regency.proc")

# How long acknowledgements wait to be sent together. Only what a sender keeps depends on it (a
# stream's last few milliseconds of messages), never when anything is delivered.
ACK_DELAY = 0.01


# Where a node acknowledges a cast frame: its parent's address and port, and the frame's token.
Ack = casting.Ack


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


# A frame sent to a child and not acknowledged yet: the child, the cast, the rest of its subtree.
_Kept = tuple[str, Cast, Sequence[casting.Dest]]


class Forwards:
    """The cast frames this process sent to nodes that pass them on, until acknowledged; a port
    handler for the acknowledgements that come back and for the loss of a child."""

    def __init__(self, router: ForwardHost, losses: Losses, timers: Timers) -> None:
        self._router = router
        self._losses = losses
        self._timers = timers
        self._lock = threading.Lock()
        self._port = -1  # opened on first use
        self._tokens = itertools.count(1)
        self._kept: dict[int, _Kept] = {}
        self._by_child: dict[str, deque[int]] = {}
        # The children that owe acknowledgements: Losses tells this port of their loss.
        self.watching: set[str] = set()
        # Casts from each parent (by address) in the order they came; acknowledged from the
        # front. Each process acknowledges to one port (its parent's Forwards).
        self._from_parent: dict[str, deque[tuple[int, Cast]]] = {}
        self._acks_due: dict[str, tuple[int, int]] = {}  # parent -> (its port, last token)

    def kept(self) -> int:
        """How many frames wait for an acknowledgement (for tests and statistics)."""
        return len(self._kept)

    # -- sending -------------------------------------------------------------------------------

    def begin(
        self,
        mesh_id: int,
        sender: int,
        parts: list[Part],
        upstream: Ack | None,
        children: Sequence[tuple[str, Sequence[casting.Dest]]],
    ) -> tuple[Cast, dict[str, Ack]]:
        """A cast this process is about to send frames of (``upstream``: where it came from),
        kept until each of ``children`` (a child's address, the rest of its subtree) answers;
        the acknowledgement each child's frame asks for."""
        cast = Cast(mesh_id, sender, parts, upstream)
        port = self._port
        if port < 0:
            port = self._port = self._router.open_port(self).port
        address = self._router.address
        acks: dict[str, Ack] = {}
        with self._lock:
            if upstream is not None:
                queue = self._from_parent.get(upstream[0])
                if queue is None:
                    queue = self._from_parent[upstream[0]] = deque()
                queue.append((upstream[2], cast))
            for child, rest in children:
                acks[child] = (address, port, self._keep_locked(cast, child, rest))
        return cast, acks

    def arrived(self, upstream: Ack) -> None:
        """A leaf has the cast frame of ``upstream``: it owes its parent only the
        acknowledgement, which may go at once unless an earlier cast from the parent is still
        being passed on (acknowledgements keep the order the parent sent in)."""
        parent, port, token = upstream
        with self._lock:
            queue = self._from_parent.get(parent)
            if queue:
                done = Cast(0, 0, [], upstream)
                done.owed, done.done = 0, True
                queue.append((token, done))
                return
            schedule = not self._acks_due
            self._acks_due[parent] = (port, token)
        if schedule:
            self._timers.call_later(ACK_DELAY, self._send_acks)

    def keep(self, cast: Cast, child: str, rest: Sequence[casting.Dest]) -> Ack:
        """Keep ``cast`` (begun already) until one more ``child`` answers as well."""
        with self._lock:
            token = self._keep_locked(cast, child, rest)
        return (self._router.address, self._port, token)

    def _keep_locked(self, cast: Cast, child: str, rest: Sequence[casting.Dest]) -> int:
        token = next(self._tokens)
        self._kept[token] = (child, cast, rest)
        waiting = self._by_child.get(child)
        if waiting is None:
            waiting = self._by_child[child] = deque()
            self.watching.add(child)
        waiting.append(token)
        cast.owed += 1
        return token

    def unkeep(self, ack: Ack) -> None:
        """The frame of ``ack`` never left (its child was found lost): forget it."""
        token = ack[2]
        with self._lock:
            kept = self._kept.pop(token, None)
            if kept is None:
                return
            child, cast, _ = kept
            waiting = self._by_child.get(child)
            if waiting is not None:
                waiting.remove(token)
                if not waiting:
                    del self._by_child[child]
                    self.watching.discard(child)
            finished = self._settle(cast)
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
            child = kept[0]
            waiting = self._by_child[child]
            while waiting and waiting[0] <= token:
                finished.extend(self._settle(self._kept.pop(waiting.popleft())[1]))
            if not waiting:
                del self._by_child[child]
                self.watching.discard(child)
        self._finish(finished)

    def peer_lost(self, addr: str, reason: str) -> None:
        """A child that owed acknowledgements is gone: send each of its frames' messages
        straight to the rest of its subtree."""
        with self._lock:
            waiting = self._by_child.pop(addr, None)
            self.watching.discard(addr)
            lost = [self._kept.pop(token) for token in waiting or ()]
        finished: list[Cast] = []
        for child, cast, rest in lost:
            if rest:
                self._resend(child, cast, rest, reason)
            with self._lock:
                finished.extend(self._settle(cast))
        self._finish(finished)

    def _resend(self, child: str, cast: Cast, rest: Sequence[casting.Dest], reason: str) -> None:
        targets = [(dest.addr, dest.seq, dest.rank) for dest in rest]
        log.info(
            "cast head %s was lost (%s) before its subtree acknowledged: sending to its %d "
            "destinations directly",
            child,
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
                parent = upstream[0]
                queue = self._from_parent.get(parent)
                last = None
                while queue and queue[0][1].done:
                    last = queue.popleft()[0]
                if queue is not None and not queue:
                    del self._from_parent[parent]
                if last is not None:
                    schedule = schedule or not self._acks_due
                    self._acks_due[parent] = (upstream[1], last)
        if schedule:
            self._timers.call_later(ACK_DELAY, self._send_acks)

    def _send_acks(self) -> None:
        with self._lock:
            due, self._acks_due = self._acks_due, {}
        for parent, (port, token) in due.items():
            # A parent that is gone no longer needs to hear: what it kept no longer matters.
            with contextlib.suppress(PeerLostError):
                self._router.send_port(
                    PortRef(parent, port), 0, 0, [pickle.dumps(token, protocol=5)]
                )
